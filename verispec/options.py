"""Command-line options shared by the subcommands that load a model pair and decode (generate, serve, bench, ...):
ModelSpec's (`add_model_options`) and DecodeConfig's (`add_decode_options`), their defaults read from those types."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from verispec.config import MULTIPATH_PATHS, SETTINGS, DecodeConfig
from verispec.models.fastpath import LINEAR_BACKENDS
from verispec.models.spec import MODEL_SETTINGS, ModelSpec
from verispec.sampling import SamplingConfig

T = TypeVar("T")


def add_model_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, verifier: bool = True) -> None:
    """Add ModelSpec's options, which choose and load the models (--target, --draft, dtypes, --device, linear
    backends and, with `verifier`, SPRINTER's --verifier); their defaults are read from ModelSpec."""
    d = ModelSpec()
    parser.add_argument("--target", default=d.target,
                        help="target model: hub id, folder, .gguf file or llamacpp:FILE.gguf (default: embedded)")
    parser.add_argument("--draft", default=d.draft,
                        help="draft model: hub id, folder, .gguf file or llamacpp:FILE.gguf (default: embedded)")
    parser.add_argument("--dtype", default=d.dtype,
                        help="float32 | bfloat16 | float16 | float64 (default: %(default)s)")
    parser.add_argument("--draft-dtype", default=d.draft_dtype,
                        help="the draft model's dtype, when it differs from --dtype (e.g. bfloat16: a cheaper draft; "
                             "lossless methods keep the target's law)")
    parser.add_argument("--device", default=d.device,
                        help="torch device of both models: cpu, cuda, cuda:1, mps, ... (default: %(default)s)")
    parser.add_argument("--linear-backend", default=d.linear_backend, choices=LINEAR_BACKENDS,
                        help="CPU linear layers: int8 weights with per-token int8 activations (fbgemm); int4: the "
                             "layers of a 4-bit GGUF kept in 4 bits (verispec's kernel, built once), the rest int8; "
                             "oneDNN with packed float weights; or transformers' own (default: %(default)s: "
                             "verispec.models.fastpath.resolve_linear_backend); int4-rounded: every layer in 4 bits, "
                             "those on no 4-bit grid rounded (an approximation)")
    parser.add_argument("--draft-linear-backend", default=d.draft_linear_backend, choices=LINEAR_BACKENDS,
                        help="the draft's linear backend, when it differs (default: --linear-backend's, except "
                             "int4-rounded for an int4 target; lossless methods keep the target's law)")
    if verifier:
        parser.add_argument("--verifier", default=d.verifier,
                            help="SPRINTER: the learned verifier file (default: the one shipped for the draft)")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """Return the ModelSpec the options of `add_model_options` describe."""
    return ModelSpec(**{name: getattr(args, name) for name in MODEL_SETTINGS if hasattr(args, name)})


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Return the dataclass `cls` (a command's config with a ModelSpec field `models`) filled from `args`: each field
    from the option of its name, `models` from the model options (`model_spec`)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name != "models"}
    return cls(**given, models=model_spec(args))


def add_decode_options(parser: argparse.ArgumentParser) -> None:
    """Add the decode settings; their defaults are read from DecodeConfig and SamplingConfig."""
    from verispec.methods import METHODS

    parser.add_argument("--method", default=DecodeConfig.method,
                        help=f"one of {', '.join(METHODS)}; a lossy rule may carry its knobs, e.g. "
                             "typical:epsilon=0.09,delta=0.3, margin:delta=0.5, fuzzy:threshold=0.1, "
                             "fly:entropy=0.3,window=3")
    parser.add_argument("--gamma", type=int, default=DecodeConfig.gamma, help="draft tokens per round")
    parser.add_argument("--temperature", type=float, default=SamplingConfig.temperature, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=SamplingConfig.top_k, help="0 = off")
    parser.add_argument("--top-p", type=float, default=SamplingConfig.top_p, help="1 = off")
    parser.add_argument("--max-new-tokens", type=int, default=DecodeConfig.max_new_tokens)
    parser.add_argument("--seed", type=int, default=DecodeConfig.seed)
    parser.add_argument("--paths", type=int, default=DecodeConfig.paths,
                        help=f"K >= 2 draft paths of the multi-path methods (default: {MULTIPATH_PATHS} for those, "
                             f"1 for the others)")
    parser.add_argument("--tau", type=float, default=DecodeConfig.tau, help="SPRINTER: verifier threshold")
    parser.add_argument("--cap", type=int, default=DecodeConfig.cap, help="SPRINTER: longest draft run")
    from verispec.drafters import DRAFTERS

    parser.add_argument("--drafter", default=DecodeConfig.drafter,
                        help=f"what proposes the draft: {', '.join(DRAFTERS)} (default: hybrid for sd and bv, model "
                             f"for the other methods)")
    parser.add_argument("--adaptive-gamma", action=argparse.BooleanOptionalAction, default=DecodeConfig.adaptive_gamma,
                        help="sd, bv: the draft model drafts 0..gamma tokens per round, as many as its recent "
                             "acceptance makes pay (lossless; see docs/algorithms.md §1.4)")
    parser.add_argument("--keyed-draws", action=argparse.BooleanOptionalAction, default=DecodeConfig.keyed_draws,
                        help="ar, sd: draw every token by a race on noise keyed by the seed and its position, so "
                             "that a seed gives the same tokens whatever the method, drafter, draft length or batch "
                             "(lossless; sd keeps a drafted token less often at T > 0: docs/algorithms.md §0.1)")
    parser.add_argument("--ngram-min", type=int, default=DecodeConfig.ngram_min,
                        help="prompt lookup (ngram, hybrid): the shortest context suffix looked up")
    parser.add_argument("--ngram-max", type=int, default=DecodeConfig.ngram_max,
                        help="prompt lookup (ngram, hybrid): the longest context suffix looked up")
    parser.add_argument("--ngram-gamma", type=int, default=DecodeConfig.ngram_gamma,
                        help="prompt lookup (ngram, hybrid): the most tokens a lookup round drafts (default: 16 with "
                             "the adaptive gamma, which chooses each lookup round's length up to it; gamma without)")
    parser.add_argument("--hybrid-catchup", type=float, default=DecodeConfig.hybrid_catchup,
                        help="hybrid: the draft model drafts only when the tokens its cache lacks are at most this "
                             "many times the tokens still to generate; longer prompts are drafted by lookup alone "
                             f"(default: {DecodeConfig.hybrid_catchup:g}; inf: always)")
    parser.add_argument("--draft-vocab", type=int, default=DecodeConfig.draft_vocab,
                        help="N: the draft head covers only the N most frequent tokens, plus the tokens of the "
                             "prompt and the answer so far (default: all)")
    parser.add_argument("--draft-confidence", type=float, default=DecodeConfig.draft_confidence,
                        help="h: a draft path ends after a token the draft drew with probability below h (sd, bv; "
                             "T > 0; lossless: only the draft length changes; default: never)")
    parser.add_argument("--prompt-chunk", type=int, default=DecodeConfig.prompt_chunk, metavar="N",
                        help="read the prompt in passes of at most N tokens (a batched server's long prompts then "
                             "run beside the other requests' rounds, measured slower than one pass; 0 or not given: "
                             "one pass)")


class _LogitBias(argparse.Action):
    """Collect `ID=BIAS` pairs into the dict `DecodeConfig.logit_bias` takes (ranges are checked by it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        bias = dict(getattr(namespace, self.dest) or {})
        for pair in values:  # nargs="+": a list of strings
            token, sep, amount = pair.partition("=")
            try:
                if not sep:
                    raise ValueError(pair)
                bias[int(token)] = float(amount)
            except ValueError:
                parser.error(f"{option_string}: expected ID=BIAS (a token id and a number), got {pair!r}")
        setattr(namespace, self.dest, bias)


def add_processor_options(parser: argparse.ArgumentParser) -> None:
    """Add OpenAI's logit processors and log-probabilities (`DecodeConfig`'s logit_bias, presence_penalty,
    frequency_penalty, logprobs)."""
    parser.add_argument("--logit-bias", nargs="+", action=_LogitBias, default=DecodeConfig.logit_bias,
                        metavar="ID=BIAS", help="add BIAS (-100..100) to token ID's logit, e.g. --logit-bias 13=-100 "
                        "42=5 (both models, before temperature; every method stays as lossless as it was)")
    parser.add_argument("--presence-penalty", type=float, default=DecodeConfig.presence_penalty,
                        help="-2..2: subtracted from the logit of every token generated so far (default: 0)")
    parser.add_argument("--frequency-penalty", type=float, default=DecodeConfig.frequency_penalty,
                        help="-2..2: times how often a token was generated so far, subtracted (default: 0)")
    parser.add_argument("--logprobs", type=int, default=DecodeConfig.logprobs, metavar="K",
                        help="report each token's log-probability and the K (0..20) likeliest tokens at its "
                             "position (on standard error, or in the --json output)")


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """Return the DecodeConfig the options of `add_decode_options` describe. `--method` takes the bench's variant
    syntax too (e.g. typical:epsilon=0.3,delta=0.09, `verispec.variants`): its settings win over the options."""
    from verispec.methods import METHODS
    from verispec.variants import parse_method

    variant = parse_method(args.method, set(METHODS))
    settings = {name: getattr(args, name) for name in SETTINGS if name != "method" and hasattr(args, name)}
    if settings.get("prompt_chunk") == 0:
        settings["prompt_chunk"] = None  # 0 on the command line: the whole prompt in one pass
    return DecodeConfig(method=variant.name).with_settings(**(settings | variant.overrides))
