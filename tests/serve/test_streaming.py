"""Incremental text: whole UTF-8 characters only, output cut before a stop string, a possible stop prefix held."""

from __future__ import annotations

import pytest

from verispec.serve.streaming import REPLACEMENT, TextStream


def byte_decode(ids: list[int]) -> str:
    """A byte-level 'tokenizer': one token per byte, incomplete characters rendered as U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def char_decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


TEXT = "héllo wörld, 日本語 and 🙂 ok"


@pytest.mark.parametrize("round_size", [1, 2, 3, 5])
def test_multibyte_characters_are_never_split(round_size):
    data = list(TEXT.encode())
    stream = TextStream(byte_decode)
    deltas = [stream.push(data[i : i + round_size]) for i in range(0, len(data), round_size)]
    deltas.append(stream.finish())
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == TEXT
    # Each delta is a whole number of characters of the final text, in order.
    assert sum(len(d.encode()) for d in deltas) == len(data)


def test_an_incomplete_character_at_the_very_end_is_flushed_by_finish():
    data = list("ab🙂".encode())[:-1]  # generation ended in the middle of the emoji
    stream = TextStream(byte_decode)
    assert stream.push(data) == "ab"
    assert stream.finish() == REPLACEMENT  # what the non-streamed text shows too


def test_output_ends_before_the_stop_string_and_counts_the_tokens_reaching_it():
    stream = TextStream(char_decode, stop=["END"])
    assert stream.push([ord(c) for c in "abcE"]) == "abc"  # "E" could start "END": held back
    assert stream.push([ord(c) for c in "NDxyz"]) == ""
    assert stream.stopped and stream.text == "abc" and stream.kept_tokens == 6  # a, b, c, E, N, D
    assert stream.push([ord("q")]) == "" and stream.finish() == ""


def test_a_held_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    stream = TextStream(char_decode, stop=["END", "stop"])
    assert stream.push([ord(c) for c in "xyEN"]) == "xy"
    assert stream.push([ord(c) for c in "Ds"]) == ""  # "END" found
    stream = TextStream(char_decode, stop=["END", "stop"])
    assert stream.push([ord(c) for c in "xyst"]) == "xy"
    assert stream.push([ord(c) for c in "ar"]) == "star"
    assert not stream.stopped and stream.kept_tokens == 6


def test_the_earliest_of_several_stop_strings_wins_within_one_round():
    stream = TextStream(char_decode, stop=["zz", "b"])
    stream.push([ord(c) for c in "abzzb"])
    assert stream.text == "a" and stream.kept_tokens == 2


@pytest.mark.parametrize("round_size", [1, 2, 4, 7])
def test_streamed_text_equals_the_whole_text_whatever_the_rounds(round_size):
    text = "one two. stop here. three"
    ids = [ord(c) for c in text]
    stream = TextStream(char_decode, stop=["here"])
    deltas = [stream.push(ids[i : i + round_size]) for i in range(0, len(ids), round_size)]
    deltas.append(stream.finish())
    assert "".join(deltas) == "one two. stop "
