"""verispec's vLLM plugin without vLLM: the batch verifier's law, its layout, the proposer and the guards.

These run everywhere (no vLLM import); tests/vllm/test_through_vllm.py runs the same pieces inside vLLM.
"""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue
from verispec.errors import ConfigError
from verispec.verify.block import block_verify_law
from verispec.vllm import RULE_ENV, check_vllm_version, register
from verispec.vllm.proposer import NgramProposer
from verispec.vllm.rejection import PLACEHOLDER, RULES, expand_batch_to_tokens, verify_batch

V = 5


def rows(seed: int, n: int) -> torch.Tensor:
    """Return `n` random logits rows over V tokens."""
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 1.5


def one_round(rule, logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None, seed: int,
              bonus: int = V - 1) -> list[int]:
    """Return the tokens of one request's round: one request alone in the batch, sampled (not greedy)."""
    out = verify_batch(rule, torch.tensor(drafts, dtype=torch.int32), [len(drafts)], len(drafts), q, logits,
                       torch.tensor([[bonus]], dtype=torch.int32), torch.tensor([False]),
                       {0: torch.Generator().manual_seed(seed)})
    return [t for t in out[0].tolist() if t != PLACEHOLDER]


@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("with_q", [False, True], ids=["point-mass", "draft-probs"])
def test_round_law_is_the_targets(rule_name, with_q):
    """P(x1) = p0 and P(x2 | x1 = d1) = p1 (the target's law along the drafted path: here p1 whatever x1 is), for
    n-gram point masses (fixed drafts) and for a draft model's q (drafts drawn from it); chi-square at FALSE_ALARM."""
    logits = rows(1, 2)
    p = torch.softmax(logits, -1)
    q = torch.softmax(rows(2, 2), -1) if with_q else None
    draws = torch.Generator().manual_seed(7)
    runs, outs = 6000, []
    for seed in range(runs):
        drafts = [1, 3] if q is None else torch.multinomial(q, 1, generator=draws).view(-1).tolist()
        outs.append((drafts, one_round(RULES[rule_name], logits, drafts, q, seed)))
    first = Counter(out[0] for _, out in outs)
    assert chi_square_pvalue(first, {v: float(p[0, v]) for v in range(V)}) > FALSE_ALARM
    second = Counter(out[1] for drafts, out in outs if out[0] == drafts[0])
    assert chi_square_pvalue(second, {v: float(p[1, v]) for v in range(V)}) > FALSE_ALARM


def test_a_wrong_residual_is_caught():
    """A planted bug (the residual computed against a q the drafts did not come from) fails the same test."""
    logits = rows(1, 2)
    p = torch.softmax(logits, -1)

    def wrong(drafts, q, p_block):
        return block_verify_law(drafts, torch.full_like(q, 1.0 / V), p_block, use_kernel=False)

    first = Counter(one_round(wrong, logits, [1, 3], None, seed)[0] for seed in range(6000))
    assert chi_square_pvalue(first, {v: float(p[0, v]) for v in range(V)}) < FALSE_ALARM


def test_batch_layout_greedy_rows_and_empty_drafts():
    """Three requests in one batch: a greedy one (the argmax chain, then the bonus when all match), a sampled one
    with nothing drafted (the bonus alone), and a greedy one rejected at its first token."""
    logits = rows(3, 4)
    argmax = logits.argmax(-1).tolist()
    wrong_first = (argmax[3] + 1) % V
    drafts = torch.tensor(argmax[:3] + [wrong_first], dtype=torch.int32)
    out = verify_batch(RULES["bv"], drafts, [3, 0, 1], 3, None, logits,
                       torch.tensor([[4], [2], [0]], dtype=torch.int32), torch.tensor([True, False, True]), {})
    assert out.dtype == torch.int32 and out.shape == (3, 4)
    assert out[0].tolist() == argmax[:3] + [4]
    assert out[1].tolist() == [2, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]
    assert out[2].tolist() == [argmax[3], PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]


def test_expand_batch_to_tokens():
    """Each request's value over its drafted positions; a request with none drafted takes no position."""
    x = torch.tensor([0.5, 0.0, 2.0])
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    assert expand_batch_to_tokens(x, cu, 5, replace_from=0, replace_to=1).tolist() == [0.5, 0.5, 2.0, 2.0, 2.0]
    assert expand_batch_to_tokens(torch.tensor([0.0, 3.0]), torch.tensor([1, 2]), 2, 0, 1).tolist() == [1.0, 3.0]


def test_proposer_looks_up_each_request(monkeypatch):
    """Each row's continuation of its longest recent suffix, cut to γ and to the context left; [] while a request
    samples nothing (it is reading its prompt)."""
    monkeypatch.setattr("verispec.vllm.proposer.check_vllm_version", lambda: None)  # the check needs vLLM itself
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3),
                             model_config=SimpleNamespace(max_model_len=12))
    proposer = NgramProposer(config)
    tokens = np.zeros((3, 12), dtype=np.int64)
    tokens[0, :8] = [1, 2, 3, 4, 5, 1, 2, 3]
    tokens[1, :4] = [7, 8, 9, 6]
    tokens[2, :10] = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    drafts = proposer.propose([[3], [6], [4]], np.array([8, 4, 10]), tokens)
    assert drafts == [[4, 5, 1], [], [5]]  # row 2: 10 of 12 positions used, so one draft token fits
    assert proposer.propose([[], [6], [4]], np.array([8, 4, 10]), tokens)[0] == []


def test_version_and_rule_guards(monkeypatch):
    check_vllm_version("0.32.0")
    check_vllm_version("0.32.1+cpu")
    for other in ("0.31.0", "0.33.0"):
        with pytest.raises(ConfigError, match="supports vLLM 0.32"):
            check_vllm_version(other)
    monkeypatch.delenv(RULE_ENV, raising=False)
    register()  # nothing set: nothing hooked, and vLLM is not even imported
    monkeypatch.setenv(RULE_ENV, "gbv")
    with pytest.raises(ConfigError, match="VERISPEC_VLLM_RULE='gbv'"):
        register()
    assert os.environ[RULE_ENV] == "gbv"
