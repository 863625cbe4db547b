"""The C++ kernel of the laws' vocabulary-wide steps (verispec/native/laws.py) against the torch reference.

The exact-enumeration proofs in test_gbv.py and test_block.py run through both; these compare the two on large
vocabularies, with ties, zeros and both tiers of GBV's order, where enumeration cannot go.
"""

from __future__ import annotations

import platform

import pytest
import torch

import verispec.verify.gbv as gbv
from verispec.native.laws import law_kernel
from verispec.verify import block_verify_law, gbv_verify_law


@pytest.fixture(scope="module")
def kernel():
    module = law_kernel(torch.zeros(1, dtype=torch.float64))
    assert module is not None, "the verification kernel did not build (needs g++ and ninja)"
    return module


def node_laws(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (p_u, q_u) `[V]` float64: peaked and heavy-tailed, with exact ties, zeros and an off-support token."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.softmax(3 * torch.randn(vocab, generator=generator, dtype=torch.float64), 0)
    p = torch.softmax(3 * torch.randn(vocab, generator=generator, dtype=torch.float64), 0)
    p[:40] = q[:40] * 1.5  # equal ratio keys: the token-id tie-break decides
    q[40:45] = 0.0  # never drafted
    p[45:50] = 0.0  # ratio key 0
    q[50:60] = q[60:70]  # equal q across the tier threshold's neighbourhood
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("min_q,min_share", [(gbv.RANKED_MIN_Q, gbv.RANKED_MIN_SHARE), (0.0, 1.0), (1e-3, 1e-2)])
def test_the_kernel_writes_the_reference_skew_and_order(kernel, k, min_q, min_share):
    p, q = node_laws(30_011, seed=k)
    mass_a, mass_x = 0.37, 0.21
    order = gbv.node_order(p, q, min_q, min_share)
    reference = gbv.skewed_draft(q, order.below, mass_a, mass_x, k)
    out = torch.full_like(q, float("nan"))
    tokens = torch.arange(q.numel())
    below, threshold, keys = kernel.skewed_draft_row(p, q, min_q, min_share, mass_a, mass_x, k, out, tokens)
    assert threshold == order.threshold
    # (key, id) orders the tokens as the reference order does: ranked ones by their ratio's bits, the rest at -1
    assert [(1, key, t) if key >= 0 else (0, 0, t) for t, key in enumerate(keys.tolist())] == order.sort_keys(
        tokens.tolist())
    assert torch.allclose(below, order.below, rtol=0, atol=1e-13)
    assert torch.allclose(out, reference, rtol=1e-11, atol=1e-16)
    assert abs(float(out.sum()) - 1.0) < 1e-12


def test_the_kernel_and_the_reference_select_one_child_by_one_order(kernel):
    # node_step's two branches: the same child (ties among the children included) and the same mass below it.
    p, q = node_laws(30_011, seed=9)
    tokens = [0, 1, 2, 39, 40, 46, 55, 65, 1000, 20_000]  # tied keys, q = 0, p = 0, both tiers
    # every pair in both orders, and all of them: a child's place in the list must not matter
    for children in [[a, b] for a in tokens for b in tokens if a != b] + [tokens]:
        choices = []
        for use_kernel in (True, False):
            out = torch.empty_like(q)
            choices.append(gbv.node_step(p, q, children, 0.2, 0.5, 3, gbv.RANKED_MIN_Q, gbv.RANKED_MIN_SHARE, out,
                                         use_kernel))
        assert choices[0][0] == choices[1][0], children
        assert choices[0][1] == pytest.approx(choices[1][1], abs=1e-14)


def test_positive_mass_is_the_residual_mass_per_row(kernel):
    generator = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, 151_936, generator=generator, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 151_936, generator=generator, dtype=torch.float64), -1)
    weights = torch.tensor([1.0, 0.6, 0.0], dtype=torch.float64)
    reference = (weights[:, None] * p - q).clamp_min(0.0).sum(-1)
    assert torch.allclose(kernel.positive_mass(weights, p, q), reference, rtol=1e-12, atol=0)


def paths_on(vocab: int, k: int, gamma: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.softmax(3 * torch.randn(k, gamma, vocab, generator=generator, dtype=torch.float64), -1)
    p = torch.softmax(3 * torch.randn(k, gamma + 1, vocab, generator=generator, dtype=torch.float64), -1)
    tokens = torch.multinomial(q.view(-1, vocab), 1, generator=generator).view(k, gamma)
    tokens[1, :2] = tokens[0, :2]  # a shared prefix: the tree branches below the root
    return tokens, q, p


@pytest.mark.parametrize("seed", range(4))
def test_gbv_law_is_the_same_with_and_without_the_kernel(kernel, seed):
    tokens, q, p = paths_on(20_000, k=3, gamma=4, seed=seed)
    chosen, law = gbv_verify_law(tokens, q, p)
    chosen_ref, law_ref = gbv_verify_law(tokens, q, p, use_kernel=False)
    assert chosen == chosen_ref
    assert torch.allclose(law.stop, law_ref.stop, rtol=0, atol=1e-12)
    assert torch.allclose(law.q, law_ref.q, rtol=1e-11, atol=1e-16)
    bv, bv_ref = block_verify_law(tokens[0], q[0], p[0]), block_verify_law(tokens[0], q[0], p[0], use_kernel=False)
    assert torch.allclose(bv.stop, bv_ref.stop, rtol=0, atol=1e-13)


def test_the_kernel_is_skipped_where_it_cannot_run():
    assert law_kernel(torch.zeros(3, dtype=torch.float32)) is None  # float32: the torch code runs
    tokens, q, p = paths_on(50, k=2, gamma=2, seed=0)
    chosen, law = gbv_verify_law(tokens, q.float(), p.float())  # converted to float64 first, then the kernel runs
    assert law.q.dtype == torch.float64 and chosen in (0, 1)


def test_the_kernel_rejects_bad_rows(kernel):
    p, q = node_laws(100, seed=0)
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="float64"):
        kernel.skewed_draft_row(p.float(), q, 0.0, 1.0, 0.0, 1.0, 2, out, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        kernel.skewed_draft_row(p, q, 0.0, 1.0, 0.0, 1.0, 2, out, torch.tensor([100]))
    with pytest.raises(RuntimeError, match="one vocabulary"):
        kernel.skewed_draft_row(p, q[:50], 0.0, 1.0, 0.0, 1.0, 2, out, torch.tensor([0]))


def test_the_kernel_gives_the_same_bits_on_one_thread_and_on_several(kernel):
    """Its passes run over fixed chunks of the vocabulary whose partial sums combine in one order, so the thread
    count changes where they run, never what they compute."""
    p, q = node_laws(30_011, seed=7)
    tokens = torch.arange(q.numel())
    weights = torch.tensor([1.0, 0.8, 0.3], dtype=torch.float64)
    rows_p, rows_q = torch.stack([p, q, p]), torch.stack([q, p, q])
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = torch.empty_like(q)
            below, threshold, keys = kernel.skewed_draft_row(p, q, gbv.RANKED_MIN_Q, gbv.RANKED_MIN_SHARE, 0.37,
                                                             0.21, 3, out, tokens)
            results.append((below, threshold, keys, out, kernel.positive_mass(weights, rows_p, rows_q)))
    finally:
        torch.set_num_threads(before)
    for below, threshold, keys, out, rho in results[1:]:
        assert torch.equal(below, results[0][0]) and threshold == results[0][1] and torch.equal(keys, results[0][2])
        assert torch.equal(out, results[0][3]) and torch.equal(rho, results[0][4])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the portable build targets x86-64-v2")
def test_the_portable_build_gives_the_same_bits(kernel):
    """Hosts without AVX-512 run the portable prefix sums, which add in the vector code's order: the same order keys
    and masses below, so the same selection, and the same q_skew (no level's build fuses multiply-adds)."""
    from verispec.native.build import load_native
    from verispec.native.laws import SOURCE

    portable = load_native(SOURCE, "laws", isa="portable")
    p, q = node_laws(30_011, seed=12)
    tokens = torch.arange(q.numel())
    results = []
    for module in (kernel, portable):
        out = torch.empty_like(q)
        below, threshold, keys = module.skewed_draft_row(p, q, gbv.RANKED_MIN_Q, gbv.RANKED_MIN_SHARE, 0.37, 0.21, 3,
                                                         out, tokens)
        results.append((below, threshold, keys, out))
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]
    assert torch.equal(results[0][2], results[1][2])
    assert torch.equal(results[0][3], results[1][3])
