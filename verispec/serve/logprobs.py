"""Token log-probabilities for the responses: each token's text and bytes, and their release beside the text.

The engine hands over each committed token's log-probability (`verispec.logprobs.TokenLogprob`) just before the
round's tokens reach the text streamer, which holds text back (an incomplete character, a possible stop string).
`LogprobStream` keeps the entries until the text holding their tokens has been sent, so that each streamed chunk's
log-probabilities describe its own content and the chunks' entries concatenate to the non-streamed list. The
formats of both endpoints are in `verispec.serve.responses`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verispec.logprobs import TokenLogprob
from verispec.serve.streaming import REPLACEMENT, TextStream

LOGPROB_FLOOR = -9999.0  # JSON has no −inf: a token of probability 0 is written with OpenAI's floor


@dataclass(frozen=True)
class TokenText:
    """A token as a response shows it: its text and the UTF-8 bytes it stands for."""

    text: str  # `tokenizer.decode([id])`: U+FFFD where the token holds only part of a character
    bytes: list[int]  # the token's own bytes where the tokenizer says them, else the UTF-8 bytes of `text`


@dataclass(frozen=True)
class Entry:
    """One generated token's log-probability, ready for either endpoint's format."""

    token: TokenText
    logprob: float  # may be −inf (written as LOGPROB_FLOOR)
    offset: int  # characters of the output text before the token (inside a character: where that character starts)
    top: list[tuple[TokenText, float]] = field(default_factory=list)  # likeliest first


def _bytes_to_unicode() -> dict[int, str]:
    """Return GPT-2's map of the 256 byte values to printable characters (what byte-level BPE vocabularies store)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


_BYTE_OF_CHAR = {char: byte for byte, char in _bytes_to_unicode().items()}
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's pieces for single bytes


def _piece_bytes(piece: Any) -> bytes | None:
    """Return the bytes a vocabulary entry stands for, when it is a byte-level or byte-fallback piece."""
    if not isinstance(piece, str) or not piece:
        return None
    match = _BYTE_FALLBACK.fullmatch(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    if all(char in _BYTE_OF_CHAR for char in piece):
        return bytes(_BYTE_OF_CHAR[char] for char in piece)
    return None


def token_text(tokenizer: Any, token: int) -> TokenText:
    """Return `token`'s text and bytes. A token holding part of a character decodes to U+FFFD, whose bytes would say
    nothing: its own bytes are then read from its vocabulary entry (byte-level BPE, or SentencePiece byte fallback),
    as OpenAI reports them, so that a client can join the bytes of consecutive tokens into the character."""
    text = tokenizer.decode([token])
    if REPLACEMENT in text:
        own = _piece_bytes(tokenizer.convert_ids_to_tokens(token))
        if own is not None:
            return TokenText(text, list(own))
    return TokenText(text, list(text.encode("utf-8", errors="replace")))


class LogprobStream:
    """The log-probabilities of one generation, released as the text holding their tokens is sent.

    Token i's entry is released once the text of the first i+1 tokens fits within the characters sent: its own text
    has then gone out. Entries of tokens past the stop string's end (`TextStream.kept_tokens`) never are.
    """

    def __init__(self, text: TextStream, describe: Callable[[int], TokenText]) -> None:
        self._text = text
        self._describe = describe  # token id -> TokenText (the worker's, holding the tokenizer lock)
        self._names: dict[int, TokenText] = {}  # ids seen so far: top alternatives repeat them round after round
        self._entries: list[TokenLogprob] = []  # one per committed token, in the order of `text.tokens`
        self._released = 0  # entries handed out
        self._start = 0  # characters before the next entry's token

    def add(self, entries: list[TokenLogprob]) -> None:
        """Take a round's entries (the engine's `on_logprobs`, called before that round's tokens are pushed)."""
        self._entries.extend(entries)

    def release(self) -> list[Entry]:
        """Return the entries of the tokens whose text has been sent since the last call (call after a delta)."""
        out = []
        while self._released < min(self._text.kept_tokens, len(self._entries)):
            prefix = self._text.prefix(self._released + 1)
            if len(prefix) > self._text.sent:
                break
            out.append(self._next(prefix))
        return out

    def rest(self) -> list[Entry]:
        """Return the entries not released yet, up to the last kept token (generation has ended)."""
        out = []
        while self._released < min(self._text.kept_tokens, len(self._entries)):
            out.append(self._next(self._text.prefix(self._released + 1)))
        return out

    def _next(self, prefix: str) -> Entry:
        """Release the next entry; `prefix` is the text of the tokens up to and including its token."""
        raw = self._entries[self._released]
        # The tokens completing a stop string lie past the output's end: they start where it ends.
        entry = Entry(self._name(raw.token), raw.logprob, min(self._start, len(self._text.text)),
                      [(self._name(token), logprob) for token, logprob in raw.top])
        self._released += 1
        # A token ending inside a character decodes with a trailing U+FFFD; the next token starts in that character.
        self._start = len(prefix.rstrip(REPLACEMENT))
        return entry

    def _name(self, token: int) -> TokenText:
        if token not in self._names:
            self._names[token] = self._describe(token)
        return self._names[token]
