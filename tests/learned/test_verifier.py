"""LearnedVerifier: training on separable data, features, save/load, and bad files rejected clearly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.learned.synthetic import separable_data
from verispec.errors import ConfigError
from verispec.learned import LearnedVerifier, VerifierFileError, evaluate_verifier, train_verifier
from verispec.learned.verifier import entropy, feature_matrix


@pytest.fixture(scope="module")
def trained():
    return train_verifier(separable_data(), features="context", seed=0)


@pytest.mark.parametrize("features", ["context", "token"])
def test_separable_data_gives_a_high_auc(features):
    verifier, report = train_verifier(separable_data(), features=features, seed=0)
    assert report.validation["auc"] > 0.95
    assert report.validation["accuracy"] > report.validation["majority_accuracy"] + 0.2
    assert set(report.train_prompts).isdisjoint(report.val_prompts) and report.val_rows > 0
    assert verifier.metadata["validation"]["auc"] == report.validation["auc"]
    assert verifier.threshold == 0.5 and verifier.features == features


def test_unlearnable_labels_do_not_fake_a_high_auc():
    # the AUC check can fail: labels independent of the features give an AUC near 0.5
    data = separable_data(seed=1)
    data.label = data.label[torch.randperm(len(data), generator=torch.Generator().manual_seed(0))]
    _, report = train_verifier(data, seed=0)
    assert report.validation["auc"] < 0.8


def test_training_is_seeded(trained):
    again, _ = train_verifier(separable_data(), features="context", seed=0)
    assert torch.equal(again.weight, trained[0].weight) and again.bias == trained[0].bias


def test_balanced_weights_and_fp_calibration():
    verifier, report = train_verifier(separable_data(margin=1.5), class_weight="balanced", target_fp_rate=0.05)
    assert report.validation["eta_fp"] <= 0.05
    assert verifier.threshold == report.threshold != 0.5


def test_split_needs_two_prompts():
    data = separable_data()
    data.prompt_id = torch.zeros_like(data.prompt_id)
    with pytest.raises(ConfigError, match="needs >= 2 prompts"):
        train_verifier(data)


def test_feature_vector_matches_the_batched_features():
    data = separable_data()
    verifier, _ = train_verifier(data, features="token", seed=0)
    q_row = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    hidden = data.hidden[3]
    f = verifier.feature_vector(hidden, q_row, token=2, position=4)
    q_x = torch.tensor([0.3], dtype=torch.float64)
    batched = feature_matrix("token", hidden[None], q_x, entropy(q_row)[None], torch.tensor([4]))
    assert torch.allclose(f, batched[0], atol=1e-12)
    assert verifier.score(hidden, q_row, 2, 4) == pytest.approx(float(verifier.score_features(batched)[0]), abs=1e-12)
    with pytest.raises(ValueError, match="hidden state must be"):
        verifier.feature_vector(torch.zeros(5), q_row, 2, 4)


def test_save_load_round_trip(tmp_path, trained):
    verifier, _ = trained
    verifier = verifier.with_threshold(0.37)
    path = tmp_path / "v.safetensors"
    verifier.save(path)
    loaded = LearnedVerifier.load(path, expected_draft="synthetic-draft", expected_hidden_size=8)
    assert torch.equal(loaded.weight, verifier.weight) and loaded.bias == verifier.bias
    assert (loaded.threshold, loaded.lam, loaded.features, loaded.hidden_size, loaded.draft_model) == (
        0.37, 1.0, "context", 8, "synthetic-draft")
    assert loaded.metadata == json.loads(json.dumps(verifier.metadata))
    data = separable_data(seed=3)
    assert evaluate_verifier(loaded, data).rates == evaluate_verifier(verifier, data).rates
    x = feature_matrix("context", data.hidden, data.q_x, data.q_entropy, data.position)
    assert torch.equal(loaded.score_features(x), verifier.score_features(x))
    assert loaded.accepts(0.37) and not loaded.accepts(0.369)


def write_with(path, trained, drop: str | None = None, change: dict | None = None, tensors: dict | None = None):
    """Save the trained verifier, then rewrite its file with a metadata field dropped or changed."""
    verifier, _ = trained
    verifier.save(path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        header = dict(handle.metadata())
        stored = {k: handle.get_tensor(k) for k in handle.keys()}
    header.pop(drop, None)
    header.update(change or {})
    save_file(tensors if tensors is not None else stored, str(path), metadata=header)


def test_missing_file(tmp_path):
    with pytest.raises(VerifierFileError, match="verifier file not found"):
        LearnedVerifier.load(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("content", [b"", b"this is not a safetensors file", b"\xff" * 64])
def test_corrupt_bytes(tmp_path, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(VerifierFileError, match="not a readable safetensors file"):
        LearnedVerifier.load(path)


def test_truncated_file(tmp_path, trained):
    path = tmp_path / "v.safetensors"
    trained[0].save(path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(VerifierFileError, match="not a readable safetensors file"):
        LearnedVerifier.load(path)


@pytest.mark.parametrize("field", ["lam", "threshold", "hidden_size", "draft_model", "features", "metadata"])
def test_missing_metadata_field(tmp_path, trained, field):
    path = tmp_path / "v.safetensors"
    write_with(path, trained, drop=field)
    with pytest.raises(VerifierFileError, match=f"lacks the metadata field '{field}'"):
        LearnedVerifier.load(path)


def test_wrong_draft_and_hidden_size(tmp_path, trained):
    path = tmp_path / "v.safetensors"
    trained[0].save(path)
    with pytest.raises(VerifierFileError, match="made for draft model 'synthetic-draft' but .* 'Qwen/other'"):
        LearnedVerifier.load(path, expected_draft="Qwen/other")
    with pytest.raises(VerifierFileError, match="made for hidden size 8 .* loaded for hidden size 896"):
        LearnedVerifier.load(path, expected_hidden_size=896)


def test_other_damage(tmp_path, trained):
    path = tmp_path / "v.safetensors"
    write_with(path, trained, change={"format": "something-else"})
    with pytest.raises(VerifierFileError, match="not a verispec verifier file"):
        LearnedVerifier.load(path)
    write_with(path, trained, change={"hidden_size": "9"})
    with pytest.raises(VerifierFileError, match=r"weight \(8,\)"):
        LearnedVerifier.load(path)
    write_with(path, trained, change={"lam": "one"})
    with pytest.raises(VerifierFileError, match="invalid metadata field"):
        LearnedVerifier.load(path)
    write_with(path, trained, tensors={"weight": torch.zeros(8, dtype=torch.float64)})
    with pytest.raises(VerifierFileError, match="lacks the tensor 'bias'"):
        LearnedVerifier.load(path)


@pytest.mark.parametrize("features", ["context", "token"])
def test_accept_mask_is_the_decision_for_every_token(features):
    gen = torch.Generator().manual_seed(0)
    hidden_size, vocab = 6, 40
    extra = 4 if features == "token" else 0
    weight = torch.randn(hidden_size + extra, generator=gen, dtype=torch.float64)
    mixed = False
    for tau in (0.3, 0.5, 0.7):
        verifier = LearnedVerifier(weight, 0.1, features, tau, 1.0, hidden_size, "any")
        hidden = torch.randn(hidden_size, generator=gen)
        q_row = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
        for position in (1, 3):
            mask = verifier.accept_mask(hidden, q_row, position)
            decisions = [verifier.accepts(verifier.score(hidden, q_row, v, position)) for v in range(vocab)]
            assert mask.tolist() == [float(d) for d in decisions]
            mixed |= 0 < float(mask.sum()) < vocab
    assert mixed == (features == "token")  # a token verifier separates tokens: the check compares real decisions
