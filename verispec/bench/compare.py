"""The main job (`verispec compare`, what `make run` runs): a preset of the benchmark runner.

A few methods side by side on the built-in prompts (or a list of prompt strings), interleaved prompt by prompt,
warm-up excluded; the same runner and metrics as `verispec bench`, with the short table it has always printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verispec.api import Decoder
from verispec.bench.metrics import summarize
from verispec.bench.runner import BenchConfig, run_bench
from verispec.bench.tables import format_table
from verispec.config import DecodeConfig
from verispec.models.spec import ModelSpec
from verispec.prompt_sets import BUILTIN_PROMPTS, Prompt
from verispec.provenance import machine_description
from verispec.sampling import SamplingConfig

__all__ = ["BUILTIN_PROMPTS", "CompareConfig", "format_table", "machine_description", "run_compare", "summarize"]


@dataclass
class CompareConfig:
    """Settings of `verispec compare`."""

    methods: list[str] = field(default_factory=lambda: ["ar", "sd"])  # the first is the speedup baseline
    prompts: list[str] = field(default_factory=lambda: list(BUILTIN_PROMPTS))  # the prompt texts
    gamma: int = DecodeConfig.gamma  # draft tokens per round
    temperature: float = SamplingConfig.temperature  # 0 = greedy
    top_k: int = SamplingConfig.top_k  # 0 = off
    top_p: float = SamplingConfig.top_p  # 1 = off
    max_new_tokens: int = 48  # per prompt, unless EOS comes first (shorter than a decode's default: a quick job)
    seed: int = DecodeConfig.seed  # prompt i is decoded with seed + i
    models: ModelSpec = field(default_factory=ModelSpec)  # the pair and how it runs (default: the embedded pair)
    # per method, one excluded decode of this many tokens first: it runs every kernel and cache size a timed decode
    # meets early on, so that no first-use cost (page faults, allocations) lands in the first timed prompt
    warmup_tokens: int = 16


def bench_config(config: CompareConfig) -> BenchConfig:
    """Return the runner settings of this preset."""
    return BenchConfig(
        prompts="builtin" if config.prompts == BUILTIN_PROMPTS else "list", methods=list(config.methods),
        baseline=config.methods[0], gamma=config.gamma, temperature=config.temperature, top_k=config.top_k,
        top_p=config.top_p, max_new_tokens=config.max_new_tokens, seed=config.seed, models=config.models,
        warmup_tokens=config.warmup_tokens,
    )


def run_compare(
    config: CompareConfig, out_path: Path | None = None, progress: bool = True, decoder: Decoder | None = None
) -> dict[str, Any]:
    """Run every method on every prompt (interleaved), write the results JSON if asked, and return it.

    `decoder` overrides the models the config names (tests pass tiny ones).
    """
    prompts = [Prompt(str(i), text, None, "list") for i, text in enumerate(config.prompts, 1)]
    return run_bench(bench_config(config), out_path, decoder=decoder, prompts=prompts, progress=progress)
