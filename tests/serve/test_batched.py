"""The batched server (--max-batch N) on a tiny pair on the int4 path: concurrent requests with mixed methods,
temperatures and prompt lengths each get the completion they get alone offline; a client that leaves mid-stream
changes no other stream and frees its slot; requests beyond the batch wait and are served; the metrics' deltas
equal the requests' own counts."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.models.test_batched import int4_pair
from tests.serve.conftest import open_stream, request, running_server
from verispec import Decoder
from verispec.engine import DecodeConfig
from verispec.models.decoder_stack import stack_kernel
from verispec.models.quantized import quantized_engine
from verispec.serve import ServeConfig
from verispec.serve.batched import BatchedWorker

pytestmark = pytest.mark.skipif(quantized_engine() is None or stack_kernel() is None,
                                reason="needs torch's fbgemm engine and a C++ compiler")

CONFIG = ServeConfig(defaults=DecodeConfig(max_new_tokens=20), model_name="tiny", max_batch=4, max_queue=8)

# (prompt, the request's verispec options and sampling): mixed methods, drafters, temperatures and a long prompt
JOBS = [
    ("hello there", {"method": "sd"}, 0.0),
    ("the quick brown fox jumps over the lazy dog " * 2, {"method": "ar"}, 1.0),
    ("once upon a time", {"method": "bv", "drafter": "hybrid"}, 1.0),
    ("abc " * 30, {"method": "sd", "gamma": 3, "adaptive_gamma": False}, 1.0),  # over 64 tokens: read alone
    ("why is the sky blue?", {"method": "sd", "drafter": "ngram"}, 0.0),
    ("count: 1 2 3", {"method": "gbv", "paths": 2, "gamma": 3}, 1.0),
    # keyed draws: its draft length follows the load at T = 1 (load_follows), and its tokens are still its own
    ("tell me a story", {"method": "sd", "keyed_draws": True}, 1.0),
]
KEYED = len(JOBS) - 1


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    pair = int4_pair()
    return Decoder(pair["target"], pair["draft"])


def body(job: tuple[str, dict, float], seed: int, stream: bool = False) -> dict:
    prompt, options, temperature = job
    return {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "temperature": temperature,
            "seed": seed, "stream": stream, "verispec": options}


def offline(decoder: Decoder, job: tuple[str, dict, float], seed: int) -> str:
    prompt, options, temperature = job
    return decoder.generate(prompt, max_new_tokens=20, temperature=temperature, seed=seed, **options).text


def stream_text(url: str, payload: dict, leave_after: int | None = None) -> str:
    """Stream a chat request; return its text (with `leave_after`, close the connection after that many chunks)."""
    events = open_stream(url, payload, timeout=120)
    text, chunks = "", 0
    for event in events:
        if event == "[DONE]":
            continue
        if event["choices"]:
            text += event["choices"][0]["delta"].get("content") or ""
            chunks += 1
        if leave_after is not None and chunks >= leave_after:
            events.close()
            break
    return text


def samples(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = request(url, "GET", "/metrics")[2]
    return {s.name + json.dumps(s.labels, sort_keys=True): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_concurrent_requests_get_their_offline_completions_and_the_metrics_add_up(decoder, one_thread):
    expected = [offline(decoder, job, seed) for seed, job in enumerate(JOBS)]
    assert len(set(expected)) == len(JOBS)  # different completions: a mix-up would show
    prompt, _, temperature = JOBS[KEYED]  # keyed: the same tokens as keyed ar, whatever the draft length
    assert offline(decoder, (prompt, {"method": "ar", "keyed_draws": True}, temperature), KEYED) == expected[KEYED]
    with running_server(decoder, CONFIG) as (url, app):
        backend = app.state.backend
        assert isinstance(backend, BatchedWorker)
        before = samples(url)
        with ThreadPoolExecutor(len(JOBS)) as pool:  # 7 requests, 4 slots: three wait in the queue
            replies = list(pool.map(lambda i: request(url, "POST", "/v1/chat/completions", body(JOBS[i], i)),
                                    range(len(JOBS))))
        assert [status for status, _, _ in replies] == [200] * len(JOBS)
        assert [reply["choices"][0]["message"]["content"] for _, _, reply in replies] == expected
        after = samples(url)
        assert backend.batcher is not None and backend.batcher.batched_rows > 0  # passes were shared

    def delta(name: str, labels: str = "{}") -> float:
        return after.get(name + labels, 0.0) - before.get(name + labels, 0.0)

    stats = [reply["verispec"] for _, _, reply in replies]
    assert [s["keyed_draws"] for s in stats] == [i == KEYED for i in range(len(JOBS))]
    assert delta("verispec:spec_decode_num_draft_tokens_total") == sum(s["drafted_tokens"] for s in stats)
    assert delta("verispec:spec_decode_num_accepted_tokens_total") == sum(s["accepted_tokens"] for s in stats)
    assert delta("verispec:spec_decode_num_accepted_tokens_per_pos_total", '{"position": "0"}') > 0
    assert delta("verispec:request_queue_time_seconds_count") == len(JOBS)
    assert delta("verispec_generated_tokens_total") == sum(r["usage"]["completion_tokens"] for _, _, r in replies)
    assert after["verispec:num_requests_running{}"] == 0 and after["verispec:num_requests_waiting{}"] == 0


def test_a_client_that_leaves_changes_no_other_stream_and_frees_its_slot(decoder, one_thread):
    jobs = JOBS[:3]
    expected = [offline(decoder, job, 10 + i) for i, job in enumerate(jobs)]
    config = ServeConfig(defaults=DecodeConfig(max_new_tokens=20), model_name="tiny", max_batch=2, max_queue=8)
    with running_server(decoder, config) as (url, _):
        got: dict[int, str] = {}
        leaver = threading.Thread(target=lambda: stream_text(url, body(JOBS[4], 99), leave_after=1))
        leaver.start()
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, stream_text(url, body(jobs[i], 10 + i))))
                   for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in (leaver, *threads):
            thread.join(120)
        assert [got[i] for i in range(len(jobs))] == expected  # three streams through two slots, one freed early
        # The slots are free again: one more request is served at once
        status, _, reply = request(url, "POST", "/v1/chat/completions", body(jobs[0], 10))
        assert status == 200 and reply["choices"][0]["message"]["content"] == expected[0]


def test_max_batch_is_checked_and_a_server_wide_draft_vocab_serves_one_at_a_time():
    from verispec.errors import ConfigError
    from verispec.serve import create_app
    from verispec.serve.worker import EngineWorker

    for bad in (0, 65, 2.5, True):
        with pytest.raises(ConfigError, match="max_batch"):
            ServeConfig(max_batch=bad)
    app = create_app(Decoder(), ServeConfig(defaults=DecodeConfig(draft_vocab=1000), max_batch=4))
    assert type(app.state.backend) is EngineWorker
    assert type(create_app(Decoder(), ServeConfig(max_batch=1)).state.backend) is EngineWorker
    assert type(create_app(Decoder(), ServeConfig()).state.backend) is BatchedWorker


def test_the_draft_length_follows_the_load_only_where_it_cannot_change_tokens_unless_asked():
    # (T = 0, or keyed draws at any temperature)
    from verispec.serve.batched import load_follows

    greedy, sampled = DecodeConfig(method="sd"), DecodeConfig().with_settings(method="sd", temperature=1.0)
    lossy = DecodeConfig().with_settings(method="typical")
    keyed = sampled.with_settings(keyed_draws=True)
    assert load_follows(greedy, "invariant") and load_follows(keyed, "invariant")
    assert not load_follows(sampled, "invariant") and not load_follows(lossy, "invariant")
    assert load_follows(sampled, "always") and not load_follows(greedy, "off")
    with pytest.raises(Exception, match="load_gamma"):
        ServeConfig(load_gamma="sometimes")
    from verispec.cli import build_parser

    args = build_parser().parse_args(["serve", "--max-batch", "2", "--load-gamma", "off"])
    assert (args.max_batch, args.load_gamma) == (2, "off")
    assert build_parser().parse_args(["serve"]).max_batch == ServeConfig().max_batch == 4


@pytest.mark.parametrize(("argv", "chunk"), [([], None), (["--max-batch", "1"], None), (["--prompt-chunk", "0"], None),
                                             (["--prompt-chunk", "16"], 16), (["--max-batch", "1", "--prompt-chunk",
                                                                               "8"], 8)])
def test_a_server_reads_prompts_in_one_pass_unless_told(argv, chunk):
    from verispec.cli import build_parser
    from verispec.serve.cli import serve_config

    assert serve_config(build_parser().parse_args(["serve", *argv])).defaults.prompt_chunk == chunk
