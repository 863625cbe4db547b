"""SPRINTER's packaged verifier: found by the draft model's name, a valid file trained on development prompts only,
used when no verifier is given (and reported), with a clear error for a draft that has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verispec import Decoder
from verispec.errors import ConfigError
from verispec.learned.collect import prompt_fingerprint
from verispec.learned.verifier import LearnedVerifier, packaged_verifier_path
from verispec.models.default_pair import DEFAULT_PAIR
from verispec.prompt_sets import load_prompts

DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "dev.jsonl"


def test_the_default_draft_has_a_packaged_verifier_that_loads():
    draft = DEFAULT_PAIR["draft"].upstream
    path = packaged_verifier_path(draft)
    assert path is not None and path.stat().st_size < 64 * 1024  # a few kilobytes of package data
    verifier = LearnedVerifier.load(path, expected_draft=draft, expected_hidden_size=896)
    assert verifier.features == "context" and 0.0 < verifier.threshold < 1.0
    assert len(verifier.metadata["training_prompts"]) == 32  # the bench refuses to evaluate on these
    assert packaged_verifier_path("someone/another-draft") is None


def test_the_packaged_verifier_was_trained_on_the_first_dev_prompts_only():
    if not DEV.exists():
        pytest.skip("the Spec-Bench development split is not at ../shared/data")
    trained = set(LearnedVerifier.load(packaged_verifier_path(DEFAULT_PAIR["draft"].upstream))
                  .metadata["training_prompts"])
    prompts = load_prompts(f"spec-bench:{DEV}", None, None, 0, 0)
    fingerprints = [prompt_fingerprint(p.text) for p in prompts]
    assert trained == set(fingerprints[:32])  # seed-0 order, positions 0-31: evaluation starts at 100
    assert not trained & set(fingerprints[100:])


def test_a_draft_without_a_packaged_verifier_is_a_clear_error(tiny_pair):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    with pytest.raises(ConfigError, match="none ships for it.*--verifier FILE"):
        decoder.generate("def f():", method="sprinter", max_new_tokens=4)


def test_a_given_verifier_is_reported_with_its_threshold(tiny_pair, tmp_path):
    import torch

    verifier = LearnedVerifier(torch.zeros(tiny_pair["partial"].model.config.hidden_size), 0.0, "context", 0.4,
                               1.0, tiny_pair["partial"].model.config.hidden_size, "tiny-partial")
    path = tmp_path / "verifier.safetensors"
    verifier.save(path)
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"], verifier=str(path))
    gen = decoder.generate("def f():", method="sprinter", max_new_tokens=4, tau=0.6)
    assert gen.verifier == {"file": str(path), "threshold": 0.6, "features": "context",
                            "draft_model": "tiny-partial"}
    assert json.loads(json.dumps(gen.to_dict()))["verifier"]["threshold"] == 0.6
    assert decoder.generate("def f():", method="sd", max_new_tokens=4).verifier is None
