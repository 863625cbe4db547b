"""Committed tokens -> text deltas that are safe to send: whole UTF-8 characters only, cut before a stop string.

Text is re-decoded from all generated ids each round (byte-level tokenizers only form whole characters from
whole byte runs), and a delta never includes text that a later round could still change:
- a trailing U+FFFD, which is how a tokenizer renders a character whose bytes have not all arrived yet;
- a tail that could be the start of a stop string (it is sent once the next round shows it is not one).
When a stop string appears, the output ends just before it and generation should end.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes an incomplete UTF-8 sequence to


class TextStream:
    """Accumulates committed tokens and hands out the text that is final so far."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode  # token ids -> text (special tokens dropped)
        self._stop = [s for s in stop if s]
        self.tokens: list[int] = []  # every committed token
        self.kept_tokens = 0  # tokens of the output: all of them, or those up to the one completing a stop string
        self.text = ""  # the output text so far (before any stop string)
        self.stopped = False  # a stop string was found: the output is final
        self._sent = 0  # characters of `text` already handed out

    def push(self, tokens: Sequence[int]) -> str:
        """Add one round's committed tokens; return the newly final text (possibly empty)."""
        if self.stopped:
            return ""
        before = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        text = self._decode(self.tokens)
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self.text = text[:cut]
            self.kept_tokens = self._tokens_reaching_stop(before)
            return self._take(len(self.text))
        self.text, self.kept_tokens = text, len(self.tokens)
        safe = len(text.rstrip(REPLACEMENT))
        return self._take(safe - self._stop_prefix_overlap(text[:safe]))

    @property
    def sent(self) -> int:
        """Return the characters of `text` handed out so far."""
        return self._sent

    def prefix(self, n: int) -> str:
        """Return the text of the first `n` committed tokens (as decoded alone: an incomplete character is U+FFFD)."""
        return self._decode(self.tokens[:n])

    def finish(self) -> str:
        """Return the text not handed out yet: generation has ended, so everything decoded is final."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        delta = self.text[self._sent : max(end, self._sent)]
        self._sent += len(delta)
        return delta

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(found) if found else None

    def _tokens_reaching_stop(self, before: int) -> int:
        """Return the fewest tokens whose text contains a stop string (the earlier rounds' did not)."""
        for n in range(before + 1, len(self.tokens) + 1):
            if self._first_stop(self._decode(self.tokens[:n])) is not None:
                return n
        return len(self.tokens)

    def _stop_prefix_overlap(self, text: str) -> int:
        """Return the length of the longest tail of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best


def sse(data: dict[str, Any] | str) -> bytes:
    """Return one Server-Sent Event carrying `data` (a JSON object, or a literal such as "[DONE]")."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
