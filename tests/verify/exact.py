"""Exact enumeration of speculative rounds on tabular models, shared by the verifier tests.

A round drafts one block (single path) or K i.i.d. paths, verifies them with a verifier's exact law, and emits
x_1..x_τ, y. `speculative_law` chains rounds until n tokens are out, enumerating every draft and every outcome.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import product

import torch

from verispec.models.tabular import TabularLM
from verispec.verify import BlockLaw, MultiPathResult


def block_inputs(target: TabularLM, draft: TabularLM, context: list[int], block: tuple[int, ...]):
    """Return (draft_tokens [γ], q [γ, V], p [γ+1, V]) for a draft block after `context`."""
    prefixes = [context + list(block[:i]) for i in range(len(block) + 1)]
    q = torch.stack([draft.conditional(pre) for pre in prefixes[:-1]]) if block else torch.empty(0, draft.vocab_size)
    p = torch.stack([target.conditional(pre) for pre in prefixes])
    return torch.tensor(block, dtype=torch.long), q.to(torch.float64), p


def paths_inputs(target: TabularLM, draft: TabularLM, context: list[int], paths: tuple[tuple[int, ...], ...]):
    """Return (draft_tokens [K, γ], q [K, γ, V], p [K, γ+1, V]) for K draft paths after `context`."""
    rows = [block_inputs(target, draft, context, path) for path in paths]
    tokens = torch.stack([r[0] for r in rows]) if paths[0] else torch.empty(len(paths), 0, dtype=torch.long)
    return tokens, torch.stack([r[1] for r in rows]), torch.stack([r[2] for r in rows])


def draft_tuples(draft: TabularLM, context: list[int], gamma: int, k: int):
    """Yield (paths, probability) for every K-tuple of i.i.d. draft paths of length γ after `context`."""
    blocks = list(product(range(draft.vocab_size), repeat=gamma))
    block_prob = {b: draft.sequence_prob(context, b) for b in blocks}
    for paths in product(blocks, repeat=k):
        prob = 1.0
        for path in paths:
            prob *= block_prob[path]
        yield paths, prob


def round_law(law_fn, target, draft, context: list[int], gamma: int, k: int | None = None) -> dict:
    """Return {emitted tokens: probability} for one round with draft length γ.

    k = None: `law_fn(draft_tokens [γ], q, p) -> BlockLaw` (single path).
    k = K: `law_fn(draft_tokens [K, γ], q, p)` over K i.i.d. paths returns (selected path, BlockLaw) as GBV does,
    or {MultiPathResult: probability} as the tree walks do.
    """
    law: dict = defaultdict(float)
    for paths, prob in draft_tuples(draft, context, gamma, 1 if k is None else k):
        if k is None:
            outcomes = block_outcomes(0, law_fn(*block_inputs(target, draft, context, paths[0])))
        else:
            outcomes = law_fn(*paths_inputs(target, draft, context, paths))
            outcomes = block_outcomes(*outcomes) if isinstance(outcomes, tuple) else outcomes
        for outcome, outcome_prob in outcomes.items():
            if outcome_prob != 0.0:
                law[tuple(paths[outcome.path][: outcome.accepted]) + (outcome.token,)] += prob * outcome_prob
    return law


def block_outcomes(path: int, law: BlockLaw) -> dict[MultiPathResult, float]:
    """Return {(path, τ, y): probability} for a single-path law verified on path `path`."""
    joint = law.joint()  # [γ+1, V]
    return {
        MultiPathResult(path, tau, y): float(joint[tau, y])
        for tau, y in product(range(law.gamma + 1), range(joint.shape[1]))
    }


def speculative_law(law_fn, target, draft, context: list[int], gamma: int, n: int, k: int | None = None) -> dict:
    """Return the exact law of the first `n` tokens output by rounds of `law_fn`, enumerating every draft.

    Each round drafts min(gamma, tokens still needed - 1) tokens, as the engine does near max_new_tokens; `k` as
    in `round_law`. Laws of later rounds are memoised by their context.
    """
    memo: dict[tuple[int, ...], dict] = {}

    def rest(ctx: tuple[int, ...], m: int) -> dict:
        if m == 0:
            return {(): 1.0}
        if ctx not in memo:
            law: dict = defaultdict(float)
            for emitted, prob in round_law(law_fn, target, draft, list(ctx), min(gamma, m - 1), k).items():
                for tail, tail_prob in rest(ctx + emitted, m - len(emitted)).items():
                    law[emitted + tail] += prob * tail_prob
            memo[ctx] = law
        return memo[ctx]

    return dict(rest(tuple(context), n))


def expected_accepted(law_fn, target, draft, context: list[int], gamma: int, k: int | None = None) -> float:
    """Return E[τ], the expected number of accepted draft tokens in one round (block efficiency − 1)."""
    law = round_law(law_fn, target, draft, context, gamma, k)
    return sum((len(emitted) - 1) * prob for emitted, prob in law.items())


def point_mass_inputs(target: TabularLM, context: list[int], paths: list[list[int]]):
    """Return (draft_tokens [K, γ], q [K, γ, V] one-hot, p [K, γ+1, V]) for fixed candidate paths after `context`."""
    tokens = torch.tensor(paths, dtype=torch.long).view(len(paths), -1)
    q = torch.zeros(*tokens.shape, target.vocab_size, dtype=torch.float64).scatter_(2, tokens.unsqueeze(-1), 1.0)
    p = torch.stack([
        torch.stack([target.conditional(context + list(path[:i])) for i in range(tokens.shape[1] + 1)])
        for path in paths
    ])
    return tokens, q, p


def fixed_draft_law(law_fn, target, propose, context: list[int], gamma: int, n: int, multipath: bool) -> dict:
    """Return the exact law of the first `n` tokens output by rounds whose draft is a deterministic function of the
    context: `propose(context, γ)` -> candidate paths of equal length ≤ γ ([] or [[]]: nothing drafted), each token
    with a point-mass q. `law_fn` as in `round_law` (single path: a BlockLaw on path 0; multipath: the K paths)."""
    memo: dict[tuple[int, ...], dict] = {}

    def round_outcomes(ctx: list[int], g: int) -> dict:
        paths = propose(ctx, g) or [[]]
        inputs = point_mass_inputs(target, ctx, paths)
        if not multipath:
            outcomes = block_outcomes(0, law_fn(inputs[0][0], inputs[1][0], inputs[2][0]))
        else:
            outcomes = law_fn(*inputs)
            outcomes = block_outcomes(*outcomes) if isinstance(outcomes, tuple) else outcomes
        law: dict = defaultdict(float)
        for outcome, prob in outcomes.items():
            if prob != 0.0:
                law[tuple(paths[outcome.path][: outcome.accepted]) + (outcome.token,)] += prob
        return law

    def rest(ctx: tuple[int, ...], m: int) -> dict:
        if m == 0:
            return {(): 1.0}
        if ctx not in memo:
            law: dict = defaultdict(float)
            for emitted, prob in round_outcomes(list(ctx), min(gamma, m - 1)).items():
                for tail, tail_prob in rest(ctx + emitted, m - len(emitted)).items():
                    law[emitted + tail] += prob * tail_prob
            memo[ctx] = law
        return memo[ctx]

    return dict(rest(tuple(context), n))
