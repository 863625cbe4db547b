"""The draft's answers as a ranking corpus: the instructions it answers and the expected token mass it adds up."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verispec.drafters.vocab_answers import SUBJECTS, TASKS, TEMPLATES, answer_mass, ranking_instructions


def test_the_instructions_are_distinct_seeded_and_start_with_every_task():
    first = ranking_instructions(200)
    assert len(set(first)) == 200 and first[: len(TASKS)] == list(TASKS)
    assert first == ranking_instructions(200) and first != ranking_instructions(200, seed=1)
    everything = ranking_instructions(len(TASKS) + len(TEMPLATES) * len(SUBJECTS))
    assert len(set(everything)) == len(everything)
    for bad in (0, len(everything) + 1):
        with pytest.raises(ValueError, match="count"):
            ranking_instructions(bad)


def test_the_mass_adds_the_drafts_law_at_every_answer_position_and_skips_empty_answers():
    answers = {"one": [5, 6], "none": [], "two": [7]}
    laws = {5: [0.5, 0.5, 0.0], 6: [0.0, 0.25, 0.75], 7: [1.0, 0.0, 0.0]}  # the law that predicts each token
    seen = []

    def generate(text, index):
        seen.append(index)
        return SimpleNamespace(tokens=answers[text])

    def score(ids, n):
        assert ids[:2] == [100, 101] and len(ids) == 2 + n  # the prompt, then the answer's n tokens
        return torch.tensor([laws[t] for t in ids[-n:]])

    def encode(text):
        return [100, 101]

    progress = []
    mass, positions = answer_mass(generate, score, encode, ["one", "none", "two"],
                                  progress=lambda done, total: progress.append((done, total)))
    assert positions == 3 and seen == [0, 1, 2] and progress == [(1, 2), (3, 3)]
    assert mass.dtype == np.float64 and mass.tolist() == [1.5, 0.75, 0.75]
    with pytest.raises(ValueError, match="none of the instructions"):
        answer_mass(generate, score, encode, ["none"])


def test_the_answers_command_writes_the_drafts_mass_and_how_it_was_made(tiny_folder, tmp_path, capsys):
    import json

    from verispec.drafters import vocab_cli

    out = tmp_path / "mass.npy"
    assert vocab_cli.main(["answers", "--draft", str(tiny_folder), "--linear-backend", "torch", "--count", "3",
                               "--max-new-tokens", "5", "--out", str(out)]) == 0
    mass, meta = np.load(out), json.loads(out.with_suffix(".json").read_text())
    assert meta["instructions"] == 3 and 3 <= meta["positions"] <= 15 and meta["temperature"] == 1.0
    assert mass.dtype == np.float64 and (mass >= 0).all()
    assert mass.sum() == pytest.approx(meta["positions"])  # one law per answer position, each summing to 1
    assert meta["command"].startswith("python -m verispec.drafters.vocab_cli answers") and "--count 3" in \
        meta["command"]
    assert str(out) in capsys.readouterr().out


def test_the_acceptance_weight_is_the_elementwise_minimum_of_the_target_and_draft_laws(tiny_pair):
    from verispec.drafters.vocab_answers import acceptance_probs, teacher_forced_probs

    target, draft = tiny_pair["target"], tiny_pair["partial"]
    ids = [3, 9, 4, 12, 7, 5]
    weights = acceptance_probs(target, draft, ids, 3)
    p, q = teacher_forced_probs(target, ids, 3), teacher_forced_probs(draft, ids, 3)
    assert weights.shape == p.shape == (3, len(target.tokenizer))
    assert torch.equal(weights, torch.minimum(p, q))
    alpha = weights.sum(-1)  # each position's exact acceptance probability: below 1 unless p = q
    assert (alpha < 1).all() and (alpha > 0).all()
    assert torch.allclose(acceptance_probs(target, tiny_pair["same"], ids, 3).sum(-1), torch.ones(3, dtype=p.dtype))


def test_the_answers_command_with_the_acceptance_weight_records_the_target(tiny_pair_folders, tmp_path):
    import json

    from verispec.drafters import vocab_cli

    out = tmp_path / "acceptance.npy"
    assert vocab_cli.main(["answers", "--draft", tiny_pair_folders["draft"], "--target",
                               tiny_pair_folders["target"], "--weight", "acceptance", "--linear-backend", "torch",
                               "--count", "3", "--max-new-tokens", "5", "--out", str(out)]) == 0
    mass, meta = np.load(out), json.loads(out.with_suffix(".json").read_text())
    assert meta["weight"] == "acceptance" and meta["target"] == tiny_pair_folders["target"]
    assert 0 < mass.sum() < meta["positions"]  # Σ min(p, q) per position is an acceptance probability below 1
    assert "--weight acceptance --target" in meta["command"]
