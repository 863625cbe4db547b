"""The vLLM bench peers without vLLM: labels, model folders, traces from vLLM's counters, and the worker protocol
against a stand-in `vllm` module (the real engine: tests/vllm/test_bench_peer.py, `make test-vllm`)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from verispec.bench.vllm import (
    PYTHON_ENV,
    VllmPeerError,
    VllmPeers,
    build_trace,
    engine_settings,
    hf_folder,
    sampling_settings,
    speculative_method,
    vllm_python,
)
from verispec.errors import ConfigError
from verispec.sampling import SamplingConfig

# A stand-in for vllm's offline API: generate() writes the prompt's tokens + 1 and counts one draft of 3 tokens, 2
# accepted, per request; a prompt holding -1 fails.
FAKE_VLLM = '''
__version__ = "0.32.0"
from types import SimpleNamespace


class SamplingParams:
    def __init__(self, **fields):
        self.fields = fields


class LLM:
    def __init__(self, **engine):
        print("engine log line on stdout")  # must not reach the reply channel
        self.engine, self.requests = engine, 0

    def generate(self, prompts, params, use_tqdm=False):
        ids = prompts[0]["prompt_token_ids"]
        if -1 in ids:
            raise ValueError("bad token")
        self.requests += 1
        out = [i + 1 for i in ids][: params.fields["max_tokens"]]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=out)])]

    def get_metrics(self):
        n = self.requests
        return [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=n),
                SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=3 * n),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=2 * n)]
'''
FAKE_INPUTS = "def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A `vllm` package on PYTHONPATH and this Python as vLLM's, for the workers."""
    package = tmp_path / "fake" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    (package / "inputs.py").write_text(FAKE_INPUTS)
    import verispec

    root = str(Path(verispec.__file__).parent.parent)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'fake'}:{root}")
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    return tmp_path


def test_labels_and_settings():
    assert speculative_method("vllm-speculative") == "draft_model"
    assert speculative_method("vllm-speculative:method=ngram") == "ngram"
    with pytest.raises(ConfigError, match=r"'eagle'.*draft_model, ngram"):
        speculative_method("vllm-speculative:method=eagle")
    assert sampling_settings(SamplingConfig(temperature=0.0)) == {"temperature": 0.0}
    assert sampling_settings(SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)) == {
        "temperature": 0.7, "top_k": 5, "top_p": 0.9}
    plain = engine_settings("m", None, "vllm-generate", 4, 2)
    assert "speculative_config" not in plain and plain["max_num_seqs"] == 1 and not plain["disable_log_stats"]
    assert engine_settings("m", "d", "draft_model", 4, 2)["speculative_config"] == {
        "method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    assert engine_settings("m", None, "ngram", 3, 2)["speculative_config"]["num_speculative_tokens"] == 3


def test_model_folders(tmp_path):
    with pytest.raises(ConfigError, match="GGUF"):
        hf_folder(str(tmp_path / "model.gguf"), "target")
    with pytest.raises(ConfigError, match="GGUF"):
        hf_folder("default-q4_0", "target")
    assert hf_folder(str(tmp_path), "target") == str(tmp_path)
    assert hf_folder("Qwen/Qwen2.5-0.5B", "draft") == "Qwen/Qwen2.5-0.5B"


def test_missing_vllm_python_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nope" / "python"))
    with pytest.raises(ConfigError, match="make vllm"):
        vllm_python()
    monkeypatch.delenv(PYTHON_ENV)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"\.venv-vllm"):
        VllmPeers(["ar", "vllm-generate"], str(tmp_path), None, 1)


@pytest.mark.parametrize("generated", [0, 1, 7, 12])
def test_trace_totals_are_vllms(generated):
    counts = {"drafts": 3, "draft_tokens": 9, "accepted": 5}
    trace = build_trace(20, generated, counts, 2.0)
    assert sum(r.emitted for r in trace.rounds) == generated
    assert trace.rounds[0].fed == 20 and trace.prefill_tokens == 20
    assert trace.draft_tokens == 9 and trace.draft_calls == 3
    if generated >= 12:  # nothing cut: the drafted and accepted tokens are vLLM's totals
        assert sum(r.drafted for r in trace.rounds) == 9 and sum(r.accepted for r in trace.rounds) == 5
    assert trace.time_total == 2.0 and sum(r.time_decode for r in trace.rounds) == pytest.approx(2.0)


def test_worker_protocol(fake_vllm, tmp_path):
    with VllmPeers(["vllm-generate", "vllm-speculative:method=ngram"], str(tmp_path), None, 1) as peers:
        tokens, trace, report = peers.generate("vllm-speculative:method=ngram", [5, 6, 7], 3,
                                               SamplingConfig(temperature=0.0), 2, 0, [0])
        assert tokens == [6, 7] and report["counts"] == {"drafts": 1, "draft_tokens": 3, "accepted": 2}
        assert report["vllm"] == "0.32.0" and report["speculative"] == "ngram"
        tokens, _, _ = peers.generate("vllm-speculative:method=ngram", [1], 3, SamplingConfig(), 5, 0, [0])
        assert tokens == [2]  # the same worker: its counters moved by this request only
        assert peers.version()["vllm"] == "0.32.0"
        with pytest.raises(VllmPeerError, match="ValueError: bad token"):
            peers.generate("vllm-generate", [-1], 4, SamplingConfig(), 2, 0, [0])
        with pytest.raises(ConfigError, match="context"):
            peers.generate("vllm-generate", [1] * 4096, 4, SamplingConfig(), 2, 0, [0])
        workers = list(peers.workers.values())
    assert all(w.process.returncode == 0 for w in workers)  # each ended with its input


def test_worker_that_cannot_start_shows_its_log(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nowhere"))  # no vllm to import
    with VllmPeers(["vllm-generate"], str(tmp_path), None, 1) as peers:
        with pytest.raises(VllmPeerError, match=r"(?s)died during start-up.*No module named 'vllm'"):
            peers.generate("vllm-generate", [1], 4, SamplingConfig(), 2, 0, [0])


def test_peers_take_turns_where_memory_is_short(fake_vllm, tmp_path, monkeypatch):
    import verispec.bench.vllm as peers_module

    monkeypatch.setattr(peers_module, "available_memory", lambda: 2**20)  # 1 MB: no room for a second worker
    with VllmPeers(["vllm-generate", "vllm-speculative:method=ngram"], str(tmp_path), None, 1) as peers:
        assert peers.generate("vllm-generate", [1], 3, SamplingConfig(), 2, 0, [0])[0] == [2]
        first = peers.workers[("vllm-generate", 0)]
        with pytest.warns(UserWarning, match="take turns"):
            peers.generate("vllm-speculative:method=ngram", [4], 3, SamplingConfig(), 2, 0, [0])
        assert list(peers.workers) == [("ngram", 3)] and first.process.returncode == 0  # stopped, not killed
        assert peers.generate("vllm-generate", [1], 3, SamplingConfig(), 2, 0, [0])[0] == [2]  # started again
        assert peers.version() == {"vllm": "0.32.0", "python": sys.executable, "reloads": 2}
    log_dir = peers.log_dir
    assert not log_dir.exists()  # a run that ended well leaves no logs behind
