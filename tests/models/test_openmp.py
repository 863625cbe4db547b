"""Where a decode's torch work runs (verispec.models.openmp): its round work on one OpenMP thread of the decoding
thread, its forwards on the count that thread had, whichever thread decodes."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.models.conftest import RecordingLM
from verispec.config import DecodeConfig
from verispec.engine import Engine
from verispec.models.batched import ForwardBatcher, Pass
from verispec.models.openmp import forward_threads, openmp_runtime, openmp_threads, round_threads

pytestmark = pytest.mark.skipif(openmp_runtime() is None, reason="torch here runs without an OpenMP runtime")




def on_thread(work):
    """Run `work` on a new thread; return what it returned (re-raising what it raised)."""
    box: dict = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001  # re-raised on the caller
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_the_count_changes_for_the_calling_thread_only(two_threads):
    inside, outside = threading.Event(), threading.Event()
    seen = {}

    def helper():
        with openmp_threads(1):
            seen["helper"] = torch.get_num_threads()
            inside.set()
            outside.wait(10)
        seen["helper after"] = torch.get_num_threads()

    thread = threading.Thread(target=helper)
    thread.start()
    assert inside.wait(10)
    seen["main"] = torch.get_num_threads()  # while the helper runs on one thread
    outside.set()
    thread.join()
    assert seen == {"helper": 1, "main": 2, "helper after": 2}




@pytest.mark.parametrize("where", ["main", "helper"])
def test_a_decode_samples_on_one_thread_and_runs_forwards_on_all(two_threads, where):
    target, draft = RecordingLM(6, seed=1), RecordingLM(6, seed=2)
    config = DecodeConfig().with_settings(method="sd", gamma=3, max_new_tokens=12, seed=5, temperature=1.0)
    round_counts: list[int] = []

    def decode():
        out = Engine(target, draft).decode([1, 2, 3], config,
                                            on_commit=lambda _: round_counts.append(torch.get_num_threads()))
        return out, torch.get_num_threads()

    out, after = decode() if where == "main" else on_thread(decode)
    assert set(round_counts) == {1} and len(round_counts) == len(out.trace.rounds)
    assert set(target.threads_seen) == {2} and set(draft.threads_seen) == {2}
    assert after == 2


def test_reductions_give_the_same_bits_on_any_decoding_thread(two_threads):
    """Sums over 151,936-entry rows: inside `round_threads` on the main thread they are the bits of one thread on a
    fresh one, and (why it matters) some of them differ from the same sums split between two threads."""
    rows = [torch.rand(151_936, generator=torch.Generator().manual_seed(seed)) ** 8 for seed in range(16)]

    def sums():
        return [float(row.sum()) for row in rows]

    def one_thread_sums():
        with openmp_threads(1):
            return sums()

    with round_threads():
        in_round = sums()
    assert in_round == on_thread(one_thread_sums)
    assert sums() != in_round  # two threads: a different split of the same sums


def test_forward_threads_outside_a_decode_change_nothing(two_threads):
    with forward_threads():
        assert torch.get_num_threads() == 2
    with round_threads():
        assert torch.get_num_threads() == 1
        with forward_threads():
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_batched_passes_run_on_the_batchers_count_from_a_decoding_owner(two_threads):
    """The owner of a ForwardBatcher may run batches while inside a decode of its own (one thread for round work):
    the pass still gets the batcher's threads."""
    seen: list[int] = []

    class Slot:
        shared = object()
        priority = 0

        def batchable(self, rows):
            return False

        def run_alone(self, p):
            seen.append(torch.get_num_threads())
            return "outputs"

    batcher = ForwardBatcher(own_thread=False)
    with round_threads():
        assert batcher.submit(Pass(Slot(), [1], 1, False, None)) == "outputs"
    assert seen == [2]
