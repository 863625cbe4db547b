"""Batched decoding (`verispec.models.batched`): sequences decoded at once, each by the engine's own loop, get the
tokens they get alone, whatever shares their batch: mixed methods, drafters, temperatures, path counts (tree masks)
and prompt lengths (prompts over the decode kernels' rows run alone), sequences that end early or are cancelled,
and slots reused by the next sequences."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import pytest
import torch

from verispec.engine import DecodeConfig, Engine
from verispec.models.batched import ForwardBatcher, SlotLM
from verispec.models.decoder_stack import stack_kernel
from verispec.models.fastpath import apply_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.quantized import quantized_engine
from verispec.models.tiny import perturb, tiny_qwen2, tiny_tokenizer

pytestmark = pytest.mark.skipif(quantized_engine() is None or stack_kernel() is None,
                                reason="needs torch's fbgemm engine and a C++ compiler")

EOS = frozenset({0})


def int4_pair() -> dict[str, HFCausalLM]:
    """A tiny float32 target on the int4 path (its random weights in 8-bit rows) and a perturbed copy of it as the
    draft, every linear rounded to 4 bits: both run their decode passes on the decoder stack."""
    tokenizer = tiny_tokenizer()
    net = tiny_qwen2(len(tokenizer), seed=11, hidden=128, dtype=torch.float32)
    draft_net = perturb(copy.deepcopy(net), 0.05, seed=12)
    pair = {"target": HFCausalLM(net, tokenizer, name="tiny-int4-target"),
            "draft": HFCausalLM(draft_net, tokenizer, name="tiny-int4-draft")}
    apply_linear_backend(pair["target"], "int4")
    apply_linear_backend(pair["draft"], "int4-rounded")
    return pair


@pytest.fixture(scope="module")
def pair() -> dict[str, HFCausalLM]:
    return int4_pair()


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(2, 40, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def config(**settings: object) -> DecodeConfig:
    return DecodeConfig().with_settings(**{"max_new_tokens": 24} | settings)


# Mixed methods, drafters, temperatures, path counts and prompt lengths (90 tokens: over the 64 rows of decode
# passes, so that prompt runs alone), and one that ends after 3 tokens.
CASES = [
    (prompt(7, 1), config(method="sd", seed=1)),
    (prompt(12, 2), config(method="ar", temperature=1.0, seed=2)),
    (prompt(90, 3), config(method="sd", temperature=1.0, seed=3, gamma=3, adaptive_gamma=False)),
    (prompt(5, 4), config(method="bv", temperature=1.0, seed=4, drafter="hybrid")),
    (prompt(9, 5), config(method="gbv", paths=2, temperature=1.0, seed=5, gamma=3)),
    (prompt(6, 6), config(method="sd", drafter="ngram", seed=6, max_new_tokens=3)),
]


def alone(pair: dict[str, HFCausalLM], prompt_ids: list[int], cfg: DecodeConfig) -> list[int]:
    return Engine(pair["target"], pair["draft"], EOS).decode(prompt_ids, cfg).tokens


def batched(slots: list[dict[str, SlotLM]], batcher: ForwardBatcher, cases: list[tuple[list[int], DecodeConfig]],
            on_commit: dict[int, Callable[[list[int]], bool]] | None = None) -> list[list[int] | BaseException]:
    """Decode `cases` at once, case i in slot i; return each one's tokens (or its error)."""
    out: list[list[int] | BaseException] = [[] for _ in cases]
    for _ in cases:
        batcher.enter()

    def run(i: int) -> None:
        try:
            engine = Engine(slots[i]["target"], slots[i]["draft"], EOS)
            out[i] = engine.decode(cases[i][0], cases[i][1], (on_commit or {}).get(i)).tokens
        except BaseException as exc:  # noqa: BLE001  # reported by the test
            out[i] = exc
        finally:
            batcher.leave()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return out


def test_each_sequence_of_a_batch_gets_the_tokens_it_gets_alone(pair, one_thread):
    expected = [alone(pair, p, c) for p, c in CASES]
    assert len({tuple(t) for t in expected}) == len(CASES)  # different outputs: a mix-up would show
    batcher = ForwardBatcher()
    try:
        slots = [{role: SlotLM(model, batcher, priority) for role, model, priority in
                  (("target", pair["target"], 1), ("draft", pair["draft"], 0))} for _ in CASES]
        assert batched(slots, batcher, CASES) == expected
        assert batcher.batched_rows > 0.5 * batcher.rows  # most rows shared a pass
        # The slots again, with the cases in other slots: their caches reused, the same tokens
        rotated = CASES[1:] + CASES[:1]
        assert batched(slots, batcher, rotated) == expected[1:] + expected[:1]
    finally:
        batcher.close()


def test_a_cancelled_sequence_leaves_and_the_others_are_unchanged(pair, one_thread):
    cases = CASES[:4]
    expected = [alone(pair, p, c) for p, c in cases]
    batcher = ForwardBatcher()
    try:
        slots = [{role: SlotLM(pair[role], batcher, priority) for role, priority in (("target", 1), ("draft", 0))}
                 for _ in cases]
        rounds = []

        def cancel_after_two(tokens: list[int]) -> bool:  # a client that leaves after two rounds
            rounds.append(tokens)
            return len(rounds) == 2

        got = batched(slots, batcher, cases, {0: cancel_after_two})
        assert got[1:] == expected[1:]
        assert got[0] == expected[0][: len(got[0])] and len(got[0]) < len(expected[0])
    finally:
        batcher.close()


def test_batched_passes_give_the_bits_of_passes_alone(pair):
    """One stacked call over three sequences (a chain, a block after a longer cache, a tree) against each alone."""
    target = pair["target"]
    batcher = ForwardBatcher()
    try:
        views = [SlotLM(target, batcher) for _ in range(3)]
        feeds = [(prompt(3, 1), None), (prompt(10, 2), None), (prompt(6, 3), None)]
        steps = [([7], None), ([8, 9, 10, 11], None), ([12, 13, 14], [5, 6, 6])]  # the last: a tree after 6 tokens
        for _ in views:
            batcher.enter()
        results: list = [None] * 3

        def run(i: int) -> None:
            try:
                views[i].forward(feeds[i][0], n_logits=1)
                tokens, parents = steps[i]
                results[i] = views[i].forward(tokens, n_logits=len(tokens), return_hidden=True, parents=parents)
            finally:
                batcher.leave()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert batcher.batched_rows > 0
        for i in range(3):
            target.reset()
            target.forward(feeds[i][0], n_logits=1)
            tokens, parents = steps[i]
            own = target.forward(tokens, n_logits=len(tokens), return_hidden=True, parents=parents)
            assert torch.equal(results[i].logits, own.logits) and torch.equal(results[i].hidden, own.hidden)
    finally:
        batcher.close()


def test_an_error_in_a_pass_reaches_its_sequence_and_the_batcher_goes_on(pair):
    batcher = ForwardBatcher()
    try:
        view = SlotLM(pair["target"], batcher)
        batcher.enter()
        with pytest.raises(IndexError):
            view.forward([10_000])  # outside the vocabulary: the embedding refuses it in the batcher's thread
        view.reset()
        assert view.forward([5]).logits.shape == (1, pair["target"].vocab_size)
        batcher.leave()
    finally:
        batcher.close()


def test_a_model_with_a_reduced_head_cannot_be_shared(pair):
    tokenizer = tiny_tokenizer()
    reduced = HFCausalLM(tiny_qwen2(len(tokenizer), seed=1), tokenizer, vocab_ids=list(range(10)))
    with pytest.raises(ValueError, match="reduced head"):
        SlotLM(reduced, ForwardBatcher())


def test_a_prompt_read_in_chunks_gets_the_same_tokens_for_any_chunk_and_shares_the_batch(pair, one_thread):
    # On the int4 path every chunk of at most the decode kernels' rows gives the bits of one-token passes: any
    # chunk size gives the same tokens. (Read whole, the prompt runs the prompt kernels: other bits, and on a tiny
    # random model, whose logits are close, other tokens.)
    long_prompt = prompt(150, 7)
    cases = [config(method=m, prompt_chunk=chunk, **s) for m, s in (("sd", {"temperature": 1.0, "seed": 7}),
                                                                    ("ar", {}))
             for chunk in (None, 64, 17)]
    got = {(c.method, c.prompt_chunk): alone(pair, long_prompt, c) for c in cases}
    for method in ("sd", "ar"):
        assert got[(method, 64)] == got[(method, 17)]
    # In a batch: the long prompt's chunks run beside the short sequences' rounds, not alone before them
    short = [(prompt(6, 8 + i), config(method="sd", seed=8 + i, max_new_tokens=40)) for i in range(2)]
    chunked = [(long_prompt, config(method="sd", temperature=1.0, seed=7, prompt_chunk=64))]
    expected = [alone(pair, p, c) for p, c in short + chunked]
    batcher = ForwardBatcher()
    try:
        slots = [{role: SlotLM(pair[role], batcher, priority) for role, priority in (("target", 1), ("draft", 0))}
                 for _ in range(3)]
        assert batched(slots, batcher, short + chunked) == expected
        assert batcher.rows - batcher.batched_rows < 64  # no prompt pass ran alone
    finally:
        batcher.close()


def test_a_prompt_read_in_chunks_on_float64_gives_the_tokens_of_one_pass():
    # Off the row-exact paths chunks change only rounding: in float64 the greedy tokens are those of one pass,
    # which shows each chunk at its own positions after the ones before.
    tokenizer = tiny_tokenizer()
    target = HFCausalLM(tiny_qwen2(len(tokenizer), seed=21), tokenizer)
    draft = HFCausalLM(perturb(tiny_qwen2(len(tokenizer), seed=21), 0.05, seed=22), tokenizer)
    engine = Engine(target, draft, EOS)
    long_prompt = prompt(50, 9)
    for method in ("ar", "sd"):
        whole = engine.decode(long_prompt, config(method=method)).tokens
        for chunk in (1, 7, 49, 64):
            out = engine.decode(long_prompt, config(method=method, prompt_chunk=chunk))
            assert out.tokens == whole, (method, chunk)
            reads = -(-49 // chunk)  # passes over the prompt's first 49 tokens
            assert out.trace.target_calls == reads + len(out.trace.rounds)


def test_prompt_chunk_is_checked():
    with pytest.raises(Exception, match="prompt_chunk must be an integer >= 1"):
        config(prompt_chunk=0)
