"""Bench method variants with drafters run end to end on tiny models and keep their settings in the records."""

from __future__ import annotations

import copy

from verispec import Decoder
from verispec.bench.runner import BenchConfig, run_bench
from verispec.models.hf import HFCausalLM
from verispec.prompt_sets import Prompt

PROMPTS = [Prompt("a", "def add(a, b):\n    return a + b\ndef add(a, b):", "code"), Prompt("b", "hello hello", "chat")]


def test_drafter_variants_run_in_the_bench(tiny_pair, tokenizer):
    reduced = HFCausalLM(copy.deepcopy(tiny_pair["target"].model), tokenizer, vocab_ids=range(0, 30))
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    decoder._reduced_drafts[30] = reduced  # what Decoder.reduced_draft(30) would load for a named draft
    methods = ["ar", "sd:drafter=ngram,ngram_min=1", "bv:drafter=hybrid", "gbv:paths=2,drafter=ngram,ngram_min=1",
               "sd:draft_vocab=30"]
    config = BenchConfig(methods=methods, max_new_tokens=12, warmup_tokens=0, bootstrap_resamples=50)
    result = run_bench(config, None, decoder=decoder, prompts=PROMPTS, progress=False)
    by_method = {m: [r for r in result["records"] if r["method"] == m] for m in methods}
    ar_tokens = [r["tokens"] for r in by_method["ar"]]
    assert len(ar_tokens) == len(PROMPTS) and all(ar_tokens)
    for method in methods[1:]:  # greedy: every variant writes what ar writes
        assert [r["tokens"] for r in by_method[method]] == ar_tokens
    ngram = by_method["sd:drafter=ngram,ngram_min=1"]
    assert all(r["config"]["drafter"] == "ngram" and r["trace"]["draft_calls"] == 0 for r in ngram)
    assert all(r["config"]["draft_vocab"] == 30 for r in by_method["sd:draft_vocab=30"])
    assert any(r["trace"]["rounds_by_drafter"].get("ngram") for r in by_method["bv:drafter=hybrid"])


def test_transformers_prompt_lookup_peer(tiny_pair, tokenizer):
    from verispec.bench.peers import peer_generate
    from verispec.engine import DecodeConfig

    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    prompt = PROMPTS[0].text
    ours = decoder.generate(prompt, method="ar", max_new_tokens=16, chat_template=False)
    peer = peer_generate(decoder, prompt, "hf-lookup", DecodeConfig(gamma=3, max_new_tokens=16), chat_template=False)
    assert peer.tokens == ours.tokens  # greedy prompt lookup writes what the target writes
    rounds = peer.trace.rounds
    assert sum(r.emitted for r in rounds) == len(peer.tokens) and all(0 <= r.drafted <= 3 for r in rounds)
    assert any(r.drafted for r in rounds) and peer.trace.draft_calls == 0
    assert DecodeConfig.drafter is None  # the peer left the default (each method's own) alone
