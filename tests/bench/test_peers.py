"""Peers: transformers' generate and assisted generation on the same tiny pair, traced like verispec's methods."""

from __future__ import annotations

import pytest
import torch

from verispec import DecodeConfig, Decoder
from verispec.bench.peers import peer_generate, rounds_from_calls, sampling_kwargs
from verispec.errors import ConfigError
from verispec.sampling import SamplingConfig


def settings(gamma: int, sampling: SamplingConfig, max_new_tokens: int, seed: int) -> DecodeConfig:
    """The settings a peer reads from a DecodeConfig (its method is verispec's, which a peer ignores)."""
    return DecodeConfig(gamma=gamma, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed)

GREEDY = SamplingConfig()
PROMPT = "hello there, general"


@pytest.fixture(scope="module", params=["partial", "unrelated"])
def decoder(request, tiny_pair):
    return Decoder(tiny_pair["target"], tiny_pair[request.param])


def test_greedy_peers_reproduce_verispec_ar(decoder):
    ar = decoder.generate(PROMPT, method="ar", max_new_tokens=24)
    for method in ("hf-generate", "hf-assisted"):
        peer = peer_generate(decoder, PROMPT, method, settings(4, GREEDY, 24, 0))
        assert peer.tokens == ar.tokens, method
        assert peer.trace.generated == len(peer.tokens)
        assert peer.prompt_tokens == ar.prompt_tokens and peer.text == ar.text


def test_hf_generate_trace_is_one_target_call_per_token(decoder):
    peer = peer_generate(decoder, PROMPT, "hf-generate", settings(4, GREEDY, 16, 0))
    t = peer.trace
    assert t.target_calls == len(peer.tokens) and t.draft_calls == 0 and t.acceptance_rate is None
    assert t.rounds[0].fed == peer.prompt_tokens and all(r.fed == 1 for r in t.rounds[1:])
    assert 0 < t.time_target <= t.time_total


def test_hf_assisted_rounds_match_verispec_sd_at_greedy(decoder):
    sd = decoder.generate(PROMPT, method="sd", gamma=3, max_new_tokens=30, adaptive_gamma=False)  # hf's fixed γ
    peer = peer_generate(decoder, PROMPT, "hf-assisted", settings(3, GREEDY, 30, 0))
    assert peer.tokens == sd.tokens
    ours = [(r.drafted, r.accepted, r.emitted, r.fed) for r in sd.trace.rounds]
    theirs = [(r.drafted, r.accepted, r.emitted, r.fed) for r in peer.trace.rounds]
    # The same draft length and the same greedy checks: the same rounds (the last one may be cut at EOS / the end).
    assert theirs[:-1] == ours[:-1] and len(theirs) == len(ours)
    assert peer.trace.target_calls == sd.trace.target_calls
    assert peer.trace.draft_calls >= sum(r.drafted for r in peer.trace.rounds)
    assert 0 < peer.trace.time_draft and 0 < peer.trace.time_target < peer.trace.time_total


def test_assistant_settings_are_restored(tiny_pair):
    decoder = Decoder(tiny_pair["target"], tiny_pair["same"])
    config = tiny_pair["same"].model.generation_config
    before = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    peer = peer_generate(decoder, PROMPT, "hf-assisted", settings(5, GREEDY, 12, 0))
    after = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    assert after == before
    assert peer.trace.acceptance_rate == 1.0  # same weights: every draft token accepted
    assert all(r.drafted == 5 for r in peer.trace.rounds[:-1])  # a constant γ = 5, no confidence stop


def test_sampled_peers_are_seeded_and_leave_the_global_rng_alone(tiny_pair):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    sampling = SamplingConfig(temperature=1.0, top_k=10, top_p=0.9)
    state = torch.get_rng_state()
    a = peer_generate(decoder, PROMPT, "hf-assisted", settings(4, sampling, 16, 5))
    assert torch.equal(torch.get_rng_state(), state)
    assert peer_generate(decoder, PROMPT, "hf-assisted", settings(4, sampling, 16, 5)).tokens == a.tokens
    others = {tuple(peer_generate(decoder, PROMPT, "hf-generate", settings(4, sampling, 8, s)).tokens)
              for s in range(3)}
    assert len(others) > 1


def test_sampling_kwargs_mirror_verispec_sampling():
    assert sampling_kwargs(GREEDY)["do_sample"] is False
    kw = sampling_kwargs(SamplingConfig(temperature=0.7, top_k=0, top_p=0.9))
    assert kw["do_sample"] is True and kw["temperature"] == 0.7 and kw["top_k"] == 0 and kw["top_p"] == 0.9
    assert kw["repetition_penalty"] == 1.0  # never inherited from the model's generation_config


def test_rounds_rebuilt_from_forward_calls():
    # Prompt of 10 tokens, γ = 4: round 1 feeds 14 (prompt + 4 drafts) and keeps 2 + correction; round 2 starts with
    # the cache at 12, feeds the correction + 4 drafts, all accepted (+ bonus); round 3 is cut to 1 token by the end.
    calls = [(0, 14, 0.3), (12, 5, 0.1), (17, 5, 0.1)]
    drafts = [(4, 0.04), (4, 0.04), (4, 0.04)]
    rounds = rounds_from_calls(calls, drafts, prompt_tokens=10, generated=9)
    assert [(r.drafted, r.accepted, r.emitted, r.fed) for r in rounds] == [(4, 2, 3, 14), (4, 4, 5, 5), (4, 0, 1, 5)]
    assert rounds[0].time_decode == 0.3 and rounds[0].time_draft == 0.04


def test_unknown_peer_is_an_error(decoder):
    with pytest.raises(ConfigError, match="unknown peer"):
        peer_generate(decoder, PROMPT, "hf-beam", settings(4, GREEDY, 8, 0))


def test_tiny_temperatures_run_the_peers_greedily():
    from verispec.bench.peers import sampling_kwargs
    from verispec.sampling import SamplingConfig

    assert sampling_kwargs(SamplingConfig(temperature=1e-320))["do_sample"] is False  # float32 / T would overflow
    assert sampling_kwargs(SamplingConfig(temperature=0.5))["do_sample"] is True
