"""Training SPRINTER's verifier: logistic regression with BCE (docs/algorithms.md §3.2), then τ calibration.

Differences from the released `train.py` (§3.2), all options: the validation split is by prompt (rows of one
trajectory are correlated, so a row split would leak), features are standardised (folded back into w and b at the
end), class weighting is available, and the checkpoint kept is the one with the best validation loss (the code:
best test accuracy) with early stopping.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.learned.calibrate import calibrate
from verispec.learned.collect import VerifierData, training_fingerprints
from verispec.learned.evaluate import rates_at, roc_auc
from verispec.learned.verifier import FEATURE_SETS, LearnedVerifier, feature_matrix


@dataclass
class TrainConfig:
    """Settings of `train_verifier`; the CLI reads its defaults from here."""

    features: str = "context"  # "context" (the released design) or "token" (adds q(x), H(q), position; §3.8)
    lam: float | None = None  # λ of the labels q(x) <= λ p(x); None: the λ the data was collected with
    class_weight: str = "none"  # "none" (as released) or "balanced" (each class weighs half of the loss)
    val_fraction: float = 0.3  # share of the prompts held out (the released split: 70/30 of rows)
    epochs: int = 50  # at most
    lr: float = 1e-2  # Adam, on standardised features
    batch_size: int = 256
    patience: int = 5  # stop after this many epochs without a better validation loss
    l2: float = 1e-4  # weight decay on w (not b)
    seed: int = 0  # seeds the split and the minibatch order (one torch.Generator)
    target_fp_rate: float | None = None  # calibrate τ to this η_FP on validation (calibrate.py)
    target_run_length: float | None = None  # or to this E[T]
    cap: int = 20  # SPRINTER's cap C, for the run-length rule and predictions

    def __post_init__(self) -> None:
        if self.features not in FEATURE_SETS:
            raise ConfigError(f"features must be one of {', '.join(FEATURE_SETS)}, got {self.features!r}")
        if self.class_weight not in ("none", "balanced"):
            raise ConfigError(f"class_weight must be 'none' or 'balanced', got {self.class_weight!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.epochs < 1 or self.batch_size < 1 or self.patience < 1 or self.lr <= 0:
            raise ConfigError("epochs, batch_size and patience must be >= 1 and lr > 0")


@dataclass
class TrainReport:
    """What training did and how the result does on the validation prompts."""

    train_rows: int
    val_rows: int
    train_prompts: list[int]
    val_prompts: list[int]
    epochs_run: int
    best_epoch: int
    history: list[dict[str, float]]  # per epoch: train_loss, val_loss
    threshold: float
    validation: dict[str, float]  # auc + rates_at(τ): eta_fp, eta_tp, accuracy, majority_accuracy, ...
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-able dict."""
        return asdict(self)


def split_by_prompt(prompt_id: torch.Tensor, val_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Return a boolean mask `[N]` of the validation rows: all rows of a random share `val_fraction` of prompts."""
    prompts = torch.unique(prompt_id)
    if val_fraction == 0.0:
        return torch.zeros_like(prompt_id, dtype=torch.bool)
    if prompts.numel() < 2:
        raise ConfigError(f"the validation split is by prompt and needs >= 2 prompts; the data has {prompts.numel()}")
    n_val = min(prompts.numel() - 1, max(1, round(val_fraction * prompts.numel())))
    val = prompts[torch.randperm(prompts.numel(), generator=generator)[:n_val]]
    return torch.isin(prompt_id, val)


def _weights(labels: torch.Tensor, balanced: bool) -> torch.Tensor:
    """Return per-row loss weights `[N]`: 1, or n / (2·n_class) so that each class carries half of the loss."""
    if not balanced:
        return torch.ones_like(labels)
    positives = labels.sum().clamp_min(1.0)
    negatives = (labels.numel() - labels.sum()).clamp_min(1.0)
    return torch.where(labels > 0.5, labels.numel() / (2 * positives), labels.numel() / (2 * negatives))


def train_verifier(
    data: VerifierData, config: TrainConfig | None = None, **options: Any
) -> tuple[LearnedVerifier, TrainReport]:
    """Return (the trained, calibrated verifier, its report). `options` override fields of `config`
    (e.g. `train_verifier(data, features="token", lam=1.2)`)."""
    config = TrainConfig(**{**(asdict(config) if config else {}), **options})
    if len(data) == 0:
        raise ConfigError("no training rows: collect some data first")
    generator = torch.Generator().manual_seed(config.seed)
    lam = float(config.lam if config.lam is not None else data.manifest.get("lam", 1.0))
    labels = data.labels(config.lam).to(torch.float32)  # [N]
    x = feature_matrix(config.features, data.hidden, data.q_x, data.q_entropy, data.position)  # [N, F] float64
    val_mask = split_by_prompt(data.prompt_id, config.val_fraction, generator)
    train_mask = ~val_mask
    # 1. standardise with the training rows' statistics (a constant feature keeps scale 1)
    mean = x[train_mask].mean(0)
    std = x[train_mask].std(0, correction=0)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    z = ((x - mean) / std).to(torch.float32)
    balanced = config.class_weight == "balanced"
    z_train, y_train, w_train = z[train_mask], labels[train_mask], _weights(labels[train_mask], balanced)
    z_val, y_val, w_val = z[val_mask], labels[val_mask], _weights(labels[val_mask], balanced)
    # 2. logistic regression with BCE and Adam (§3.2), minibatches in a seeded order, early stopping on val loss
    weight = torch.zeros(z.shape[1], requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([{"params": [weight], "weight_decay": config.l2}, {"params": [bias]}], lr=config.lr)
    loss_fn = torch.nn.functional.binary_cross_entropy_with_logits
    best = (float("inf"), weight.detach().clone(), bias.detach().clone(), 0)
    history, stale = [], 0
    for epoch in range(1, config.epochs + 1):
        order = torch.randperm(z_train.shape[0], generator=generator)
        for start in range(0, order.numel(), config.batch_size):
            rows = order[start: start + config.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(z_train[rows] @ weight + bias, y_train[rows], weight=w_train[rows])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            train_loss = float(loss_fn(z_train @ weight + bias, y_train, weight=w_train))
            val_loss = float(loss_fn(z_val @ weight + bias, y_val, weight=w_val)) if y_val.numel() else train_loss
        history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss})
        if val_loss < best[0] - 1e-7:
            best, stale = (val_loss, weight.detach().clone(), bias.detach().clone(), epoch), 0
        else:
            stale += 1
            if stale >= config.patience and y_val.numel():
                break
    # 3. fold the standardisation into raw-feature weights: w·(x − m)/s + b = (w/s)·x + (b − Σ w·m/s)
    w_std, b_std = best[1].to(torch.float64), float(best[2])
    raw_weight = w_std / std
    raw_bias = b_std - float((w_std * mean / std).sum())
    verifier = LearnedVerifier(raw_weight, raw_bias, config.features, 0.5, lam, data.hidden_size,
                               str(data.manifest.get("draft_model", "unknown")))
    # 4. calibrate τ and measure on the validation prompts (the training rows if there are none)
    held = val_mask if bool(val_mask.any()) else train_mask
    scores = verifier.score_features(x[held])
    tau = calibrate(scores, labels[held], config.target_fp_rate, config.target_run_length, config.cap)
    validation = {"auc": roc_auc(scores, labels[held]), **rates_at(scores, labels[held], tau)}
    prompts = lambda mask: sorted(int(v) for v in torch.unique(data.prompt_id[mask]))  # noqa: E731
    report = TrainReport(
        train_rows=int(train_mask.sum()), val_rows=int(val_mask.sum()), train_prompts=prompts(train_mask),
        val_prompts=prompts(val_mask), epochs_run=len(history), best_epoch=best[3], history=history, threshold=tau,
        validation=validation, config=asdict(config),
    )
    metadata = {
        "validation": validation,
        "training": {"train_rows": report.train_rows, "val_rows": report.val_rows, "epochs_run": report.epochs_run,
                     "best_epoch": report.best_epoch, "best_val_loss": best[0],
                     "train_label_rate": float(y_train.mean()) if y_train.numel() else None},
        "config": asdict(config),
        "data": {k: data.manifest.get(k) for k in ("target_model", "draft_model", "sampling", "rows", "lam", "cap")},
        "training_prompts": training_fingerprints(data.manifest),  # bench refuses to evaluate on these
    }
    return LearnedVerifier(raw_weight, raw_bias, config.features, tau, lam, data.hidden_size, verifier.draft_model,
                           metadata), report
