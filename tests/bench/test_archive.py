"""Results archives: no prompt text inside, the same bytes twice, unpacked back to the very file, resumable."""

from __future__ import annotations

import gzip
import json

import pytest

from verispec import Decoder
from verispec.bench.archive import pack, prompt_hash, unpack
from verispec.bench.runner import BenchConfig, run_bench
from verispec.cli import main
from verispec.errors import ConfigError
from verispec.prompt_sets import load_prompts

QUESTIONS = [(7, "writing", "Write a haiku about the sea."), (9, "math", "What is 17 times 23?"),
             (12, "qa", "Name a prime number larger than 100.")]


@pytest.fixture
def source(tmp_path):
    """A Spec-Bench prompt file; returns its source string."""
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"question_id": qid, "category": cat, "turns": [text, "again"]}) + "\n"
                            for qid, cat, text in QUESTIONS))
    return f"spec-bench:{path}"


def results_for(source):
    """A results dict shaped like `verispec bench`'s, two methods per prompt."""
    records = [{"prompt_index": i, "prompt_id": str(qid), "category": cat, "prompt": text, "method": method,
                "tokens": [i, 1, 2], "trace": {"generated": 3}}
               for i, (qid, cat, text) in enumerate(QUESTIONS) for method in ("ar", "sd")]
    return {"schema": 1, "config": {"prompts": source, "methods": ["ar", "sd"]}, "records": records}


def test_pack_drops_every_prompt_text_and_unpack_restores_the_file(source, tmp_path):
    results = results_for(source)
    (tmp_path / "r.json").write_text(json.dumps(results))
    pack(tmp_path / "r.json", tmp_path / "a" / "r.json.gz")
    raw = gzip.decompress((tmp_path / "a" / "r.json.gz").read_bytes()).decode()
    assert not any(text in raw for _, _, text in QUESTIONS)
    archived = json.loads(raw)
    assert [r["prompt_sha256"] for r in archived["records"]] == [prompt_hash(r["prompt"]) for r in results["records"]]
    unpack(tmp_path / "a" / "r.json.gz", tmp_path / "back.json")
    assert json.loads((tmp_path / "back.json").read_text()) == results


def test_packing_twice_gives_the_same_bytes(source, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(results_for(source)))
    pack(tmp_path / "r.json", tmp_path / "one.json.gz")
    pack(tmp_path / "r.json", tmp_path / "two.json.gz")
    assert (tmp_path / "one.json.gz").read_bytes() == (tmp_path / "two.json.gz").read_bytes()


def test_unpack_refuses_a_changed_or_missing_prompt_and_a_corrupt_archive(source, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(results_for(source)))
    pack(tmp_path / "r.json", tmp_path / "r.json.gz")
    path = tmp_path / "questions.jsonl"
    path.write_text(path.read_text().replace("17 times 23", "17 times 24"))
    with pytest.raises(ConfigError, match="'9' .* SHA-256 differs"):
        unpack(tmp_path / "r.json.gz", tmp_path / "back.json")
    path.write_text(path.read_text().splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match="has no prompt '9'"):
        unpack(tmp_path / "r.json.gz", tmp_path / "back.json")
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="not a gzipped results archive"):
        unpack(tmp_path / "bad.json.gz", tmp_path / "back.json")
    assert not (tmp_path / "back.json").exists()
    for text in ("{not json", json.dumps({"records": [{"method": "ar"}]}), "[]"):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ConfigError, match="not a results file"):
            pack(tmp_path / "bad.json", tmp_path / "bad.json.gz")


def test_cli_round_trip_refuses_to_overwrite_without_force(source, tmp_path, capsys):
    (tmp_path / "r.json").write_text(json.dumps(results_for(source)))
    assert main(["archive", "pack", str(tmp_path / "r.json"), str(tmp_path / "r.json.gz")]) == 0
    assert main(["archive", "unpack", str(tmp_path / "r.json.gz"), str(tmp_path / "r.json")]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["archive", "unpack", str(tmp_path / "r.json.gz"), str(tmp_path / "r.json"), "--force"]) == 0
    assert main(["archive", "pack", str(tmp_path / "missing.json"), str(tmp_path / "m.json.gz")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_unpacked_results_file_resumes_without_decoding_again(tiny_pair, source, tmp_path):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    config = BenchConfig(prompts=source, methods=["ar", "sd"], max_new_tokens=4, warmup_tokens=0,
                         bootstrap_resamples=20)
    prompts = load_prompts(source)
    first = run_bench(config, tmp_path / "r.json", decoder=decoder, prompts=prompts[:2], progress=False)
    pack(tmp_path / "r.json", tmp_path / "r.json.gz")
    (tmp_path / "r.json").unlink()
    unpack(tmp_path / "r.json.gz", tmp_path / "r.json")
    resumed = run_bench(config, tmp_path / "r.json", decoder=decoder, prompts=prompts, progress=False, resume=True)
    assert resumed["records"][:4] == first["records"]
    assert [r["prompt_id"] for r in resumed["records"][4:]] == ["12", "12"]
    assert [run["prompts"] for run in resumed["runs"]] == [[0, 1], [2]]


def test_bench_rewrites_the_archive_after_every_prompt_so_a_cut_off_run_keeps_it(tiny_pair, source, tmp_path,
                                                                                  monkeypatch):
    from verispec.bench import runner

    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    config = BenchConfig(prompts=source, methods=["ar", "sd"], max_new_tokens=4, warmup_tokens=0,
                         bootstrap_resamples=20)
    prompts = load_prompts(source)
    original = runner.decode_one

    def cut_off_at_the_third_prompt(decoder, config, method, prompt, index, *args, **kwargs):
        if index == 2:
            raise KeyboardInterrupt  # as when a run is stopped mid-way
        return original(decoder, config, method, prompt, index, *args, **kwargs)

    monkeypatch.setattr(runner, "decode_one", cut_off_at_the_third_prompt)
    with pytest.raises(KeyboardInterrupt):
        run_bench(config, tmp_path / "r.json", decoder=decoder, prompts=prompts, progress=False,
                  archive_path=tmp_path / "kept" / "r.json.gz")
    (tmp_path / "r.json").unlink()  # the results file does not outlive the machine; the archive does
    unpack(tmp_path / "kept" / "r.json.gz", tmp_path / "r.json")
    monkeypatch.setattr(runner, "decode_one", original)
    resumed = run_bench(config, tmp_path / "r.json", decoder=decoder, prompts=prompts, progress=False, resume=True,
                        archive_path=tmp_path / "kept" / "r.json.gz")
    assert [r["prompt_id"] for r in resumed["records"]] == ["7", "7", "9", "9", "12", "12"]
    assert [run["prompts"] for run in resumed["runs"]] == [[0, 1], [2]]
    pack(tmp_path / "r.json", tmp_path / "packed.json.gz")
    assert (tmp_path / "kept" / "r.json.gz").read_bytes() == (tmp_path / "packed.json.gz").read_bytes()
    assert not list((tmp_path / "kept").glob("*.partial"))
    with pytest.raises(ConfigError, match="archive .* results file"):
        run_bench(config, None, decoder=decoder, prompts=prompts, progress=False, archive_path=tmp_path / "a.gz")
