"""Drafter settings through the server: per-request `verispec` fields, their errors, and server-wide defaults."""

from __future__ import annotations

import copy

import pytest

import verispec.api as api
from tests.serve.conftest import request, running_server
from verispec import Decoder
from verispec.cli import main
from verispec.engine import DecodeConfig
from verispec.models.hf import HFCausalLM
from verispec.serve import ServeConfig
from verispec.serve.schemas import APIError, CompletionRequest, settings

# Repetitive, so that prompt lookup finds matches from the first round on.
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n    return"
CONFIG = ServeConfig(defaults=DecodeConfig(max_new_tokens=24), model_name="tiny")


def complete(url: str, max_tokens: int = 20, **body) -> dict:
    """Return the body of one non-streamed completion of PROMPT (asserting it succeeded)."""
    status, _, answer = request(url, "POST", "/v1/completions",
                                {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens} | body)
    assert status == 200, answer
    return answer


def drafted(generation) -> int:
    return sum(r.drafted for r in generation.trace.rounds)


@pytest.fixture(scope="module")
def server(decoder, one_thread):
    with running_server(decoder, CONFIG) as (url, _):
        yield url


@pytest.mark.parametrize("method, drafter", [("sd", "ngram"), ("bv", "ngram"), ("sd", "hybrid")])
def test_greedy_lookup_drafters_equal_ar_and_run_as_asked(server, decoder, method, drafter):
    options = {"method": method, "drafter": drafter, "ngram_min": 1, "ngram_max": 3}
    ar = complete(server, temperature=0, verispec={"method": "ar"})["choices"][0]["text"]
    answer = complete(server, temperature=0, verispec=options)
    stats = answer["verispec"]
    assert answer["choices"][0]["text"] == ar  # lossless drafters give the target's greedy output
    assert stats["drafter"] == drafter and stats["drafted_tokens"] > 0
    offline = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, **options)
    assert stats["draft_calls"] == offline.trace.draft_calls and stats["drafted_tokens"] == drafted(offline)
    if drafter == "ngram":
        assert stats["draft_calls"] == 0  # prompt lookup runs no draft model
    # the next request without a drafter gets its method's default, not this request's
    assert complete(server, temperature=0, verispec={"method": method})["verispec"]["drafter"] == \
        DecodeConfig(method=method).drafter


def test_ngram_gamma_reaches_the_engine(server, decoder):
    options = {"drafter": "ngram", "ngram_min": 1, "ngram_gamma": 8}
    stats = complete(server, temperature=0, verispec=options)["verispec"]
    offline = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, **options)
    assert stats["drafted_tokens"] == drafted(offline)
    assert max(r.drafted for r in offline.trace.rounds) > CONFIG.defaults.gamma  # longer lookup rounds than γ


def test_draft_confidence_at_temperature_1_ends_drafts_early(server, decoder):
    kwargs = {"temperature": 1.0, "seed": 7}
    answer = complete(server, **kwargs, verispec={"draft_confidence": 0.5, "drafter": "model"})
    kwargs["drafter"] = "model"  # every round drafted by the model (the hybrid's lookup rounds have no q to stop on)
    offline = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, draft_confidence=0.5, **kwargs)
    assert answer["choices"][0]["text"] == offline.text
    assert answer["verispec"]["drafted_tokens"] == drafted(offline)
    full = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, **kwargs)
    assert drafted(offline) / len(offline.trace.rounds) < drafted(full) / len(full.trace.rounds)
    seeded = {"temperature": 1.0, "seed": 7}
    assert complete(server, **seeded, verispec={"draft_confidence": 1, "drafter": "model"})["verispec"][
        "drafted_tokens"] > 0


def test_hybrid_catchup_reaches_the_engine(server, decoder):
    # With no catch-up allowed, the hybrid's draft model stays out of every round after one where lookup drafted.
    for catchup in (0, 2.5):
        options = {"drafter": "hybrid", "ngram_min": 1, "hybrid_catchup": catchup}
        stats = complete(server, temperature=0, verispec=options)["verispec"]
        offline = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, **options)
        assert (stats["draft_calls"], stats["drafted_tokens"]) == (offline.trace.draft_calls, drafted(offline))
    never = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, drafter="hybrid", ngram_min=1,
                             hybrid_catchup=0)
    always = decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, drafter="hybrid", ngram_min=1,
                              hybrid_catchup=float("inf"))
    assert never.trace.draft_calls < always.trace.draft_calls  # the setting changes what runs


GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
T1 = {"temperature": 1.0}


@pytest.mark.parametrize(
    "body, param, words",
    [
        (GOOD | {"verispec": {"drafter": "oracle"}}, "verispec.drafter", "unknown drafter 'oracle'"),
        (GOOD | {"verispec": {"drafter": 3}}, "verispec.drafter", "valid string"),
        (GOOD | {"verispec": {"method": "ar", "drafter": "ngram"}}, "verispec.drafter", "takes no drafter"),
        (GOOD | {"verispec": {"drafter": "ngram", "ngram_min": 4, "ngram_max": 2}}, "verispec.ngram_min",
         "must not exceed ngram_max"),
        (GOOD | {"verispec": {"ngram_max": 1}}, "verispec.ngram_max", "ngram_min (2) must not exceed ngram_max (1)"),
        (GOOD | {"verispec": {"ngram_min": 0}}, "verispec.ngram_min", "ngram_min (the shortest n-gram looked up)"),
        (GOOD | {"verispec": {"ngram_min": "1"}}, "verispec.ngram_min", "valid integer"),
        (GOOD | {"verispec": {"ngram_max": 2.0}}, "verispec.ngram_max", "valid integer"),
        (GOOD | {"verispec": {"ngram_gamma": 0}}, "verispec.ngram_gamma", "ngram_gamma (the most tokens"),
        (GOOD | {"verispec": {"drafter": "hybrid", "hybrid_catchup": -1}}, "verispec.hybrid_catchup",
         "must be a number >= 0"),
        (GOOD | {"verispec": {"hybrid_catchup": "2"}}, "verispec.hybrid_catchup", "valid number"),
        (GOOD | T1 | {"verispec": {"draft_confidence": 0}}, "verispec.draft_confidence", "must be in (0, 1]"),
        (GOOD | T1 | {"verispec": {"draft_confidence": 1.5}}, "verispec.draft_confidence", "must be in (0, 1]"),
        (GOOD | T1 | {"verispec": {"draft_confidence": "0.5"}}, "verispec.draft_confidence", "valid number"),
        (GOOD | {"verispec": {"draft_confidence": 0.5}}, "verispec.draft_confidence", "needs temperature > 0"),
        (GOOD | {"temperature": 0, "verispec": {"draft_confidence": 0.5}}, "verispec.draft_confidence",
         "needs temperature > 0"),
        (GOOD | T1 | {"verispec": {"method": "gbv", "draft_confidence": 0.5}}, "verispec.draft_confidence",
         "ends a draft model's single path early"),
        (GOOD | T1 | {"verispec": {"drafter": "ngram", "draft_confidence": 0.5}}, "verispec.draft_confidence",
         "drafter 'ngram' drafts none"),
        (GOOD | {"verispec": {"draft_vocab": 64}}, "verispec.draft_vocab", "Extra inputs"),
    ],
)
def test_bad_drafter_settings_get_400_naming_the_field(server, body, param, words):
    status, _, answer = request(server, "POST", "/v1/chat/completions", body)
    assert status == 400, answer
    error = answer["error"]
    assert words in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"


def parsed(**body) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "hi"} | body)


def test_server_defaults_a_request_cannot_take_are_left_out_not_refused():
    defaults = DecodeConfig().with_settings(drafter="hybrid", draft_vocab=64, draft_confidence=0.3, temperature=1.0)
    config = settings(parsed(), defaults).config
    assert (config.drafter, config.draft_vocab, config.draft_confidence) == ("hybrid", 64, 0.3)
    greedy = settings(parsed(temperature=0.0), defaults).config  # draft_confidence needs T > 0
    assert (greedy.drafter, greedy.draft_vocab, greedy.draft_confidence) == ("hybrid", 64, None)
    lookup = settings(parsed(verispec={"drafter": "ngram"}), defaults).config  # no draft model: no head, no h
    assert (lookup.drafter, lookup.draft_vocab, lookup.draft_confidence) == ("ngram", None, None)
    ar = settings(parsed(verispec={"method": "ar"}), defaults).config  # drafts nothing
    assert (ar.method, ar.drafter, ar.draft_vocab, ar.draft_confidence) == ("ar", "model", None, None)
    # hybrid is sd's own default, so it is no server choice: gbv gets its own (model); a real choice carries over
    multipath = settings(parsed(verispec={"method": "gbv"}), defaults).config
    assert (multipath.drafter, multipath.draft_vocab, multipath.draft_confidence) == ("model", 64, None)
    lookup_server = defaults.with_settings(drafter="ngram", draft_vocab=None, draft_confidence=None)
    assert settings(parsed(verispec={"method": "gbv"}), lookup_server).config.drafter == "ngram"
    # What the request itself asks for is never left out: it is refused when it does not fit.
    with pytest.raises(APIError, match="needs temperature > 0") as refused:
        settings(parsed(temperature=0.0, verispec={"draft_confidence": 0.3}), defaults)
    assert refused.value.status == 400 and refused.value.param == "verispec.draft_confidence"


@pytest.fixture(scope="module")
def reduced_decoder(tiny_pair, tokenizer):
    """The target and a draft of its own weights with a head over half the vocabulary (the special tokens and the
    even ids)."""
    keep = [0, 1] + list(range(2, len(tokenizer), 2))
    draft = HFCausalLM(copy.deepcopy(tiny_pair["target"].model), tokenizer, name="tiny-same-reduced", vocab_ids=keep,
                         context_vocab=False)
    return Decoder(tiny_pair["target"], draft)


def test_a_server_wide_draft_vocab_serves_every_method_and_drafter(reduced_decoder, one_thread):
    n = reduced_decoder.model("draft").draft_vocab
    config = ServeConfig(defaults=DecodeConfig(max_new_tokens=24, draft_vocab=n), model_name="tiny")
    ar = reduced_decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, method="ar")
    with running_server(reduced_decoder, config) as (url, _):
        for options in ({}, {"method": "bv"}, {"drafter": "hybrid", "ngram_min": 1}, {"method": "gbv", "paths": 2},
                        {"drafter": "ngram", "ngram_min": 1}, {"method": "ar"}):
            answer = complete(url, temperature=0, verispec=options)
            assert answer["choices"][0]["text"] == ar.text, options
        offline = reduced_decoder.generate(PROMPT, chat_template=False, max_new_tokens=20, draft_vocab=n)
        stats = complete(url, temperature=0)["verispec"]
        assert stats["accepted_tokens"] == sum(r.accepted for r in offline.trace.rounds)
        assert 0 < stats["acceptance_rate"] < 1  # the same weights, half the head: some target tokens never drafted
        assert complete(url, temperature=1.0, verispec={"draft_confidence": 0.5})["verispec"]["drafted_tokens"] > 0


def test_the_server_loads_the_draft_with_the_reduced_head_before_any_request(tiny_pair, reduced_decoder, one_thread):
    class Recording(Decoder):
        def model(self, role):
            loads.append(role)
            return super().model(role)

        def reduced_draft(self, n):
            loads.append(("draft", n))
            return super().reduced_draft(n)

    loads = []
    n = reduced_decoder.model("draft").draft_vocab
    decoder = Recording(tiny_pair["target"], reduced_decoder.model("draft"))
    with running_server(decoder, ServeConfig(defaults=DecodeConfig(draft_vocab=n))):
        assert ("draft", n) in loads and "draft" not in loads  # the full-head draft is never asked for


def test_serve_flags_set_the_drafter_defaults(monkeypatch):
    from verispec.serve import cli as serve_cli

    seen = {}

    class NoServer:  # records what would be served instead of listening on a port
        def __init__(self, config, backend, grace) -> None:
            self.app, self.started = config.app, True

        def run(self) -> None:
            seen.update(config=self.app.state.config)

    monkeypatch.setattr(api, "Decoder", lambda *args, **kwargs: object())
    monkeypatch.setattr(serve_cli, "draining_server", NoServer)
    argv = ["serve", "--draft-vocab", "64", "--drafter", "hybrid", "--ngram-min", "1", "--ngram-max", "3",
            "--ngram-gamma", "6", "--draft-confidence", "0.3", "--temperature", "1"]
    assert main(argv) == 0
    defaults = seen["config"].defaults
    assert (defaults.draft_vocab, defaults.drafter, defaults.ngram_min, defaults.ngram_max, defaults.ngram_gamma,
            defaults.draft_confidence) == (64, "hybrid", 1, 3, 6, 0.3)
    assert main(["serve", "--drafter", "ngram", "--draft-vocab", "64"]) == 2  # a default no request could use
