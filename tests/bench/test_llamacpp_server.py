"""llama.cpp's server with several slots (the serving peers of benchmarks/serve_batching.py): its command line, the
request fields that make it sample as verispec does, and a clear error when it does not start."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.bench.test_llamacpp import _install_binary
from verispec.bench.llamacpp import CONTEXT, LlamaCppError, LlamaCppPeers, request_body, sampler_fields, server_command
from verispec.sampling import SamplingConfig


def _flags(cmd: list[str]) -> dict[str, str]:
    return {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("--")}


def test_each_of_n_slots_gets_the_context_of_one():
    cmd = server_command(Path("/b/llama-server"), Path("t.gguf"), None, gamma=4, threads=2, port=1, context=4096,
                         slots=8)
    flag = _flags(cmd)
    assert flag["--parallel"] == "8" and flag["--ctx-size"] == str(8 * 4096)
    assert "--no-kv-unified" in cmd  # else -c would be one pool shared by all slots, not split among them
    assert "--cont-batching" in cmd and "--no-webui" in cmd
    assert "--no-cache-prompt" in cmd and flag["--cache-ram"] == "0"
    assert flag["--threads"] == flag["--threads-batch"] == "2"
    assert not any(a.startswith("--spec") for a in cmd)
    one = _flags(server_command(Path("/b/llama-server"), Path("t.gguf"), None, gamma=4, threads=2, port=1))
    assert one["--parallel"] == "1" and one["--ctx-size"] == str(CONTEXT)


def test_the_speculative_server_drafts_gamma_tokens_in_every_slot():
    cmd = server_command(Path("/b/llama-server"), Path("t.gguf"), Path("d.gguf"), gamma=4, threads=2, port=1,
                         slots=4)
    flag = _flags(cmd)
    assert flag["--spec-draft-model"] == "d.gguf" and flag["--spec-type"] == "draft-simple"  # -md's long name
    assert flag["--spec-draft-n-max"] == "4" and flag["--spec-draft-n-min"] == "0"
    assert flag["--spec-draft-threads"] == "2" and flag["--parallel"] == "4"


def test_sampler_fields_are_verispec_sampling_for_every_endpoint():
    fields = sampler_fields(SamplingConfig(temperature=1.0, top_k=0, top_p=1.0))
    assert (fields["temperature"], fields["top_k"], fields["top_p"]) == (1.0, 0, 1.0)
    assert fields["samplers"] == ["temperature", "top_k", "top_p"] and fields["min_p"] == 0.0
    assert fields["cache_prompt"] is False
    body = request_body([1, 2], 8, SamplingConfig(temperature=1.0), seed=3)
    assert body | fields == body  # /completion carries the same fields


def test_a_server_with_slots_that_does_not_start_names_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the servers' logs, kept after an error
    _install_binary("import sys\nprint('error: failed to load model')\nsys.exit(1)\n")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"not a gguf file")
    peers = LlamaCppPeers(["llamacpp-generate"], str(gguf), None, threads=2, slots=4)
    with pytest.raises(LlamaCppError, match=r"llamacpp-generate\.log\).*failed to load model"), peers:
        peers.server("llamacpp-generate", gamma=4)
    server = peers.servers["llamacpp-generate", 0, "native"]
    assert _flags(server.command)["--parallel"] == "4" and server.log_path.exists()
