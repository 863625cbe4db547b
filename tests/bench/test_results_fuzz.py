"""A bounded, seeded fuzz of the results readers (`report`, `archive pack` / `unpack`, `bench --resume`): a real
results file, mutated (keys dropped, values retyped) or truncated at random. Every outcome is success or a one-line
ConfigError; never a KeyError or TypeError from inside a reader."""

from __future__ import annotations

import copy
import gzip
import json
import random
from functools import partial

import pytest

from verispec import Decoder
from verispec.bench.archive import pack, unpack
from verispec.bench.report import write_report
from verispec.bench.runner import BenchConfig, load_resumable, run_bench
from verispec.errors import VerispecError
from verispec.prompt_sets import Prompt

CASES = 300
REPORTED = 40  # of them, also rendered as a report (plots take a while)
PROMPTS = [Prompt("1", "hello there", None, "builtin"), Prompt("2", "one two", None, "builtin")]
ODD_VALUES = [None, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1}, True, float("inf")]


@pytest.fixture(scope="module")
def valid(tiny_pair, tmp_path_factory):
    config = BenchConfig(methods=["ar", "sd"], max_new_tokens=4, warmup_tokens=0, bootstrap_resamples=20)
    out = tmp_path_factory.mktemp("fuzz") / "results.json"
    run_bench(config, out, decoder=Decoder(tiny_pair["target"], tiny_pair["partial"]), prompts=PROMPTS,
              progress=False)
    return config, json.loads(out.read_text())


def containers(value, found):
    """Collect every dict and list inside `value` (depth first)."""
    if isinstance(value, (dict, list)):
        found.append(value)
        for child in (value.values() if isinstance(value, dict) else value):
            containers(child, found)
    return found


def mutate(rng: random.Random, results: dict) -> str:
    """Return the JSON text of `results` with a few random keys dropped or retyped, or truncated."""
    data = copy.deepcopy(results)
    for _ in range(rng.randrange(1, 4)):
        target = rng.choice(containers(data, []))
        if not target:
            continue
        key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
        if isinstance(target, dict) and rng.random() < 0.4:
            del target[key]
        else:
            target[key] = rng.choice(ODD_VALUES)
    text = json.dumps(data)
    if rng.random() < 0.25:
        text = text[: rng.randrange(len(text))]
    return text


def outcome(read) -> str:
    try:
        read()
    except VerispecError as exc:
        assert "\n" not in str(exc), str(exc)
        return "error"
    return "ok"


def test_mutated_and_truncated_results_files_are_read_or_refused_in_one_line(valid, tmp_path):
    config, results = valid
    rng = random.Random(0)
    seen = set()
    for case in range(CASES):
        text = mutate(rng, results)
        path = tmp_path / f"case{case}.json"
        path.write_text(text)
        archive = tmp_path / f"case{case}.json.gz"
        archive.write_bytes(gzip.compress(text.encode()))
        readers = {
            "pack": partial(pack, path, tmp_path / "packed.json.gz"),
            "unpack": partial(unpack, archive, tmp_path / "unpacked.json"),
            "resume": partial(load_resumable, path, config, PROMPTS),
        }
        if case < REPORTED:
            readers["report"] = partial(write_report, path, tmp_path / "r.md", tmp_path / "r.png")
        for name, read in readers.items():
            try:
                seen.add((name, outcome(read)))
            except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
                pytest.fail(f"case {case}, {name}: {type(exc).__name__}: {exc}\n{text[:300]}")
    assert {("pack", "ok"), ("pack", "error"), ("resume", "error"), ("report", "error")} <= seen
