"""The benchmark runner: several methods on the same prompts, interleaved prompt by prompt, into one JSON file.

Interleaving (every method on prompt 1, then every method on prompt 2, ...) makes machine drift (thermal state,
other load) hit all methods alike. Before measuring, each method decodes a few tokens of the first prompt once
(loading models, first-call allocations); that warm-up is excluded. Engine methods go through `Decoder.generate`,
peers (transformers' own decoding) through `peers.peer_generate`; both return a trace, so all metrics come from the
same fields.

The results file holds: `schema`, `config` (the BenchConfig), `machine`, `versions`, `git_commit`, `git_dirty`,
`started`, `wall_seconds`, `aggregate` (one row per method, `metrics.summarize`) and `records` (one per prompt and
method: `prompt_index`, `prompt_id`, `category`, `prompt`, `method`, `order`, then `Generation.to_dict()`).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from verispec.api import Decoder
from verispec.bench.datasets import Prompt, load_prompts
from verispec.bench.metrics import summarize
from verispec.bench.peers import PEERS, peer_generate
from verispec.engine import DecodeConfig
from verispec.errors import ConfigError
from verispec.methods import METHODS
from verispec.sampling import SamplingConfig

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
    target: str | None = None  # target model: hub id, folder or .gguf file; None = the embedded default
    draft: str | None = None  # draft model, likewise
    dtype: str = "float32"  # model weights: float32 | bfloat16 | float16 | float64
    device: str = "cpu"  # torch device of both models
    warmup_tokens: int = 8  # per method, one excluded decode of this many tokens of the first prompt; 0 = none
    bootstrap_resamples: int = 2000  # resamples of the prompts for the speedup's 95% interval
    bootstrap_seed: int = 0  # seeds those resamples (numpy default_rng)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS and m not in PEERS]
        if unknown or not self.methods:
            raise ConfigError(f"unknown method(s) {unknown}; choose from: {', '.join([*METHODS, *PEERS])}")
        if len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"methods are listed twice: {self.methods}")
        if self.baseline is not None and self.baseline not in self.methods:
            raise ConfigError(f"the baseline {self.baseline!r} is not among the methods {self.methods}")
        if not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 0:
            raise ConfigError(f"warmup_tokens must be an integer >= 0, got {self.warmup_tokens!r}")
        self.decode_config(0)  # validates gamma, max_new_tokens, seed and the sampling settings

    @property
    def baseline_method(self) -> str:
        """Return the method speedups are measured against."""
        return self.baseline or ("ar" if "ar" in self.methods else self.methods[0])

    def sampling(self) -> SamplingConfig:
        """Return the sampling settings shared by every method."""
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def decode_config(self, index: int, max_new_tokens: int | None = None) -> DecodeConfig:
        """Return the decode settings of prompt `index` (an engine method's name is filled in by the caller)."""
        return DecodeConfig(method="sd", gamma=self.gamma, max_new_tokens=max_new_tokens or self.max_new_tokens,
                            sampling=self.sampling(), seed=self.seed + index)


def git_state() -> tuple[str | None, bool | None]:
    """Return (commit, whether the working tree has uncommitted changes) of the checkout verispec runs from."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent,
                                  timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain") if commit else None
    return commit or None, (bool(status) if status is not None else None)


def versions() -> dict[str, str | None]:
    """Return the versions of Python, verispec and the libraries that decide its speed."""
    from importlib.metadata import PackageNotFoundError, version

    import verispec

    out: dict[str, str | None] = {"python": platform.python_version(), "verispec": verispec.__version__,
                                  "torch": torch.__version__}
    for name in ("transformers", "tokenizers", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine_description(device: str = "cpu") -> dict[str, Any]:
    """Return the machine: platform, processor, CPU count, torch threads, accelerator, versions and git commit."""
    import transformers

    commit, dirty = git_state()
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "git_commit": commit,
        "git_dirty": dirty,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def decode_one(decoder: Decoder, config: BenchConfig, method: str, prompt: Prompt, index: int,
               max_new_tokens: int | None = None) -> Any:
    """Decode `prompt` with `method` (engine method or peer); return its Generation / PeerGeneration."""
    settings = config.decode_config(index, max_new_tokens)
    if method in PEERS:
        return peer_generate(decoder, prompt.text, method, settings.gamma, settings.sampling,
                             settings.max_new_tokens, settings.seed, config.chat_template)
    s = settings.sampling
    return decoder.generate(prompt.text, method=method, gamma=settings.gamma, temperature=s.temperature,
                            top_k=s.top_k, top_p=s.top_p, max_new_tokens=settings.max_new_tokens,
                            seed=settings.seed, chat_template=config.chat_template)


def run_bench(
    config: BenchConfig,
    out_path: str | Path | None = DEFAULT_OUT,
    decoder: Decoder | None = None,
    prompts: list[Prompt] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every method on every prompt (interleaved, warm-up excluded); write the results JSON to `out_path`
    (None: don't) and return it. `decoder` and `prompts` override the models and prompts the config names."""
    from tqdm import tqdm

    if prompts is None:
        prompts = load_prompts(config.prompts, config.category, config.limit, config.subset_seed, config.offset)
    if not prompts:
        raise ConfigError("no prompts to run")
    if decoder is None:
        decoder = Decoder(config.target, config.draft, dtype=config.dtype, device=config.device)
    if config.warmup_tokens:
        for method in config.methods:
            decode_one(decoder, config, method, prompts[0], 0, max_new_tokens=config.warmup_tokens)

    records: list[dict[str, Any]] = []
    started, start = time.strftime("%Y-%m-%dT%H:%M:%S"), time.perf_counter()
    bar = tqdm(total=len(prompts) * len(config.methods), desc="bench", unit="decode", disable=not progress)
    for index, prompt in enumerate(prompts):
        for method in config.methods:
            bar.set_postfix_str(f"prompt {index + 1}/{len(prompts)} {method}")
            gen = decode_one(decoder, config, method, prompt, index)
            records.append({"prompt_index": index, "prompt_id": prompt.id, "category": prompt.category,
                            "prompt": prompt.text, "method": method, "order": len(records), **gen.to_dict()})
            bar.update()
    bar.close()

    commit, dirty = git_state()
    result = {
        "schema": SCHEMA,
        "config": asdict(config),
        "machine": machine_description(config.device),
        "versions": versions(),
        "git_commit": commit,
        "git_dirty": dirty,
        "started": started,
        "wall_seconds": time.perf_counter() - start,
        "aggregate": summarize(records, config.methods, config.baseline_method, config.gamma,
                               config.bootstrap_resamples, config.bootstrap_seed),
        "records": records,
    }
    if out_path is not None:
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
    return result
