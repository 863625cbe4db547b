"""The same tiny model on the CPU and on the test device (`VERISPEC_TEST_DEVICE`, e.g. cuda): equal logits for chain,
rollback and tree forwards, and equal decodes, greedy and sampled. Skipped when the test device is the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.device import TEST_DEVICE, device_is_cpu, on_test_device
from verispec.engine import DecodeConfig, Engine
from verispec.models.hf import HFCausalLM
from verispec.models.tiny import perturb, tiny_qwen2, tiny_tokenizer
from verispec.sampling import SamplingConfig

pytestmark = pytest.mark.skipif(device_is_cpu(),
                                reason="VERISPEC_TEST_DEVICE is the CPU: nothing to compare against")

# float64 weights, but transformers builds the rotary tables in float32 on every device, and CPU and CUDA sin/cos
# differ in the last bit: logits of size ~5 moved by 2.1e-6 on an H200. Far below any decision the engine makes.
TOLERANCE = 1e-4


def twins(seed: int = 1) -> tuple[HFCausalLM, HFCausalLM]:
    """One float64 tiny model, as a CPU adapter and as a test-device adapter."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(len(tokenizer), seed=seed)
    return HFCausalLM(model, tokenizer), HFCausalLM(on_test_device(copy.deepcopy(model)), tokenizer)


def test_chain_rollback_and_tree_forwards_agree_across_devices():
    cpu, device = twins()
    assert device.device.type == torch.device(TEST_DEVICE).type
    outs = {}
    for name, model in (("cpu", cpu), ("device", device)):
        steps = [model.forward([5, 9, 13, 2, 7], n_logits=2, return_hidden=True)]
        steps.append(model.forward([20, 21, 22], n_logits=3))
        model.truncate(6)  # keep 20 only
        # a tree after it: 30 -> 31 and 32 as a second child of 20
        steps.append(model.forward([30, 31, 32], n_logits=3, parents=[5, 6, 5]))
        model.keep([0, 1, 2, 3, 4, 5, 8])  # the branch 32
        steps.append(model.forward([40], n_logits=1))
        outs[name] = steps
    for a, b in zip(outs["cpu"], outs["device"], strict=True):
        assert b.logits.device.type == "cpu"
        torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(outs["device"][0].hidden, outs["cpu"][0].hidden, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize(("method", "temperature"), [("ar", 0.0), ("sd", 0.0), ("bv", 0.0), ("ar", 1.0),
                                                     ("sd", 1.0), ("bv", 1.0), ("gbv", 1.0)])
def test_decodes_agree_across_devices(method: str, temperature: float):
    target_cpu, target_device = twins(seed=1)
    draft_cpu = HFCausalLM(perturb(copy.deepcopy(target_cpu.model), 0.03, seed=3), target_cpu.tokenizer)
    draft_device = HFCausalLM(on_test_device(copy.deepcopy(draft_cpu.model)), target_cpu.tokenizer)
    prompt = target_cpu.tokenizer("def add(a, b):\n    return")["input_ids"]
    config = DecodeConfig(method, gamma=3, max_new_tokens=40, sampling=SamplingConfig(temperature=temperature),
                          seed=7, paths=2 if method == "gbv" else None)
    a = Engine(target_cpu, draft_cpu).decode(prompt, config)
    b = Engine(target_device, draft_device).decode(prompt, config)
    assert b.tokens == a.tokens and len(a.tokens) == 40
