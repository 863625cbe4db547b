"""torch's threads while a model of the decode runs on its own thread pool (verispec.models.threads)."""

from __future__ import annotations

import pytest
import torch

from tests.models.conftest import RecordingLM
from verispec.config import DecodeConfig
from verispec.engine import Engine
from verispec.models.threads import ThreadedForward, shared_cores, torch_threads


def _decode(own_pool: bool):
    target = RecordingLM(6, seed=1, name="target")
    draft = RecordingLM(6, seed=2, name="draft", own_pool=own_pool)
    config = DecodeConfig().with_settings(method="sd", gamma=3, max_new_tokens=24, seed=5, temperature=1.0)
    out = Engine(target, draft).decode([1, 2, 3], config)
    return out, target, draft


def test_torch_work_is_single_threaded_around_a_model_with_its_own_pool(two_threads):
    out, target, draft = _decode(own_pool=True)
    assert target.threads_seen and set(target.threads_seen) == {2}  # torch's forwards keep every thread
    assert draft.threads_seen and set(draft.threads_seen) == {1}  # no torch worker spins while it runs
    assert torch.get_num_threads() == 2  # restored after the decode
    reference, plain_target, plain_draft = _decode(own_pool=False)
    assert set(plain_draft.threads_seen) == {2}  # nothing changes without such a model
    assert out.tokens == reference.tokens  # threads never change the tokens


def test_threads_are_restored_when_the_decode_fails(two_threads):
    target = RecordingLM(6, seed=1)
    draft = RecordingLM(6, seed=2, own_pool=True)

    def broken(*args, **kwargs):
        raise RuntimeError("planted failure")

    draft._run = broken
    with pytest.raises(RuntimeError, match="planted"):
        Engine(target, draft).decode([1, 2], DecodeConfig(method="sd", gamma=2, max_new_tokens=4))
    assert torch.get_num_threads() == 2


def test_shared_cores_wraps_only_torch_models(two_threads):
    torch_model, own = RecordingLM(4, seed=1), RecordingLM(4, seed=2, own_pool=True)
    with shared_cores(torch_model, own, None) as (a, b, c):
        assert isinstance(a, ThreadedForward) and b is own and c is None
        assert torch.get_num_threads() == 1
        a.forward([1, 2], n_logits=2)
        assert torch_model.threads_seen == [2] and a.cache_length == 2  # attributes pass through
    with shared_cores(torch_model, None) as models:
        assert models[0] is torch_model  # no model with its own pool: nothing changes
        assert torch.get_num_threads() == 2


def test_torch_threads_restores(two_threads):
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
