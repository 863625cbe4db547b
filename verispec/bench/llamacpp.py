"""Peers: llama.cpp's own decoding of the same GGUF files, through its `llama-server`, timed and counted like
verispec's methods.

* `llamacpp-generate`: plain decoding of the target GGUF with llama.cpp's sampler;
* `llamacpp-speculative`: llama.cpp's speculative decoding with the draft GGUF (`--spec-type draft-simple
  --spec-draft-model`), drafting
  exactly γ tokens per round (`--spec-draft-n-max γ --spec-draft-n-min 0`; its draft probability cut-off defaults
  to 0), llama.cpp's defaults otherwise. Its default draft sampling is greedy: the draft proposes its argmax and
  the target keeps a drafted token when its own sample (at T = 0 its argmax) equals it ("sample-and-match", lossless
  but accepting less at T > 0 than rejection sampling, `--spec-draft-sampling probabilistic`). Records say which.

The binaries come from `make peers` (`verispec.native.llamacpp_build`). A peer runs the native build (the host's
own instruction set) unless its method label names another with the setting `isa`: `llamacpp-generate:isa=avx2`,
`llamacpp-speculative:isa=avx2,gamma=4` run llama.cpp built for AVX2 only (`make peers ISA=avx2`), so that it can be
compared, instruction set matched, with a kernel's AVX2 path on the same host in the same run; records say which
build ran (`isa` in the peer's config and in its `llamacpp` report). One server per peer, build and γ is started on
first use and kept for the whole run (model loading is never timed), then stopped, also on errors and Ctrl-C.

Each prompt is sent as the token ids verispec's tokenizer made (chat template included), so both sides decode the
same prompt tokens; llama.cpp stops at an end-of-generation token or after max_new_tokens, as `hf-generate` does,
and the returned tokens include the EOS that ended the output. Sampling: temperature, then top-k, then top-p
(verispec's order), every other llama.cpp sampler off; prompt caching off, so every decode processes its prompt.

The trace: llama.cpp reports totals (`timings`: prompt_ms, predicted_ms, draft_n, draft_n_accepted), and, with
LLAMA_TRACE=1 in its environment, one log line per verification step, "accepted a/d draft tokens". From these:
round 0 processes the prompt and commits the first token (time_decode = prompt_ms); then one round per logged
step (drafted d, accepted a, emitted a + 1, fed d + 1) and, for the tokens no step accounts for, plain one-token
rounds; a round cut by EOS emits fewer. So target calls, block efficiency and acceptance are exact. Times:
time_total is the wall time of the request; time_target = prompt_ms + predicted_ms, llama.cpp's own timed work
(for the speculative peer that includes drafting: llama.cpp does not split it); each later round's time_decode is
the mean predicted_ms per round (llama.cpp does not time rounds). Draft forwards are counted one per drafted token,
as for `hf-assisted`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.bench.peers import PeerGeneration
from verispec.config import DecodeConfig
from verispec.errors import ConfigError, VerispecError
from verispec.models.llamacpp import gguf_file
from verispec.native import llamacpp_build
from verispec.sampling import SamplingConfig
from verispec.trace import RoundTrace, Trace

LLAMACPP_PEERS = {
    "llamacpp-generate": "llama.cpp's plain decoding of the target GGUF (llama-server)",
    "llamacpp-speculative": "llama.cpp's speculative decoding with the draft GGUF at γ (llama-server)",
}
SERVER_BINARY = "llama-server"
CONTEXT = 8192  # tokens of KV cache per server: prompt + max_new_tokens must fit
START_TIMEOUT = 300.0  # seconds for a server to load its models and answer /health
SPEC_TYPE = "draft-simple"  # llama.cpp's speculative decoding with a separate draft model
DRAFT_SAMPLING = "greedy"  # llama.cpp's default --spec-draft-sampling (draft argmax, target sample-and-match)
_STEP = re.compile(r"accepted\s+(\d+)\s*/\s*(\d+) draft tokens")
_TIMINGS_DONE = re.compile(r"total time =")


class LlamaCppError(VerispecError, RuntimeError):
    """llama.cpp's server failed: it would not start, rejected a model or a request, or died."""


def require_built(isa: str = llamacpp_build.DEFAULT_ISA) -> Path:
    """Return the server binary of the build for instruction set `isa`; raise ConfigError naming the `make peers`
    command that builds it when it is not built."""
    path = llamacpp_build.binary(SERVER_BINARY, isa)
    if not path.exists():
        raise ConfigError(f"the llama.cpp peers need llama.cpp's {SERVER_BINARY} built for {isa}, not built at "
                          f"{path}: run `{llamacpp_build.make_command(isa)}` first")
    return path


def peer_build(label: str) -> tuple[str, str]:
    """Return (peer name, instruction set of the llama.cpp build it runs) of a method label `name[:key=value,...]`:
    its `isa` setting, the native build when it has none. Its other settings are the runner's (γ)."""
    name, _, rest = label.partition(":")
    isa = llamacpp_build.DEFAULT_ISA
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key == "isa":
            try:
                isa = llamacpp_build.check_isa(value)
            except ConfigError as error:
                raise ConfigError(f"{error} (in {label!r})") from None
    return name, isa


def server_command(binary: Path, target: Path, draft: Path | None, gamma: int, threads: int, port: int,
                   context: int = CONTEXT, slots: int = 1) -> list[str]:
    """Return the `llama-server` command line: `slots` parallel slots of `context` tokens each, continuously
    batched, `threads` threads, no prompt cache, no web UI; with a draft, speculative decoding at exactly γ draft
    tokens per round."""
    # --ctx-size is the KV cache of all slots together: without a unified KV cache llama-server splits it evenly
    # (n_ctx_slot = ctx / slots), so slots x context gives every slot the context one slot has
    cmd = [str(binary), "--model", str(target), "--host", "127.0.0.1", "--port", str(port),
           "--threads", str(threads), "--threads-batch", str(threads), "--ctx-size", str(slots * context),
           "--parallel", str(slots), "--no-kv-unified", "--cont-batching", "--no-cache-prompt", "--cache-ram", "0",
           "--no-webui"]
    if draft is not None:
        # --spec-type: without it this llama.cpp infers the type from the draft GGUF's metadata, finds none in a
        # plain model, loads the draft and never drafts
        cmd += ["--spec-type", SPEC_TYPE, "--spec-draft-model", str(draft), "--spec-draft-n-max", str(gamma),
                "--spec-draft-n-min", "0", "--spec-draft-threads", str(threads)]
    return cmd


def sampler_fields(sampling: SamplingConfig) -> dict[str, Any]:
    """Return the request fields that make llama.cpp sample as verispec does: temperature, top-k, top-p in that
    order (0 = greedy), every other llama.cpp sampler off, no prompt cache (its /completion and chat endpoints
    read the same fields)."""
    return {
        "cache_prompt": False, "temperature": float(sampling.temperature), "top_k": sampling.top_k,
        "top_p": float(sampling.top_p), "samplers": ["temperature", "top_k", "top_p"], "min_p": 0.0,
        "typical_p": 1.0, "top_n_sigma": -1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "n_probs": 0,
    }


def request_body(prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig, seed: int) -> dict[str, Any]:
    """Return the /completion request: the prompt's token ids, verispec's sampling (`sampler_fields`), the
    generated token ids back."""
    return {"prompt": list(prompt_ids), "n_predict": max_new_tokens, "seed": seed, "stream": False,
            "return_tokens": True, "ignore_eos": False, **sampler_fields(sampling)}


def parse_steps(log: str) -> list[tuple[int, int]]:
    """Return (accepted, drafted) of every verification step in a LLAMA_TRACE server log excerpt."""
    return [(int(a), int(d)) for a, d in _STEP.findall(log)]


def build_trace(response: dict[str, Any], steps: list[tuple[int, int]], wall: float) -> Trace:
    """Return the `Trace` of one /completion response and its logged verification steps (module docstring)."""
    timings = response["timings"]
    tokens = response["tokens"]
    generated, prompt_n = len(tokens), int(timings["prompt_n"])
    if generated != int(timings["predicted_n"]):
        raise LlamaCppError(f"llama.cpp returned {generated} tokens but counted {timings['predicted_n']}")
    drafted, accepted = sum(d for _, d in steps), sum(a for a, _ in steps)
    if (drafted, accepted) != (int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))):
        raise LlamaCppError(f"llama.cpp's log shows {accepted}/{drafted} accepted/drafted tokens, its timings "
                            f"{timings.get('draft_n_accepted', 0)}/{timings.get('draft_n', 0)}: the log is incomplete")
    rounds = [RoundTrace(0, 0, min(generated, 1), prompt_n, time_decode=timings["prompt_ms"] / 1e3)]
    rounds += [RoundTrace(d, a, a + 1, d + 1) for a, d in steps]
    rounds += [RoundTrace(0, 0, 1, 1) for _ in range(generated - sum(r.emitted for r in rounds))]
    excess = sum(r.emitted for r in rounds) - generated  # steps whose tokens after an EOS were dropped
    for r in reversed(rounds):
        cut = min(excess, r.emitted)
        r.emitted, excess = r.emitted - cut, excess - cut
    later = len(rounds) - 1
    for r in rounds[1:]:
        r.time_decode = timings["predicted_ms"] / 1e3 / later
    return Trace(
        rounds=rounds, target_calls=len(rounds), target_tokens=sum(r.fed for r in rounds),
        draft_calls=(1 + drafted) if steps else 0, draft_tokens=(prompt_n + drafted) if steps else 0,
        time_target=(timings["prompt_ms"] + timings["predicted_ms"]) / 1e3, time_total=wall,
        prefill_tokens=prompt_n,
    )


@dataclass
class LlamaCppGeneration(PeerGeneration):
    """A llama.cpp peer's result: a `PeerGeneration` plus what llama.cpp itself reported."""

    llamacpp: dict[str, Any] | None = None  # its timings, stop type and server settings

    def to_dict(self) -> dict[str, Any]:
        """Return the generation as a JSON-able dict (the `PeerGeneration` keys and `llamacpp`)."""
        return {**super().to_dict(), "llamacpp": self.llamacpp}


def _die_with_parent() -> None:
    """In the server's process before exec (Linux): get SIGTERM when verispec dies, even by SIGKILL (out of
    memory), so no server outlives its run."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the context manager and atexit still stop the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One `llama-server` process: started on `start()` (waits until its models are loaded), one request at a time,
    stopped on `stop()`; its output goes to a log file whose last lines name what went wrong."""

    def __init__(self, command: list[str], log_dir: Path, name: str, trace: bool = False) -> None:
        self.command, self.name, self.trace = command, name, trace
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.port = int(command[command.index("--port") + 1])

    def log_tail(self, lines: int = 8) -> str:
        """Return the last `lines` lines of the server's log, joined by " | "."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server and wait until /health answers; raise LlamaCppError when it exits or times out."""
        env = os.environ | ({"LLAMA_TRACE": "1"} if self.trace else {})
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise LlamaCppError(f"{self.name}: llama-server exited with code {code} while loading; its log "
                                    f"({self.log_path}) ends: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while loading
            time.sleep(0.2)
        self.stop()
        raise LlamaCppError(f"{self.name}: llama-server did not become ready within {timeout:.0f} s; its log "
                            f"({self.log_path}) ends: {self.log_tail()}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); nothing when it is not running."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def complete(self, body: dict[str, Any], timeout: float = 3600.0) -> tuple[dict[str, Any], float, str]:
        """Send one /completion request; return (response, wall seconds, the log lines written for it)."""
        if self.process is None:
            self.start()
        offset = self.log_path.stat().st_size
        data = json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=data,
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = response.read()
            wall = time.perf_counter() - start
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise LlamaCppError(f"{self.name}: llama-server rejected the request (HTTP {exc.code}): {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            alive = self.process is not None and self.process.poll() is None
            state = "still running" if alive else "it exited"
            raise LlamaCppError(f"{self.name}: no answer from llama-server ({exc}; {state}); its log ends: "
                                f"{self.log_tail()}") from None
        return json.loads(payload), wall, self._log_since(offset)

    def _log_since(self, offset: int, wait: float = 5.0) -> str:
        """Return the log written after `offset`, waiting (up to `wait` s) for the request's closing timings: the
        server's logger writes from its own thread, after the response may have gone out."""
        deadline = time.monotonic() + wait
        while True:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            if _TIMINGS_DONE.search(text) or time.monotonic() > deadline:
                return text
            time.sleep(0.02)


class LlamaCppPeers:
    """The llama.cpp peers of one benchmark run: checks up front (every build they name built, GGUF files), one
    server per peer, build and γ started on first use, all stopped on exit (use as a context manager)."""

    def __init__(self, methods: list[str], target: str | None, draft: str | None, threads: int,
                 slots: int = 1) -> None:
        """`methods`: the run's method labels (or names); those of llama.cpp peers say which builds must exist.
        `slots`: requests each server decodes at once (its `--parallel`)."""
        peers = [peer_build(label) for label in methods if label.partition(":")[0] in LLAMACPP_PEERS]
        isas = dict.fromkeys(isa for _, isa in peers) or {llamacpp_build.DEFAULT_ISA: None}
        self.binaries = {isa: require_built(isa) for isa in isas}
        self.target = gguf_file(target, "target")
        speculative = any(name == "llamacpp-speculative" for name, _ in peers)
        self.draft = gguf_file(draft, "draft") if speculative else None
        self.threads, self.slots = threads, slots
        self.servers: dict[tuple[str, int, str], LlamaServer] = {}
        self.log_dir = Path(tempfile.mkdtemp(prefix="verispec-llamacpp-"))

    def version(self) -> dict[str, Any]:
        """Return the builds' records for the results' versions block: the first build's record (package, source
        commit, instruction set, flags) with `builds`, every build's record by instruction set."""
        package = f"{llamacpp_build.SDIST_NAME}=={llamacpp_build.SDIST_VERSION}"
        builds = {isa: llamacpp_build.build_info(isa) or {"package": package, "isa": isa} for isa in self.binaries}
        return {**next(iter(builds.values())), "builds": builds}

    def server(self, method: str, gamma: int, isa: str = llamacpp_build.DEFAULT_ISA) -> LlamaServer:
        """Return the (started) server of peer `method` on the build for instruction set `isa` at draft length
        `gamma`."""
        key = (method, gamma if method == "llamacpp-speculative" else 0, isa)
        if key not in self.servers:
            binary = self.binaries.get(isa) or require_built(isa)
            draft = self.draft if method == "llamacpp-speculative" else None
            command = server_command(binary, self.target, draft, gamma, self.threads, _free_port(), slots=self.slots)
            name = method if isa == llamacpp_build.DEFAULT_ISA else f"{method}-{isa}"
            name = f"{name}-gamma{gamma}" if draft is not None else name
            self.servers[key] = LlamaServer(command, self.log_dir, name, trace=draft is not None)
            self.servers[key].start()
        return self.servers[key]

    def generate(self, method: str, prompt_ids: list[int], gamma: int, sampling: SamplingConfig,
                 max_new_tokens: int, seed: int, isa: str = llamacpp_build.DEFAULT_ISA,
                 ) -> tuple[list[int], Trace, dict[str, Any]]:
        """Decode `prompt_ids` with peer `method` on the build for instruction set `isa`; return (generated tokens,
        trace, llama.cpp's own report)."""
        if method not in LLAMACPP_PEERS:
            raise ConfigError(f"unknown llama.cpp peer {method!r}; choose one of: {', '.join(LLAMACPP_PEERS)}")
        if method == "llamacpp-speculative" and self.draft is None:
            raise ConfigError("llamacpp-speculative was not among the methods these peers were set up for (no draft)")
        if len(prompt_ids) + max_new_tokens > CONTEXT:
            raise ConfigError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceed the "
                              f"llama.cpp peers' context of {CONTEXT} tokens")
        server = self.server(method, gamma, isa)
        response, wall, log = server.complete(request_body(prompt_ids, max_new_tokens, sampling, seed))
        steps = parse_steps(log) if server.trace else []
        trace = build_trace(response, steps, wall)
        if trace.prefill_tokens != len(prompt_ids):
            raise LlamaCppError(f"llama.cpp processed {trace.prefill_tokens} prompt tokens, not the "
                                f"{len(prompt_ids)} sent (a cached prefix?)")
        speculative = method == "llamacpp-speculative"
        report = {"timings": response["timings"], "stop_type": response.get("stop_type"),
                  "threads": self.threads, "server": Path(server.command[0]).name, "isa": isa,
                  "spec_type": SPEC_TYPE if speculative else None,
                  "draft_sampling": (DRAFT_SAMPLING if not sampling.greedy else "argmax") if speculative else None}
        return list(response["tokens"]), trace, report

    def close(self) -> None:
        """Stop every server."""
        for server in self.servers.values():
            server.stop()

    def __enter__(self) -> LlamaCppPeers:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close()
        if exc_type is None:  # the logs only matter to explain a failure
            shutil.rmtree(self.log_dir, ignore_errors=True)


def llamacpp_generate(peers: LlamaCppPeers, decoder: Any, prompt: str, method: str, config: DecodeConfig,
                      chat_template: bool = True) -> LlamaCppGeneration:
    """Decode `prompt` with llama.cpp peer `method` (a name, or a label whose `isa` setting picks the build) under
    `config`'s γ, sampling, max_new_tokens and seed: the prompt tokenized by `decoder` (as verispec's methods see
    it), decoded by llama.cpp; return a `LlamaCppGeneration`."""
    gamma, sampling, max_new_tokens, seed = config.gamma, config.sampling, config.max_new_tokens, config.seed
    method, isa = peer_build(method)
    prompt_ids = decoder.encode_prompt(prompt, chat_template)
    tokens, trace, report = peers.generate(method, prompt_ids, gamma, sampling, max_new_tokens, seed, isa)
    eos = decoder.eos_token_ids("target")
    config = {"method": method, "isa": isa, "gamma": gamma,
              "max_new_tokens": max_new_tokens, "seed": seed,
              "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}}
    text = decoder.tokenizer.decode(tokens, skip_special_tokens=True)
    stopped = report["stop_type"] == "eos" or (bool(tokens) and tokens[-1] in eos)
    return LlamaCppGeneration(text, tokens, len(prompt_ids), stopped, config, trace, report)
