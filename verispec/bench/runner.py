"""The benchmark runner: several methods on the same prompts, interleaved prompt by prompt, into one JSON file.

Interleaving (every method on prompt 1, then every method on prompt 2, ...) makes machine drift (thermal state,
other load) hit all methods alike. Before measuring, each method decodes a few tokens of the first prompt once
(loading models, first-call allocations); that warm-up is excluded. Engine methods go through `Decoder.generate`,
peers (transformers' own decoding) through `peers.peer_generate`; both return a trace, so all metrics come from the
same fields.

The results file holds: `schema`, `config` (the BenchConfig), `machine`, `versions`, `git_commit`, `git_dirty`,
`started`, `wall_seconds`, `runs` (one per invocation: start, seconds, prompts, machine, commit), `aggregate` (one
row per method, `metrics.summarize`) and `records` (one per prompt and method: `prompt_index`, `prompt_id`,
`category`, `prompt`, `method`, `order`, `run` (the invocation that measured it), `finished` (wall-clock time, to
find decodes that ran while something else loaded the machine), then `Generation.to_dict()`, then `flops`
(`bench.flops`) and, with `quality`, `quality` (`bench.quality`), both computed after the prompt's timed runs).
"""

from __future__ import annotations

import json
import time
import warnings
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verispec.api import Decoder
from verispec.bench.archive import write_archive
from verispec.bench.execution import execution_problem, function_end
from verispec.bench.files import TEXT, ResultsWriteError, check_results_shape, check_writable, write_atomically
from verispec.bench.flops import add_flops
from verispec.bench.llamacpp import LLAMACPP_PEERS, LlamaCppPeers, llamacpp_generate
from verispec.bench.metrics import summarize
from verispec.bench.peers import PEERS, peer_generate
from verispec.bench.quality import quality_records
from verispec.bench.vllm import VLLM_PEERS, VllmPeers, vllm_generate
from verispec.engine import DecodeConfig
from verispec.errors import ConfigError
from verispec.learned.collect import prompt_fingerprint
from verispec.methods import METHODS
from verispec.models.spec import ModelSpec, flat_dict
from verispec.prompt_sets import Prompt, load_prompts
from verispec.provenance import provenance
from verispec.sampling import SamplingConfig
from verispec.stats import default_baseline
from verispec.variants import MethodVariant, parse_method

SCHEMA = "verispec.bench/1"
DEFAULT_OUT = "results/bench.json"


@dataclass
class BenchConfig:
    """Settings of `verispec bench`; the CLI reads its defaults from here."""

    prompts: str = "builtin"  # prompt source: builtin, mt-bench, humaneval, spec-bench:PATH, or a .txt / .jsonl file
    category: list[str] | None = None  # keep only these categories (Spec-Bench, MT-Bench); None = all
    limit: int | None = None  # how many prompts (after the category filter, shuffle and offset); None = all
    offset: int = 0  # skip this many prompts first: disjoint offset ranges give disjoint tuning / evaluation sets
    subset_seed: int | None = None  # shuffle the prompts with this seed before offset/limit; None = file order
    methods: list[str] = field(default_factory=lambda: ["ar", "sd", "hf-generate", "hf-assisted"])  # run order
    baseline: str | None = None  # speedups are against this method; None = "ar" when it runs, else the first method
    gamma: int = DecodeConfig.gamma  # draft tokens per round (speculative methods and hf-assisted)
    temperature: float = SamplingConfig.temperature  # 0 = greedy
    top_k: int = SamplingConfig.top_k  # 0 = off
    top_p: float = SamplingConfig.top_p  # 1 = off
    max_new_tokens: int = DecodeConfig.max_new_tokens  # per prompt, unless EOS comes first
    seed: int = DecodeConfig.seed  # prompt i is decoded with seed + i, by every method
    chat_template: bool = True  # feed prompts through the tokenizer's chat template when it has one
    # the pair verispec's methods run and how (its linear backend: verispec's methods'; its verifier: SPRINTER's);
    # in the results file its fields sit at the top level of `config` (`to_dict`)
    models: ModelSpec = field(default_factory=ModelSpec)
    peer_linear_backend: str = "torch"  # the transformers peers run transformers as users run it, by default
    compare_to: str | None = None  # a second reference: rows also get the speedup vs this method (e.g. "sd")
    warmup_tokens: int = 8  # per method, one excluded decode of this many tokens of the first prompt; 0 = none
    bootstrap_resamples: int = 2000  # resamples of the prompts for the speedup's 95% interval
    bootstrap_seed: int = 0  # seeds those resamples (numpy default_rng)
    quality: bool = False  # after the timed runs: target NLL of every output, ROUGE-L vs `ar` and vs references
    stop_at_function_end: bool = False  # HumanEval prompts: end a decode once the function is complete (execution)

    def __post_init__(self) -> None:
        if not self.methods:
            raise ConfigError(f"no methods; choose from: {', '.join([*METHODS, *PEERS, *LLAMACPP_PEERS, *VLLM_PEERS])}")
        for label in self.methods:
            self.variant(label)
        if self.compare_to is not None and self.compare_to not in self.methods:
            raise ConfigError(f"compare_to {self.compare_to!r} is not among the methods {self.methods}")
        if len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"methods are listed twice: {self.methods}")
        if self.baseline is not None and self.baseline not in self.methods:
            raise ConfigError(f"the baseline {self.baseline!r} is not among the methods {self.methods}")
        if not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 0:
            raise ConfigError(f"warmup_tokens must be an integer >= 0, got {self.warmup_tokens!r}")
        self.decode_config(0)  # validates gamma, max_new_tokens, seed and the sampling settings

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as the results file records them: JSON-able, the model settings at the top level."""
        return flat_dict(self)

    @property
    def baseline_method(self) -> str:
        """Return the method speedups are measured against."""
        return default_baseline(self.methods, self.baseline)

    def variant(self, label: str) -> MethodVariant:
        """Return the parsed method variant `label` (e.g. "sd:gamma=2")."""
        return parse_method(label, {*METHODS, *PEERS, *LLAMACPP_PEERS, *VLLM_PEERS})

    def sampling(self) -> SamplingConfig:
        """Return the sampling settings shared by every method."""
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def decode_config(self, index: int, max_new_tokens: int | None = None, label: str | None = None) -> DecodeConfig:
        """Return the decode settings of prompt `index` for method variant `label` (validated)."""
        variant = self.variant(label) if label else None
        name = variant.name if variant and variant.name in METHODS else "sd"
        settings = {"gamma": self.gamma, **(variant.overrides if variant else {})}
        return DecodeConfig(method=name, max_new_tokens=max_new_tokens or self.max_new_tokens,
                            sampling=self.sampling(), seed=self.seed + index, **settings)


def decode_one(decoder: Decoder, config: BenchConfig, method: str, prompt: Prompt, index: int,
               max_new_tokens: int | None = None, peer_decoder: Decoder | None = None,
               llamacpp: LlamaCppPeers | None = None, vllm: VllmPeers | None = None) -> Any:
    """Decode `prompt` with method variant `method` (engine method or peer); return its Generation /
    PeerGeneration. Peers run on `peer_decoder` when given (transformers' own linears); the llama.cpp peers on
    `llamacpp`'s servers and the vLLM peers on `vllm`'s workers, with the prompt tokenized by `decoder`."""
    name = config.variant(method).name
    settings = config.decode_config(index, max_new_tokens, method)
    if name in LLAMACPP_PEERS:
        if llamacpp is None:
            raise ConfigError(f"{method} needs the llama.cpp peers' servers (run it through run_bench)")
        return llamacpp_generate(llamacpp, decoder, prompt.text, method, settings, config.chat_template)
    if name in VLLM_PEERS:
        if vllm is None:
            raise ConfigError(f"{method} needs the vLLM peers' workers (run it through run_bench)")
        return vllm_generate(vllm, decoder, prompt.text, method, settings, config.chat_template)
    if name in PEERS:
        return peer_generate(peer_decoder or decoder, prompt.text, name, settings, config.chat_template)
    problem = execution_problem(prompt) if config.stop_at_function_end else None
    return decoder.generate(prompt.text, settings, chat_template=config.chat_template,
                            stop_text=function_end(problem) if problem is not None else None)


def check_held_out(decoder: Decoder, config: BenchConfig, prompts: list[Prompt]) -> None:
    """Raise ConfigError when a learned-verifier method would be evaluated on its verifier's training prompts
    (matched by text fingerprint, whatever file they come from); warn when the verifier file does not say."""
    if not any(METHODS[name].learned_stop for name in (config.variant(m).name for m in config.methods)
               if name in METHODS):
        return
    trained = decoder.verifier().metadata.get("training_prompts")
    if trained is None:
        warnings.warn(f"the verifier {config.models.verifier or ''} does not record its training prompts (it predates "
                      f"that record): cannot check that the evaluation prompts are held out", stacklevel=2)
        return
    seen = set(trained)
    overlap = [p.id for p in prompts if prompt_fingerprint(p.text) in seen]
    if overlap:
        raise ConfigError(f"{len(overlap)} of the {len(prompts)} evaluation prompts were used to train the verifier "
                          f"(ids {', '.join(overlap[:8])}{', ...' if len(overlap) > 8 else ''}): evaluate SPRINTER on "
                          f"held-out prompts (e.g. another --offset)")


# Settings that only select how many prompts run or how the aggregate is resampled: a resumed run may change them.
RESUMABLE_CHANGES = ("limit", "bootstrap_resamples", "bootstrap_seed")


def load_resumable(out_path: Path, config: BenchConfig, prompts: list[Prompt]) -> tuple[list[dict], list[dict]]:
    """Return (records, runs) of an earlier results file at `out_path` that `config` may resume: same settings
    (except `RESUMABLE_CHANGES`) and, prompt by prompt, the same prompts. ([], []) when there is no file yet."""
    if not out_path.exists():
        return [], []
    try:
        saved = json.loads(out_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot resume from {out_path}: {exc}") from exc
    if not isinstance(saved, dict) or saved.get("schema") != SCHEMA:
        raise ConfigError(f"cannot resume from {out_path}: not a {SCHEMA} results file")
    check_results_shape(saved, out_path, TEXT)
    if not isinstance(saved.get("runs", []), list):
        raise ConfigError(f"cannot resume from {out_path}: its 'runs' is not a list")
    ours, theirs = config.to_dict(), saved.get("config", {})
    # A setting the file predates ran as its default does (new settings default to the old behaviour).
    defaults = BenchConfig().to_dict()
    changed = [k for k in ours if k not in RESUMABLE_CHANGES
               and json.dumps(ours[k]) != json.dumps(theirs.get(k, defaults[k]))]
    if changed:
        diff = ", ".join(f"{k}: {theirs.get(k)!r} there, {ours[k]!r} now" for k in changed)
        raise ConfigError(f"cannot resume {out_path}: its run had other settings ({diff}); choose another --out or "
                          f"run without --resume to start over")
    records = saved.get("records", [])
    for record in records:
        index = record["prompt_index"]
        if index >= len(prompts):
            raise ConfigError(f"cannot resume {out_path}: it holds prompt {index + 1} but only {len(prompts)} are "
                              f"selected now; raise --limit")
        if (record["prompt_id"], record["prompt"]) != (prompts[index].id, prompts[index].text):
            raise ConfigError(f"cannot resume {out_path}: its prompt {index + 1} is {record['prompt_id']!r}, now it "
                              f"is {prompts[index].id!r} (another prompt set, order or offset)")
    # A prompt counts as done only with every method's record (the file is written after each complete prompt).
    done = {i for i in {r["prompt_index"] for r in records}
            if {r["method"] for r in records if r["prompt_index"] == i} == set(config.methods)}
    return [r for r in records if r["prompt_index"] in done], list(saved.get("runs", []))


def _prompts(count: int) -> str:
    return f"{count} prompt{'' if count == 1 else 's'}"


def run_bench(
    config: BenchConfig,
    out_path: str | Path | None = DEFAULT_OUT,
    decoder: Decoder | None = None,
    prompts: list[Prompt] | None = None,
    progress: bool = True,
    resume: bool = False,
    archive_path: str | Path | None = None,
) -> dict[str, Any]:
    """Run every method on every prompt (interleaved, warm-up excluded); return the results and write them to
    `out_path` (None: don't) after each prompt. `decoder` and `prompts` override the models and prompts the config
    names. With `resume`, prompts already complete in `out_path` (same settings) are kept, not run again: a long
    benchmark can stop and go on later; each record says in which `run` it was measured. With `archive_path`, the
    results' archive (`verispec.bench.archive`: compressed, prompt texts left out, meant to be committed) is
    rewritten whenever the results file is, so a run cut off between prompts keeps all it measured in it.
    The llama.cpp and vLLM peers are checked (binaries or vLLM's Python, model files) before any model loads; their
    servers and workers stop when the run ends, however it ends."""
    # Before anything slow (peers' servers, prompts, models): never measure for minutes, then fail to save.
    if out_path is not None:
        check_writable(out_path)
    if archive_path is not None:
        check_writable(archive_path, "the archive")
    names = {config.variant(m).name for m in config.methods}
    models = config.models
    with ExitStack() as stack:
        servers = {}  # the peers' processes, passed only to the runs that have such peers
        if names & set(LLAMACPP_PEERS):
            servers["llamacpp"] = stack.enter_context(
                LlamaCppPeers(list(config.methods), models.target, models.draft, torch.get_num_threads()))
        if names & set(VLLM_PEERS):
            servers["vllm"] = stack.enter_context(
                VllmPeers(list(config.methods), models.target, models.draft, torch.get_num_threads()))
        return _run_bench(config, out_path, decoder, prompts, progress, resume, archive_path, servers)


def _run_bench(
    config: BenchConfig,
    out_path: str | Path | None,
    decoder: Decoder | None,
    prompts: list[Prompt] | None,
    progress: bool,
    resume: bool,
    archive_path: str | Path | None,
    servers: dict[str, Any],
) -> dict[str, Any]:
    """`run_bench`'s body, with the peers' servers and workers by kind ("llamacpp", "vllm"; only those that run)."""
    from tqdm import tqdm

    if prompts is None:
        prompts = load_prompts(config.prompts, config.category, config.limit, config.subset_seed, config.offset)
    if not prompts:
        raise ConfigError("no prompts to run")
    out_path = Path(out_path) if out_path is not None else None
    if resume and out_path is None:
        raise ConfigError("resume needs a results file to resume from")
    if archive_path is not None and out_path is None:
        raise ConfigError("an archive is written beside a results file: give out_path too")

    records, runs = load_resumable(out_path, config, prompts) if resume else ([], [])
    done = {r["prompt_index"] for r in records}
    saved = [len(done) if resume else None]  # finished prompts in the results file on disk; None: none of this run

    def save(results: dict[str, Any]) -> None:
        # A failed write (full disk...) ends the run with one line saying what the files on disk still hold:
        # `write_atomically` leaves the previous file whole, so --resume goes on from there.
        finished = len({r["prompt_index"] for r in results["records"]})
        if out_path is not None:
            try:
                write_atomically(out_path, json.dumps(results, indent=1), "the results file")
            except ResultsWriteError as exc:
                kept = (f"{out_path} keeps the {_prompts(saved[0])} finished before" if saved[0]
                        else f"no finished prompt of this run is saved in {out_path}")
                raise ResultsWriteError(f"{exc}; {kept}: once it can be written, run again with --resume to "
                                        f"continue") from exc
            saved[0] = finished
        if archive_path is not None:
            try:
                write_archive(results, archive_path)
            except ResultsWriteError as exc:
                raise ResultsWriteError(f"{exc}; {out_path} holds all {_prompts(finished)} finished: once the "
                                        f"archive can be written, run again with --resume to rewrite it") from exc
    todo = [i for i in range(len(prompts)) if i not in done]
    run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_seconds": 0.0, "prompts": [],
           **provenance(config.models.device)}
    if "llamacpp" in servers:
        run["versions"]["llama.cpp"] = servers["llamacpp"].version()
    peer_decoder = None
    if todo:
        runs.append(run)
        if decoder is None:
            decoder = Decoder(config.models)
        # The peers get models of their own only when verispec's models run another linear path than theirs.
        if any(config.variant(m).name in PEERS for m in config.methods) and (
            decoder.model("target").linear_backend != config.peer_linear_backend
        ):
            peer_decoder = Decoder(config.models, linear_backend=config.peer_linear_backend,
                                   draft_linear_backend=None, verifier=None)
        check_held_out(decoder, config, prompts)
        if config.warmup_tokens:
            for method in config.methods:
                decode_one(decoder, config, method, prompts[todo[0]], todo[0], config.warmup_tokens, peer_decoder,
                           **servers)
        decoder.build_prompt_copies()  # no later long prompt pays for the set-up of the models the warm-up loaded

    def result() -> dict[str, Any]:
        ordered = sorted(records, key=lambda r: r["order"])
        return {
            "schema": SCHEMA,
            "config": config.to_dict(),
            "machine": run["machine"],
            "versions": run["versions"],
            "git_commit": run["git_commit"],
            "git_dirty": run["git_dirty"],
            "started": runs[0]["started"],
            "wall_seconds": sum(r["wall_seconds"] for r in runs),
            "runs": runs,
            "aggregate": summarize(ordered, config.methods, config.baseline_method,
                                   {m: config.decode_config(0, label=m).gamma for m in config.methods},
                                   config.bootstrap_resamples, config.bootstrap_seed, config.compare_to),
            "records": ordered,
        }

    bar = tqdm(total=len(todo) * len(config.methods), desc="bench", unit="decode", disable=not progress)
    for index in todo:
        prompt, start, batch = prompts[index], time.perf_counter(), []
        for method in config.methods:
            bar.set_postfix_str(f"prompt {index + 1}/{len(prompts)} {method}")
            gen = decode_one(decoder, config, method, prompt, index, peer_decoder=peer_decoder, **servers)
            batch.append({"prompt_index": index, "prompt_id": prompt.id, "category": prompt.category,
                          "prompt": prompt.text, "method": method, "order": len(records) + len(batch),
                          "run": len(runs) - 1, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **gen.to_dict()})
            bar.update()
        run["wall_seconds"] += time.perf_counter() - start
        if "vllm" in servers:  # known once a worker has started
            run["versions"]["vllm"] = servers["vllm"].version()
        # Scoring happens after the prompt's timed runs, so it never touches a measured decode.
        add_flops(batch, decoder)
        if config.quality:
            quality_records(batch, decoder, config.chat_template, {index: prompt.reference},
                            {index: execution_problem(prompt)})
        records.extend(batch)
        run["prompts"].append(index)
        # which kernels and weight types ran, per model: models load on first use, so read after the decodes
        run["linear_kernels"] = decoder.linear_kernels()
        save(result())
    bar.close()
    final = result()
    if not todo:
        save(final)
    return final
