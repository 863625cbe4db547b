"""SPRINTER's learned verifier (docs/algorithms.md §3.2): collect labelled draft tokens, train, calibrate, evaluate.

Pipeline: `collect` (draft + target over training prompts) -> `train_verifier` (logistic regression, BCE) ->
`calibrate` (the threshold τ) -> `LearnedVerifier.save/load` (one safetensors file) -> `evaluate_verifier`.
"""

from verispec.learned.calibrate import calibrate
from verispec.learned.collect import VerifierData, collect, load_dataset, save_dataset
from verispec.learned.evaluate import EvalReport, evaluate_verifier, rates_at, roc_auc, roc_curve
from verispec.learned.train import TrainConfig, TrainReport, train_verifier
from verispec.learned.verifier import LearnedVerifier, VerifierFileError

__all__ = [
    "EvalReport",
    "LearnedVerifier",
    "TrainConfig",
    "TrainReport",
    "VerifierData",
    "VerifierFileError",
    "calibrate",
    "collect",
    "evaluate_verifier",
    "load_dataset",
    "rates_at",
    "roc_auc",
    "roc_curve",
    "save_dataset",
    "train_verifier",
]
