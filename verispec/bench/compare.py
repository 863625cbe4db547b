"""The main job: decoding methods side by side on a few prompts, interleaved prompt by prompt.

Interleaving (every method on prompt 1, then every method on prompt 2, ...) makes machine drift hit all
methods alike; one short warm-up generation per method is run first and excluded.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from verispec.api import Decoder

BUILTIN_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain in two sentences what a hash map is.",
]


@dataclass
class CompareConfig:
    """Settings of `verispec compare`."""

    methods: list[str] = field(default_factory=lambda: ["ar", "sd"])  # the first is the speedup baseline
    prompts: list[str] = field(default_factory=lambda: list(BUILTIN_PROMPTS))
    gamma: int = 4
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 48
    seed: int = 0
    target: str | None = None
    draft: str | None = None
    dtype: str = "float32"


def machine_description() -> dict[str, Any]:
    """Return the machine, library versions and git commit, for results files."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "git_commit": commit or None,
    }


def summarize(records: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """Return one aggregate row per method: tokens/s, speedup vs the first method, acceptance, tokens/call."""
    rows = []
    for method in methods:
        mine = [r for r in records if r["method"] == method]
        tokens = sum(r["trace"]["generated"] for r in mine)
        seconds = sum(r["trace"]["time_total"] for r in mine)
        drafted = sum(sum(x["drafted"] for x in r["trace"]["rounds"]) for r in mine)
        accepted = sum(sum(x["accepted"] for x in r["trace"]["rounds"]) for r in mine)
        target_calls = sum(r["trace"]["target_calls"] for r in mine)
        rows.append(
            {
                "method": method,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": tokens / seconds if seconds else None,
                "acceptance_rate": accepted / drafted if drafted else None,
                "tokens_per_target_call": tokens / target_calls if target_calls else None,
            }
        )
    base = rows[0]["tokens_per_second"]
    for row in rows:
        row["speedup"] = row["tokens_per_second"] / base if base and row["tokens_per_second"] else None
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Return the aggregate rows as a markdown table."""

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        "| method | tokens | tokens/s | speedup | acceptance | tokens/target call |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['tokens']} | {fmt(r['tokens_per_second'], '.2f')} | {fmt(r['speedup'], '.2f')}x "
            f"| {fmt(r['acceptance_rate'], '.3f')} | {fmt(r['tokens_per_target_call'], '.2f')} |"
        )
    return "\n".join(lines)


def run_compare(config: CompareConfig, out_path: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every method on every prompt (interleaved), write the results JSON if asked, and return it."""
    from tqdm import tqdm

    decoder = Decoder(config.target, config.draft, dtype=config.dtype)
    settings = dict(
        gamma=config.gamma, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
        seed=config.seed,
    )
    for method in config.methods:  # warm-up (loads the models; first-call overheads), excluded
        decoder.generate(config.prompts[0], method=method, max_new_tokens=4, **settings)
    records = []
    started = time.time()
    bar = tqdm(total=len(config.prompts) * len(config.methods), desc="compare", disable=not progress)
    for index, prompt in enumerate(config.prompts):
        for method in config.methods:
            bar.set_postfix_str(f"prompt {index + 1}, {method}")
            gen = decoder.generate(prompt, method=method, max_new_tokens=config.max_new_tokens, **settings)
            records.append({"prompt_index": index, "prompt": prompt, "method": method, **gen.to_dict()})
            bar.update()
    bar.close()
    result = {
        "config": asdict(config),
        "machine": machine_description(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "aggregate": summarize(records, config.methods),
        "records": records,
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2))
    return result
