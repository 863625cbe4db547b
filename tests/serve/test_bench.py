"""`verispec bench-serve` against a real server on the tiny models: every request counted, figures consistent."""

from __future__ import annotations

import json

from tests.serve.conftest import running_server
from verispec.cli import main
from verispec.serve.bench import ServeBenchConfig, format_table, run_serve_bench


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
