"""`verispec verifier collect|train|eval`: SPRINTER's verifier pipeline (docs/algorithms.md §3.2, §3.8).

Each subcommand parses into a typed config (whose defaults it reads, never restates) and calls the library.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from verispec.bench.cli import add_prompt_options, add_sampling_options
from verispec.options import add_model_options, config_from_args

DEFAULT_DATA = "results/verifier_data.safetensors"
DEFAULT_VERIFIER = "results/verifier.safetensors"


def _optional_float(text: str) -> float | None:
    """Parse a float option that also takes "none"."""
    return None if text.lower() == "none" else float(text)


def _load_data(paths: list[str]):
    from verispec.learned.collect import VerifierData, load_dataset

    return VerifierData.concat([load_dataset(path) for path in paths])


def cmd_collect(args: argparse.Namespace) -> int:
    """Collect labelled draft tokens on training prompts and save them."""
    from verispec.learned.collect import CollectConfig, collect_from_config

    config = config_from_args(CollectConfig, args)
    data = collect_from_config(config, args.out, progress=not args.no_progress)
    m = data.manifest
    print(f"{m['rows']} rows from {m['prompts']} prompts ({m['positives']} acceptable at lambda={m['lam']}), "
          f"draft {m['draft_model']} (hidden {m['hidden_size']}), target {m['target_model']}")
    print(f"data: {args.out}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train, calibrate and save a verifier; print its validation metrics."""
    from verispec.learned.train import TrainConfig, train_verifier

    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    verifier, report = train_verifier(_load_data(args.data), config)
    verifier.save(args.out)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        v = report.validation
        print(f"{config.features} verifier, lambda={verifier.lam}: {report.train_rows} train / {report.val_rows} "
              f"validation rows, {report.epochs_run} epochs (best {report.best_epoch})")
        print(f"validation: AUC {v['auc']:.3f}, accuracy {v['accuracy']:.3f} (majority {v['majority_accuracy']:.3f}), "
              f"tau {report.threshold:.4f}: eta_FP {v['eta_fp']:.3f}, eta_TP {v['eta_tp']:.3f}, "
              f"accept rate {v['accept_rate']:.3f}")
    print(f"verifier: {args.out}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a saved verifier on labelled data: ROC/AUC, operating point, per-position rates, predictions."""
    from verispec.learned.evaluate import evaluate_verifier
    from verispec.learned.verifier import LearnedVerifier

    data = _load_data(args.data)
    verifier = LearnedVerifier.load(args.verifier, expected_draft=data.manifest.get("draft_model"),
                                    expected_hidden_size=data.hidden_size)
    if args.threshold is not None:
        verifier = verifier.with_threshold(args.threshold)
    report = evaluate_verifier(verifier, data, lam=args.lam, cap=args.cap)
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    r, pred = report.rates, report.predicted
    print(f"{r['n']} rows, lambda={report.lam}, tau={report.threshold:.4f}: AUC {report.auc:.3f}, accuracy "
          f"{r['accuracy']:.3f} (majority baseline {r['majority_accuracy']:.3f})")
    print(f"eta_FP {r['eta_fp']:.3f}  eta_TP {r['eta_tp']:.3f}  accept rate {r['accept_rate']:.3f}  "
          f"label rate {r['label_rate']:.3f}  error autocorrelation {report.error_autocorrelation:.3f}")
    print(f"predicted (i.i.d., cap {args.cap}): E[T] {pred['expected_run_length']:.2f}, E[N] "
          f"{pred['expected_tokens_per_round']:.2f}, TV to target per drafted position {pred['predicted_tv']:.4f} "
          f"(eta_FP*TV(p,q) {pred['predicted_tv_mixture']:.4f})")
    print("position    n  accept  eta_FP  eta_TP")
    for row in report.per_position:
        rates = f"{row['accept_rate']:.3f}   {row['eta_fp']:.3f}   {row['eta_tp']:.3f}"
        print(f"{row['position']:8d} {row['n']:4d}  {rates}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `verifier collect|train|eval` to the `verispec` command's subparsers."""
    from verispec.learned.collect import CollectConfig
    from verispec.learned.train import TrainConfig

    verifier = sub.add_parser("verifier", help="SPRINTER's learned verifier: collect data, train, evaluate")
    steps = verifier.add_subparsers(dest="verifier_command", required=True)

    c = CollectConfig()
    p = steps.add_parser("collect", help="label draft tokens with the target on training prompts (never eval ones)")
    add_model_options(p, verifier=False)
    add_prompt_options(p, c)
    p.add_argument("--steps", type=int, default=c.steps, help="drafted tokens per prompt (default: %(default)s)")
    p.add_argument("--lam", type=float, default=c.lam, help="label q(x) <= lam*p(x) (default: %(default)s)")
    add_sampling_options(p, c)
    p.add_argument("--seed", type=int, default=c.seed)
    p.add_argument("--cap", type=int, default=c.cap, help="positions restart after this many (default: %(default)s)")
    p.add_argument("--block", type=int, default=c.block, help="tokens drafted per target pass (default: %(default)s)")
    p.add_argument("--out", default=DEFAULT_DATA, help="where to write the data (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_collect)

    t = TrainConfig()
    p = steps.add_parser("train", help="train a logistic-regression verifier and calibrate its threshold")
    p.add_argument("--data", nargs="+", default=[DEFAULT_DATA], help="data files from `collect` (default: %(default)s)")
    p.add_argument("--features", default=t.features, choices=["context", "token"], help="(default: %(default)s)")
    p.add_argument("--lam", type=_optional_float, default=t.lam, help="relabel with this lambda (default: the data's)")
    p.add_argument("--class-weight", default=t.class_weight, choices=["none", "balanced"])
    p.add_argument("--val-fraction", type=float, default=t.val_fraction, help="share of prompts held out")
    p.add_argument("--epochs", type=int, default=t.epochs)
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--batch-size", type=int, default=t.batch_size)
    p.add_argument("--patience", type=int, default=t.patience, help="early stopping (default: %(default)s)")
    p.add_argument("--l2", type=float, default=t.l2)
    p.add_argument("--seed", type=int, default=t.seed)
    p.add_argument("--target-fp-rate", type=_optional_float, default=t.target_fp_rate,
                   help="calibrate tau to this eta_FP on validation (default: tau = 0.5)")
    p.add_argument("--target-run-length", type=_optional_float, default=t.target_run_length,
                   help="or to this expected run length E[T]")
    p.add_argument("--cap", type=int, default=t.cap, help="SPRINTER's cap (default: %(default)s)")
    p.add_argument("--out", default=DEFAULT_VERIFIER, help="verifier file (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the whole training report as JSON")
    p.set_defaults(func=cmd_train)

    p = steps.add_parser("eval", help="ROC/AUC, eta_FP/eta_TP, per-position rates and predictions on held-out data")
    p.add_argument("--verifier", default=DEFAULT_VERIFIER, help="(default: %(default)s)")
    p.add_argument("--data", nargs="+", required=True, help="held-out data files from `collect`")
    p.add_argument("--lam", type=_optional_float, default=None, help="label lambda (default: the verifier's)")
    p.add_argument("--threshold", type=_optional_float, default=None, help="override tau")
    p.add_argument("--cap", type=int, default=t.cap, help="for the E[T], E[N] predictions (default: %(default)s)")
    p.add_argument("--out", default=None, help="also write the report JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)
