"""Verifier data collection on the tiny Hugging Face models (§3.2), and collect -> train -> save -> load."""

from __future__ import annotations

import argparse

import pytest
import torch

from verispec.learned import LearnedVerifier, VerifierFileError, collect, load_dataset, save_dataset, train_verifier
from verispec.learned.cli import register
from verispec.learned.collect import VerifierData, prompt_fingerprint, training_fingerprints
from verispec.learned.verifier import feature_matrix
from verispec.sampling import SamplingConfig

TEXTS = ["hello world", "the cat sat", "one two three", "abc def", "speculative", "x y z"]
GREEDY = SamplingConfig(temperature=0.0)
WARM = SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]


def rows_of(data, prompt_id: int) -> torch.Tensor:
    rows = torch.nonzero(data.prompt_id == prompt_id).view(-1)
    return rows[torch.argsort(data.step[rows])]


def greedy_continuation(model, prompt: list[int], n: int) -> list[int]:
    model.reset()
    logits, out = model.forward(prompt).logits[-1], []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model.forward([out[-1]]).logits[-1]
    return out


def test_same_model_labels_every_token_acceptable(tiny_pair, prompts):
    # q = p up to rounding (the draft runs token by token, the target over a block): λ a hair above 1
    data = collect(tiny_pair["same"], tiny_pair["target"], prompts[:3], steps=10, lam=1 + 1e-9, sampling=WARM)
    assert len(data) == 30 and data.hidden.shape == (30, 32)
    assert bool((data.label == 1).all()) and torch.allclose(data.q_x, data.p_x, atol=1e-9)
    assert torch.equal(data.position, data.step + 1) and torch.equal(data.committed, data.token)
    assert data.manifest["positives"] == 30 and data.manifest["draft_model"] == "tiny-same"


@pytest.mark.parametrize("draft", ["partial", "unrelated"])
def test_greedy_trajectory_is_the_target_greedy_decoding(tiny_pair, prompts, draft):
    # §3.2 at temperature 0: keep the draft token iff it is the target's argmax, else take the target's token
    target = tiny_pair["target"]
    data = collect(tiny_pair[draft], target, prompts[:3], steps=12, sampling=GREEDY, block=4, cap=5)
    for pid, prompt in enumerate(prompts[:3]):
        rows = rows_of(data, pid)
        assert data.committed[rows].tolist() == greedy_continuation(target, prompt, 12)
    assert torch.equal(data.label == 1, data.token == data.committed)
    assert bool((data.q_x == 1).all()) and bool((data.q_entropy == 0).all())
    # positions restart after a label 0 or after the cap
    previous = torch.cat([torch.tensor([0]), data.label[:-1]])
    restart = (data.step == 0) | (previous == 0) | (torch.cat([torch.tensor([0]), data.position[:-1]]) == 5)
    assert torch.equal(data.position == 1, restart) and int(data.position.max()) <= 5


def test_block_size_does_not_change_the_data(tiny_pair, prompts):
    runs = [collect(tiny_pair["partial"], tiny_pair["target"], prompts[:2], steps=9, sampling=GREEDY, block=b)
            for b in (1, 4)]
    for key in ("token", "committed", "label", "position", "step", "prompt_id"):
        assert torch.equal(getattr(runs[0], key), getattr(runs[1], key)), key
    assert torch.allclose(runs[0].hidden, runs[1].hidden, atol=1e-5)
    assert torch.allclose(runs[0].p_x, runs[1].p_x)


def test_hidden_state_is_the_one_that_produced_q(tiny_pair, prompts):
    draft = tiny_pair["partial"]
    data = collect(draft, tiny_pair["target"], prompts[:1], steps=3, sampling=WARM, seed=4)
    draft.reset()
    out = draft.forward(prompts[0], 1, return_hidden=True)
    assert torch.allclose(data.hidden[0], out.hidden[-1].float())
    q = torch.softmax(out.logits[-1].double(), -1)
    assert data.q_x[0] == pytest.approx(float(q[data.token[0]]), rel=1e-9)


def test_eos_ends_a_trajectory(tiny_pair, prompts):
    plain = collect(tiny_pair["partial"], tiny_pair["target"], prompts[:1], steps=10, sampling=GREEDY)
    eos = int(plain.committed[4])
    data = collect(tiny_pair["partial"], tiny_pair["target"], prompts[:1], steps=10, sampling=GREEDY, eos_ids={eos})
    committed = data.committed.tolist()
    assert committed[-1] == eos and eos not in committed[:-1] and len(committed) <= 5


def test_collect_train_save_load_round_trip(tiny_pair, prompts, tmp_path):
    data = collect(tiny_pair["partial"], tiny_pair["target"], prompts, steps=15, sampling=WARM, seed=1)
    path = save_dataset(tmp_path / "data.safetensors", data, {"note": "training prompts"})
    loaded = load_dataset(path)
    for key, value in data.tensors().items():
        assert torch.equal(loaded.tensors()[key], value), key
    assert loaded.manifest["note"] == "training prompts" and loaded.manifest["rows"] == 90
    assert (tmp_path / "data.safetensors.json").is_file()
    for features in ("context", "token"):
        verifier, report = train_verifier(loaded, features=features, val_fraction=0.34, epochs=10)
        assert verifier.draft_model == "tiny-partial"
        # The split holds out whole prompts: round(0.34 · 6) = 2 of them, with every one of their rows.
        assert len(report.val_prompts) == 2 and set(report.val_prompts).isdisjoint(report.train_prompts)
        assert report.val_rows == int(torch.isin(data.prompt_id, torch.tensor(report.val_prompts)).sum())
        assert report.val_rows + report.train_rows == 90 and report.train_rows > report.val_rows
        verifier.save(tmp_path / f"{features}.safetensors")
        again = LearnedVerifier.load(tmp_path / f"{features}.safetensors", "tiny-partial", 32)
        x = feature_matrix(features, data.hidden, data.q_x, data.q_entropy, data.position)
        assert torch.equal(again.score_features(x), verifier.score_features(x))
        assert again.metadata["validation"] == report.validation or report.validation["auc"] != report.validation[
            "auc"]  # NaN AUC (one class) compares unequal
        with pytest.raises(VerifierFileError, match="made for draft model 'tiny-partial'"):
            LearnedVerifier.load(tmp_path / f"{features}.safetensors", expected_draft="tiny-unrelated")
    # a live score from the draft's own forward equals the stored row's score
    draft = tiny_pair["partial"]
    draft.reset()
    out = draft.forward(prompts[0], 1, return_hidden=True)
    q_row = torch.softmax(out.logits[-1].double(), -1)
    live = again.score(out.hidden[-1], q_row, int(data.token[0]), 1)
    assert live == pytest.approx(float(again.score_features(x[:1])[0]), abs=1e-6)


def test_cli_collect_train_eval(tiny_pair, tmp_path, capsys):
    folders = {}
    for role in ("target", "partial"):
        folders[role] = tmp_path / role
        tiny_pair[role].model.save_pretrained(folders[role])
        tiny_pair[role].tokenizer.save_pretrained(folders[role])
    (tmp_path / "prompts.txt").write_text("\n".join(TEXTS) + "\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    data, verifier = tmp_path / "d.safetensors", tmp_path / "v.safetensors"

    def run(*argv: str) -> str:
        args = parser.parse_args(["verifier", *argv])
        assert args.func(args) == 0
        return capsys.readouterr().out

    out = run("collect", "--target", str(folders["target"]), "--draft", str(folders["partial"]), "--prompts",
              str(tmp_path / "prompts.txt"), "--no-chat-template", "--steps", "6", "--temperature", "1",
              "--no-progress", "--out", str(data))
    assert "36 rows from 6 prompts" in out
    manifest = load_dataset(data).manifest
    assert manifest["prompt_ids"] == ["1", "2", "3", "4", "5", "6"]
    assert manifest["prompt_fingerprints"] == [prompt_fingerprint(text) for text in TEXTS]
    out = run("train", "--data", str(data), "--features", "token", "--epochs", "5", "--out", str(verifier))
    assert "validation: AUC" in out and verifier.is_file()
    # the verifier records its training prompts, so a benchmark can refuse to evaluate on them
    assert LearnedVerifier.load(verifier).metadata["training_prompts"] == sorted(map(prompt_fingerprint, TEXTS))
    joined = VerifierData.concat([load_dataset(data), load_dataset(data)])
    assert training_fingerprints(joined.manifest) == sorted(map(prompt_fingerprint, TEXTS))
    assert training_fingerprints({"joined": [manifest, {"prompt_ids": ["7"]}]}) is None  # an older part: unknown
    out = run("eval", "--verifier", str(verifier), "--data", str(data), "--threshold", "0.4")
    assert "tau=0.4000" in out and "eta_FP" in out and "position" in out
