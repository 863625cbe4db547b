"""Checks of user text before any model sees it: the prompt's type, emptiness and encoding.

Tokenizers reject text with lone surrogates (what Python makes of undecodable bytes in argv or a file read with
`surrogateescape`) with a TypeError from their Rust core; here the problem is named with its byte offset instead.
"""

from __future__ import annotations

from typing import Any

from verispec.errors import ConfigError

REPLACE_FLAG = "--replace-invalid-utf8"


def decode_utf8(data: bytes, source: str, replace: bool = False, flag: str | None = REPLACE_FLAG) -> str:
    """Return `data` decoded as UTF-8; invalid bytes raise ConfigError naming `source` and the first bad byte's
    offset (and `flag`, the option that replaces them, if any), or with `replace` become U+FFFD."""
    try:
        return data.decode("utf-8", errors="replace" if replace else "strict")
    except UnicodeDecodeError as exc:
        hint = f"; fix the text or pass {flag} to decode it with replacement characters" if flag else ""
        raise ConfigError(f"{source} is not valid UTF-8: byte {exc.start} (0x{data[exc.start]:02x}) "
                          f"{exc.reason}{hint}") from None


def check_prompt(prompt: Any, source: str = "the prompt") -> str:
    """Return `prompt` if it is non-empty text that can be encoded; else raise ConfigError saying what it is."""
    if not isinstance(prompt, str):
        raise ConfigError(f"the prompt must be a str, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ConfigError("the prompt is empty: give some text to continue")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        try:  # undecodable bytes (argv, a file read with surrogateescape) come back as surrogates: name the byte
            raw = prompt.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = None
        if raw is not None:
            decode_utf8(raw, source)  # raises, naming the byte offset, unless the escaped bytes happen to be valid
        raise ConfigError(f"{source} has invalid UTF-8 at character {exc.start} (a lone surrogate)") from None
    return prompt
