"""Run vLLM's offline engine on token-id prompts, from a JSON job, in vLLM's own environment (`.venv-vllm`).

    .venv-vllm/bin/python -m verispec.vllm.run JOB.json OUT.json
    .venv-vllm/bin/python -m verispec.vllm.run --worker ENGINE_JSON     (the bench peers' worker: `worker`)

JOB: {"engine": {keyword arguments of vllm.LLM: model, dtype, speculative_config, ...},
      "prompts": [[token ids], ...], "max_tokens": N, "temperature": T, "seeds": [one per prompt] or null,
      "ignore_eos": bool, "rule": verispec rule name or null, "repeat": timed repeats (default 1)}
OUT: {"vllm": version, "load_seconds": s, "generate_seconds": [s per repeat], "outputs": [[token ids], ...],
      "counts": vLLM's spec-decode counters over every repeat (`spec_counts`), where the engine has
      "disable_log_stats": false, else null}

The tests and the bench peers drive vLLM through this one script in a subprocess: vLLM pins its own transformers,
so it lives in a virtualenv of its own, and each run starts from a clean process (vLLM's engine keeps global
state). "rule" sets VERISPEC_VLLM_RULE before vLLM starts, so the plugin (`verispec.vllm.register`) installs it in
every vLLM process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from verispec.bench.files import write_atomically


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Load the engine, generate for every prompt (`repeat` times, timed), and return the outputs of the last."""
    if job.get("rule"):
        os.environ["VERISPEC_VLLM_RULE"] = job["rule"]
    start = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**job["engine"])
    load_seconds = time.perf_counter() - start
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    seeds = job.get("seeds") or [None] * len(prompts)
    params = [SamplingParams(temperature=job.get("temperature", 0.0), max_tokens=job["max_tokens"], seed=seed,
                             ignore_eos=job.get("ignore_eos", True)) for seed in seeds]
    times, outputs = [], []
    for _ in range(job.get("repeat", 1)):
        begin = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - begin)
    counts = None if job["engine"].get("disable_log_stats", True) else spec_counts(llm)
    return {"vllm": vllm.__version__, "load_seconds": load_seconds, "generate_seconds": times,
            "outputs": [list(out.outputs[0].token_ids) for out in outputs], "counts": counts}


def run_in_subprocess(job: dict[str, Any], env: dict[str, str] | None = None, python: str = sys.executable,
                      timeout: float | None = None) -> tuple[dict[str, Any] | None, str]:
    """Run `job` in a fresh process of `python` (vLLM's environment); return (its result, or None when it failed,
    and its standard error)."""
    with tempfile.TemporaryDirectory(prefix="verispec-vllm-") as scratch:
        job_path, out_path = Path(scratch) / "job.json", Path(scratch) / "out.json"
        job_path.write_text(json.dumps(job))
        done = subprocess.run([python, "-m", "verispec.vllm.run", str(job_path), str(out_path)],
                              env=os.environ | (env or {}), capture_output=True, text=True, timeout=timeout)
        result = json.loads(out_path.read_text()) if done.returncode == 0 else None
    return result, done.stderr


SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}


def spec_counts(llm: Any) -> dict[str, int]:
    """Return vLLM's spec-decode counters (drafts, draft tokens, accepted tokens), summed over engines."""
    counts = dict.fromkeys(SPEC_COUNTERS.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS and hasattr(metric, "value"):
            counts[SPEC_COUNTERS[metric.name]] += int(metric.value)
    return counts


def worker(engine: dict[str, Any]) -> None:
    """Load `vllm.LLM(**engine)` once, then answer one JSON request per line of standard input until it ends.

    Request: {"prompt": [token ids], "max_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids"}.
    Reply, one JSON line: {"tokens", "seconds" (wall time of `LLM.generate`), "counts" (the spec-decode counters'
    increments)}; the first line is {"vllm": version, "load_seconds"}, and a failure is {"error": text}. Replies go
    to the standard output the process started with; everything else that writes to it goes to standard error.
    """
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM and its libraries log to stdout: keep the reply channel clean
    start = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**engine)
    replies.write(json.dumps({"vllm": vllm.__version__, "load_seconds": time.perf_counter() - start}) + "\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            prompt = TokensPrompt(prompt_token_ids=request.pop("prompt"))
            params = SamplingParams(**request)
            before = spec_counts(llm)
            begin = time.perf_counter()
            output = llm.generate([prompt], params, use_tqdm=False)[0]
            seconds = time.perf_counter() - begin
            after = spec_counts(llm)
            reply = {"tokens": list(output.outputs[0].token_ids), "seconds": seconds,
                     "counts": {key: after[key] - before[key] for key in after}}
        except Exception as exc:  # the parent shows it and stops the run; this process ends with its input
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")


def main() -> None:
    if sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return
    job_path, out_path = sys.argv[1:3]
    result = run(json.loads(Path(job_path).read_text()))
    write_atomically(Path(out_path), json.dumps(result))


if __name__ == "__main__":  # vLLM starts its engine in spawned processes, which re-import this module
    main()
