"""The rules' accelerator slot (verispec/verify/kernels.py): the native kernel registers itself, a rule falls back to
its torch reference where no kernel takes the tensors, and a decode's trace counts which code ran."""

from __future__ import annotations

import pytest
import torch

import verispec.native.laws as native_laws
from verispec.engine import DecodeConfig, Engine
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig
from verispec.verify import block_verify_law, kernels
from verispec.verify.kernels import counting_law_steps, law_kernel


class TorchMass:
    """A stand-in kernel: BV's leftover mass by the reference formula, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def positive_mass(self, weights: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return (weights[:, None] * p - q).clamp_min(0.0).sum(-1)


def block(seed: int = 0, gamma: int = 3, vocab: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(gamma, vocab, generator=generator, dtype=torch.float64), -1)  # [γ, V]
    p = torch.softmax(torch.randn(gamma + 1, vocab, generator=generator, dtype=torch.float64), -1)  # [γ+1, V]
    return torch.arange(gamma) % vocab, q, p


def test_the_native_kernel_registers_itself_on_import():
    assert kernels._finder is native_laws.law_kernel


def test_with_no_kernel_registered_the_rule_runs_its_torch_reference_and_counts_it(monkeypatch):
    monkeypatch.setattr(kernels, "_finder", None)
    tokens, q, p = block()
    with counting_law_steps() as steps:
        law = block_verify_law(tokens, q, p)
    assert (steps.kernel, steps.torch) == (0, 1)
    assert torch.equal(law.stop, block_verify_law(tokens, q, p, use_kernel=False).stop)
    assert law_kernel(q) is None  # outside a counted block: nothing to count, no error


def test_a_registered_kernel_is_used_where_it_takes_the_tensors(monkeypatch):
    mass = TorchMass()
    monkeypatch.setattr(kernels, "_finder", kernels._finder)  # the registered finder, restored after the test
    kernels.register_law_kernel(lambda *ts: mass if all(t.dtype == torch.float64 for t in ts) else None)
    tokens, q, p = block()
    with counting_law_steps() as steps:
        law = block_verify_law(tokens, q, p)
        assert law_kernel(q.float()) is None  # declined: the caller falls back
    assert mass.calls == 1 and (steps.kernel, steps.torch) == (1, 1)
    torch.testing.assert_close(law.stop, block_verify_law(tokens, q, p, use_kernel=False).stop, rtol=0, atol=1e-15)


@pytest.mark.parametrize("registered", [True, False], ids=["kernel", "fallback"])
def test_a_decode_trace_reports_which_code_computed_its_laws(monkeypatch, registered):
    mass = TorchMass()
    monkeypatch.setattr(kernels, "_finder", (lambda *ts: mass) if registered else None)
    engine = Engine(TabularLM(5, seed=1), TabularLM(5, seed=2, sharpness=2.0))
    config = DecodeConfig("bv", gamma=3, max_new_tokens=12, sampling=SamplingConfig(temperature=1.0), seed=0)
    trace = engine.decode([0], config).trace
    steps = trace.law_steps_kernel + trace.law_steps_torch
    assert steps > 0 and (trace.law_steps_kernel == steps) == registered and mass.calls == trace.law_steps_kernel
    plain = Engine(TabularLM(5, seed=1), None).decode([0], DecodeConfig("ar", max_new_tokens=4)).trace
    assert plain.law_steps_kernel == plain.law_steps_torch == 0  # `ar` verifies nothing


def test_the_tests_here_leave_the_native_kernel_registered():
    """Runs after the tests that swap the finder: a leaked stand-in would break every later decode."""
    assert kernels._finder is native_laws.law_kernel
