"""SPRINTER's learned verifier: logistic regression on the draft's hidden state (docs/algorithms.md §3.2), one file.

Two feature sets (§3.8 question 1):
- `context` (the released design): the draft's last-layer hidden state at the last context position, the state
  that produced q(·|ctx). It cannot see the sampled token, so its decision is the same for every x (§3.3).
- `token`: that hidden state plus token-dependent features of the processed draft law q: q(x), log q(x), the
  entropy of q, and log of the position in the run. At λ = 1 it gives the mixture law (1 − η_FP)p + η_FP q.

The score is sigmoid(w·f + b); the verifier accepts when score ≥ τ (`threshold`). Input standardisation is folded
into w and b at training time, so the file holds only w `[F]`, b and the metadata.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from verispec.errors import VerifierFileError

FEATURE_SETS = ("context", "token")
TOKEN_FEATURES = ("q_x", "log_q_x", "q_entropy", "log_position")  # appended after the hidden state for "token"
FILE_FORMAT = "verispec-learned-verifier"
FILE_VERSION = "1"
REQUIRED_FIELDS = ("format", "version", "features", "threshold", "lam", "hidden_size", "draft_model", "metadata")
MIN_LOG_PROB = 1e-12  # log q(x) is clamped here: a drafted token has q(x) > 0, but rounding can give 0
# Verifiers shipped with the package, one per draft model, named after it ("/" -> "--"): each trained on the
# Spec-Bench development split only (its training prompts' fingerprints are in its metadata; the bench refuses to
# evaluate on them). `benchmarks/default_verifier.sh` rebuilds them.
PACKAGED_DIR = Path(__file__).parent / "data"


def packaged_verifier_path(draft_model: str) -> Path | None:
    """Return the verifier file shipped for `draft_model` (a model name as `HFCausalLM.name` gives it), or None."""
    path = PACKAGED_DIR / f"{draft_model.replace('/', '--')}.safetensors"
    return path if path.is_file() else None


def _sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))


def entropy(q: torch.Tensor) -> torch.Tensor:
    """Return the entropy (nats) of the distributions `[..., V]` → `[...]`, float64, with 0·log 0 = 0."""
    q = q.to(torch.float64)
    return -(q * q.clamp_min(1e-300).log()).sum(-1)


def token_features(q_x: torch.Tensor, q_entropy: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Return the token-dependent features `[N, 4]` (TOKEN_FEATURES order) from q(x) `[N]`, H(q) `[N]` and the
    1-based position in the run `[N]`."""
    q_x = q_x.to(torch.float64)
    return torch.stack(
        [q_x, q_x.clamp_min(MIN_LOG_PROB).log(), q_entropy.to(torch.float64), position.to(torch.float64).log()], -1
    )


def feature_matrix(
    features: str, hidden: torch.Tensor, q_x: torch.Tensor, q_entropy: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Return the feature matrix `[N, F]` float64 of `features` for N drafted tokens (hidden `[N, H]`, others `[N]`)."""
    check_features(features)
    hidden = hidden.to(torch.float64)
    if features == "context":
        return hidden
    return torch.cat([hidden, token_features(q_x, q_entropy, position)], -1)


def check_features(features: str) -> None:
    """Raise ValueError unless `features` names a feature set."""
    if features not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {features!r}; choose one of {', '.join(FEATURE_SETS)}")


def feature_size(features: str, hidden_size: int) -> int:
    """Return F, the number of features of `features` on a draft with hidden size H."""
    check_features(features)
    return hidden_size + (len(TOKEN_FEATURES) if features == "token" else 0)


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no single truth value
class LearnedVerifier:
    """A trained linear verifier: score = sigmoid(w·f + b), accept when score ≥ threshold."""

    weight: torch.Tensor  # [F] float64, on raw (unstandardised) features
    bias: float
    features: str  # "context" | "token"
    threshold: float  # τ: accept when score >= τ (the paper's 0.5 by default)
    lam: float  # λ of the training labels q(x) <= λ·p(x)
    hidden_size: int  # H of the draft model
    draft_model: str  # identity of the draft model (HFCausalLM.name)
    metadata: dict[str, Any] = field(default_factory=dict)  # training stats, AUC, η_FP/η_TP on validation, ...
    uses_hidden = True  # not a field: the `StopRule` attribute (its features read the draft's hidden state)

    def __post_init__(self) -> None:
        check_features(self.features)
        expected = feature_size(self.features, self.hidden_size)
        assert self.weight.shape == (expected,), f"weight must be [{expected}], got {tuple(self.weight.shape)}"

    def feature_vector(self, hidden: torch.Tensor, q_row: torch.Tensor, token: int, position: int) -> torch.Tensor:
        """Return the features `[F]` of one drafted token.

        hidden: [H] draft hidden state at the last context position; q_row: [V] the processed draft law the token
        was sampled from; token: the drafted id; position: its 1-based index within the current run.
        """
        if hidden.shape != (self.hidden_size,):
            raise ValueError(f"hidden state must be [{self.hidden_size}], got {tuple(hidden.shape)}")
        if self.features == "context":
            return hidden.to(torch.float64)
        q_x = q_row[token].to(torch.float64).view(1)
        extra = token_features(q_x, entropy(q_row).view(1), torch.tensor([float(position)]))
        return torch.cat([hidden.to(torch.float64), extra[0]])

    def score(self, hidden: torch.Tensor, q_row: torch.Tensor, token: int, position: int) -> float:
        """Return the probability (sigmoid of the logit) that the drafted token is acceptable."""
        return _sigmoid(float(self.weight @ self.feature_vector(hidden, q_row, token, position)) + self.bias)

    def score_features(self, features: torch.Tensor) -> torch.Tensor:
        """Return the scores `[N]` float64 of a feature matrix `[N, F]`."""
        return torch.sigmoid(features.to(torch.float64) @ self.weight + self.bias)

    def accepts(self, score: float) -> bool:
        """Return whether a score is accepted: score ≥ τ (§3.1 breaks the run when score < τ)."""
        return score >= self.threshold

    def accept_mask(self, hidden: torch.Tensor, q_row: torch.Tensor, position: int) -> torch.Tensor:
        """Return `[V]` float64: 1 where the verifier accepts token v at this position (score ≥ τ), else 0 — its
        decision for every token the draft could have drawn from `q_row`, which fixes the position's output law."""
        if hidden.shape != (self.hidden_size,):
            raise ValueError(f"hidden state must be [{self.hidden_size}], got {tuple(hidden.shape)}")
        q = q_row.to(torch.float64)
        base = float(self.weight[: self.hidden_size] @ hidden.to(torch.float64)) + self.bias
        if self.features == "context":
            return torch.full_like(q, float(self.accepts(_sigmoid(base))))
        extra = token_features(q, entropy(q).expand_as(q), torch.full_like(q, float(position)))  # [V, 4]
        scores = torch.sigmoid(base + extra @ self.weight[self.hidden_size :])
        return (scores >= self.threshold).to(torch.float64)

    def with_threshold(self, tau: float) -> LearnedVerifier:
        """Return a copy with threshold τ."""
        return replace(self, threshold=float(tau))

    def save(self, path: str | Path) -> None:
        """Write the verifier as one safetensors file (w, b, and the metadata as JSON strings)."""
        from safetensors.torch import save_file

        header = {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "features": self.features,
            "threshold": repr(float(self.threshold)),
            "lam": repr(float(self.lam)),
            "hidden_size": str(int(self.hidden_size)),
            "draft_model": self.draft_model,
            "metadata": json.dumps(self.metadata),
        }
        tensors = {
            "weight": self.weight.to(torch.float64).contiguous(),
            "bias": torch.tensor([float(self.bias)], dtype=torch.float64),
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=header)

    @classmethod
    def load(
        cls, path: str | Path, expected_draft: str | None = None, expected_hidden_size: int | None = None
    ) -> LearnedVerifier:
        """Return the verifier saved at `path`; raise VerifierFileError naming the problem (missing file, not a
        safetensors file, a missing field, or a verifier made for another draft model or hidden size)."""
        path = Path(path)
        if not path.is_file():
            raise VerifierFileError(f"verifier file not found: {path}")
        header, tensors = _read(path)
        for name in REQUIRED_FIELDS:
            if name not in header:
                raise VerifierFileError(f"verifier file {path} lacks the metadata field {name!r}")
        if header["format"] != FILE_FORMAT:
            raise VerifierFileError(f"{path} is not a verispec verifier file (format {header['format']!r})")
        if header["version"] != FILE_VERSION:
            raise VerifierFileError(f"verifier file {path} has version {header['version']!r}; this verispec reads "
                                    f"version {FILE_VERSION!r}")
        for name in ("weight", "bias"):
            if name not in tensors:
                raise VerifierFileError(f"verifier file {path} lacks the tensor {name!r}")
        try:
            features, hidden_size = header["features"], int(header["hidden_size"])
            threshold, lam = float(header["threshold"]), float(header["lam"])
            metadata = json.loads(header["metadata"])
            check_features(features)
            if not isinstance(metadata, dict):
                raise TypeError(f"metadata is a {type(metadata).__name__}, not a mapping")
        except (ValueError, TypeError) as exc:
            raise VerifierFileError(f"verifier file {path} has an invalid metadata field: {exc}") from exc
        draft = header["draft_model"]
        if expected_draft is not None and draft != expected_draft:
            raise VerifierFileError(f"verifier {path} was made for draft model {draft!r} but is being loaded for "
                                    f"draft model {expected_draft!r}")
        if expected_hidden_size is not None and hidden_size != expected_hidden_size:
            raise VerifierFileError(f"verifier {path} was made for hidden size {hidden_size} (draft {draft!r}) but "
                                    f"is being loaded for hidden size {expected_hidden_size}")
        weight, bias = tensors["weight"].to(torch.float64), tensors["bias"].to(torch.float64).view(-1)
        if weight.shape != (feature_size(features, hidden_size),) or bias.numel() != 1:
            raise VerifierFileError(f"verifier file {path} has weight {tuple(weight.shape)} and bias "
                                    f"{tuple(bias.shape)}; {features!r} features on hidden size {hidden_size} need "
                                    f"[{feature_size(features, hidden_size)}] and [1]")
        return cls(weight, float(bias[0]), features, threshold, lam, hidden_size, draft, metadata)


def _read(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Return (header metadata, tensors) of a safetensors file, or raise VerifierFileError if it is not one."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:  # safetensors raises its own error types (and OSError) for damaged files
        raise VerifierFileError(f"verifier file {path} is not a readable safetensors file (corrupt or truncated?): "
                                f"{exc}") from exc
    return header, tensors
