"""HumanEval pass@1 by execution: right and wrong completions, the time limit, the stop rule, the sandbox's claims."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from verispec.bench.execution import (
    check_completion,
    completion_program,
    function_end,
    humaneval_problems,
    network_isolation,
    truncate_at_stop,
)
from verispec.bench.quality import quality_records, summarize_quality
from verispec.errors import VerispecError
from verispec.models.tabular import TabularLM

PROBLEM = {
    "task_id": "Test/0",
    "prompt": 'import math\n\n\ndef add(a, b):\n    """Return a + b."""\n',
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


def test_right_and_wrong_bodies_score_one_and_zero():
    assert check_completion(PROBLEM, "    return a + b\n").passed
    wrong = check_completion(PROBLEM, "    return a - b\n")
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.detail


def test_a_whole_function_in_a_fence_with_chatter_and_prints_is_cut_at_the_stop_rule():
    answer = ("Here is the function:\n\n```python\nimport math\n\ndef add(a, b):\n    return a + b\n\n"
              "print(add(1, 2))\nwhile True:\n    pass\n```\nIt adds the numbers.")
    program = completion_program(PROBLEM, answer)
    assert program.endswith("def add(a, b):\n    return a + b\n") and "while True" not in program
    assert check_completion(PROBLEM, answer).passed


def test_stop_sequences():
    assert truncate_at_stop("    return 1\n\ndef other():\n    pass") == "    return 1\n"
    assert truncate_at_stop("    x = 1\n# trailing comment\n") == "    x = 1"
    assert truncate_at_stop("    return 2\nif __name__ == '__main__':\n    main()") == "    return 2"
    assert truncate_at_stop("    return 3\n") == "    return 3\n"
    # A body (no def of the entry point) continues the stub and ends at the first new top-level line.
    assert completion_program(PROBLEM, "    return a + b\nclass Extra:\n    pass\n").endswith("    return a + b")


def test_an_infinite_loop_is_stopped_by_the_time_limit():
    start = time.monotonic()
    result = check_completion(PROBLEM, "    while True:\n        pass\n", timeout=2.0)
    assert not result.passed and result.status == "timed out"
    assert time.monotonic() - start < 15  # killed, not waited for


def test_exiting_early_with_status_zero_does_not_pass():
    assert not check_completion(PROBLEM, "    import sys\n    sys.exit(0)\n").passed
    assert not check_completion(PROBLEM, "    import os\n    os._exit(0)\n").passed


@pytest.mark.parametrize("write", [
    "open({path!r}, 'w').write('x')",
    "__import__('pathlib').Path({path!r}).write_text('x')",
    "__import__('os').open({path!r}, __import__('os').O_WRONLY | __import__('os').O_CREAT)",
    "__import__('shutil').rmtree({parent!r})",
    "__import__('subprocess').Popen(['touch', {path!r}])",
    "__import__('os').system('touch ' + {path!r})",
])
def test_writes_outside_the_temporary_directory_are_refused(tmp_path, write):
    target = tmp_path / f"outside-{uuid.uuid4().hex}.txt"
    body = f"    {write.format(path=str(target), parent=str(tmp_path))}\n    return a + b\n"
    result = check_completion(PROBLEM, body)
    assert not result.passed and "PermissionError" in result.detail
    assert not target.exists() and tmp_path.exists()


def test_writes_inside_the_temporary_directory_are_allowed():
    body = "    open('scratch.txt', 'w').write('x')\n    assert open('scratch.txt').read() == 'x'\n    return a + b\n"
    assert check_completion(PROBLEM, body).passed


@pytest.fixture
def listener():
    """A TCP server on the host's loopback that records whether anything connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    seen, stop = [], threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                seen.append(server.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join()
    server.close()


def test_a_socket_through_the_socket_module_is_refused(listener):
    port, seen = listener
    body = f"    __import__('socket').create_connection(('127.0.0.1', {port}), timeout=2)\n    return a + b\n"
    assert not check_completion(PROBLEM, body).passed
    assert seen == []


def test_the_network_namespace_stops_a_socket_that_bypasses_the_guard(listener):
    """The C-level `_socket` module skips the Python guard; only the network namespace stands in its way."""
    if not network_isolation():
        pytest.skip("no network namespace on this machine (unshare unavailable): only the Python guard applies")
    port, seen = listener
    body = (f"    s = __import__('_socket').socket()\n    s.settimeout(2)\n    s.connect(('127.0.0.1', {port}))\n"
            "    return a + b\n")
    result = check_completion(PROBLEM, body)
    assert not result.passed and "Error" in result.detail
    assert seen == []


def test_every_humaneval_canonical_solution_in_a_sample_passes():
    """The harness agrees with the dataset: canonical solutions pass, an empty body fails (8 problems)."""
    try:
        problems = humaneval_problems()
    except VerispecError as missing:
        pytest.skip(str(missing))
    assert len(problems) == 164
    for task_id in list(problems)[::21]:
        problem = problems[task_id]
        assert check_completion(problem, problem["canonical_solution"]).passed, task_id
        assert not check_completion(problem, "    pass\n").passed, task_id


class _Decoder:
    """Just what `quality_records` needs: a prompt encoding and a target model to score with."""

    def __init__(self) -> None:
        self.target = TabularLM(6, seed=1)

    def encode_prompt(self, text: str, chat_template: bool = True) -> list[int]:
        return [0, 1]

    def model(self, name: str) -> TabularLM:
        return self.target


def test_quality_records_add_pass_at_1_for_problems_only():
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    records = [{"prompt_index": 0, "prompt": "p", "prompt_tokens": 2, "method": m, "tokens": [1, 2], "text": t}
               for m, t in (("ar", right), ("draft", "    return 0\n"))]
    records.append({"prompt_index": 1, "prompt": "q", "prompt_tokens": 2, "method": "ar", "tokens": [3],
                    "text": "no problem here"})
    quality_records(records, _Decoder(), problems={0: PROBLEM, 1: None})
    assert [r["quality"].get("passed") for r in records] == [1.0, 0.0, None]
    assert records[0]["quality"]["execution"] == "passed"
    assert summarize_quality(records[:1])["pass_at_1"] == 1.0
    summary = summarize_quality(records)
    assert summary["pass_at_1"] == 0.5 and summary["pass_at_1_prompts"] == 2


def test_the_temporary_directory_is_removed():
    body = "    print('DIR', __import__('os').getcwd())\n    return a + b\n"
    before = set(Path("/tmp").glob("verispec-exec-*"))
    assert check_completion(PROBLEM, body).passed
    assert set(Path("/tmp").glob("verispec-exec-*")) <= before


ANSWERS = [
    "Sure! Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nThe function adds.\n```python\nx\n```",
    "```\nimport math\n\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\n```",
    "def add(a, b):\n    return a + b\n\n\nif __name__ == '__main__':\n    print(add(1, 2))\n",
    "def helper():\n    return 0\n\ndef add(a, b):\n    return a + b + helper()\n# done\nmore",
    "    return a + b\n\n\ndef unrelated():\n    pass\n",
    "    return a + b\n",
    "I cannot answer that.",
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_stopping_where_function_end_fires_keeps_the_program(answer):
    """Decoding past the point where `function_end` fires cannot change the program that is scored."""
    done = function_end(PROBLEM)
    first = next((n for n in range(1, len(answer) + 1) if done(answer[:n])), None)
    if first is None:
        return
    assert completion_program(PROBLEM, answer[:first]) == completion_program(PROBLEM, answer)
    assert all(done(answer[:n]) for n in range(first, len(answer) + 1))  # once complete, always complete


def test_function_end_fires_on_complete_answers_only():
    done = function_end(PROBLEM)
    assert done(ANSWERS[0][: ANSWERS[0].index("The function")])
    assert not done("Sure! Here it is:\n```python\ndef add(a, b):\n    return a + b\n")  # the fence is open
    assert not done("def helper():\n    return 0\n\ndef ")  # a helper's end is not the entry point's
    assert done(ANSWERS[2]) and done(ANSWERS[4]) and not done(ANSWERS[5]) and not done(ANSWERS[6])
