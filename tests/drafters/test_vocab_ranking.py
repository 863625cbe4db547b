"""The token-frequency ranking: its builder (code, prose and the draft's answers mixed by mass), the shipped files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verispec.drafters import vocab_cli, vocab_ranking
from verispec.drafters.vocab_ranking import build_ranking, mix, prose_texts
from verispec.models.vocab import DATA_DIR

SHIPPED = sorted(DATA_DIR.glob("*.npy"))


def test_a_word_is_counted_in_its_running_text_forms_and_symbols_at_their_rates(monkeypatch):
    monkeypatch.setattr(vocab_ranking, "PROSE_SYMBOLS", {".": 0.5})
    texts = prose_texts({"word": 0.25, "i": 0.5})
    assert texts == pytest.approx({" word": 0.75 * 0.25, " Word": 0.20 * 0.25, "Word": 0.05 * 0.25,
                                   " i": 0.75 * 0.5, " I": 0.20 * 0.5, "I": 0.05 * 0.5, ".": 0.75 * 0.5})


def test_mix_gives_each_part_its_share_of_the_mass():
    assert mix([({1: 3, 2: 1}, 0.5), ({2: 2.0, 3: 6.0}, 0.5)]) == pytest.approx({1: 0.375, 2: 0.25, 3: 0.375})


def test_build_ranks_specials_first_then_code_and_prose_with_equal_mass(tokenizer, monkeypatch):
    monkeypatch.setattr(vocab_ranking, "WORD_FORMS", ((" {w}", 1.0),))
    monkeypatch.setattr(vocab_ranking, "PROSE_SYMBOLS", {".": 0.5})
    # code: a 4/6, b 2/6; prose: " " 0.8, c 0.6, "." 0.4, d 0.2 (of 2.0); each half of the mass
    ranking = build_ranking(tokenizer, ["aaabb", "a"], {"en": {"c": 0.6, "d": 0.2}})
    eos, unk = tokenizer.convert_tokens_to_ids(["<eos>", "<unk>"])
    assert ranking == [eos, unk, *tokenizer.convert_tokens_to_ids(["a", " ", "b", "c", ".", "d"])]
    assert build_ranking(tokenizer, ["aaabb", "a"], {"en": {"c": 0.6, "d": 0.2}}, keep=3) == ranking[:3]


def test_build_is_deterministic_whatever_the_order_of_its_inputs(tokenizer):
    words = {f"w{i}{c}": 1.0 / (i + 1) for i in range(30) for c in "xyz"}
    code = ["def f(x):\n    return x + 1\n", "a = [1, 2, 3]\n"]
    first = build_ranking(tokenizer, code, {"en": words, "de": {"und": 0.1}})
    again = build_ranking(tokenizer, code, {"de": {"und": 0.1}, "en": dict(reversed(words.items()))})
    assert first == again and len(set(first)) == len(first)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_a_shipped_ranking_is_a_prefix_of_a_permutation_and_says_how_it_was_built(path):
    meta = json.loads(path.with_suffix(".json").read_text())
    ranking = np.load(path)
    assert ranking.ndim == 1 and ranking.dtype == np.int32 and len(ranking) == meta["ranked_tokens"]
    assert len(np.unique(ranking)) == len(ranking) and 0 <= ranking.min() and ranking.max() < meta["vocab_size"]
    assert path.stat().st_size < 400_000
    assert {"code_corpus", "prose_corpus", "answers_corpus", "languages", "versions", "command"} <= set(meta)
    if meta["answers_corpus"]:  # the draft's answers: how they were made, and their share in the build command
        assert meta["answers_corpus"]["command"].startswith("python -m verispec.drafters.vocab_cli answers")
        assert "--answers-share" in meta["command"]
    assert meta["versions"]["wordfreq"] and meta["command"].startswith("python -m verispec.drafters.vocab_cli")


def test_the_shipped_ranking_puts_special_and_chat_tokens_first_and_covers_prose():
    from verispec.models.default_pair import DEFAULT_PAIR, converted_dir

    folder = converted_dir(DEFAULT_PAIR["draft"])
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("the default pair is not converted on this machine")
    from transformers import AutoTokenizer

    from verispec.models.vocab import load_ranking, special_token_ids

    tok = AutoTokenizer.from_pretrained(folder)
    ranking = load_ranking(tok)
    first = set(special_token_ids(tok)) | set(vocab_ranking.chat_template_ids(tok))
    assert set(ranking[: len(first)]) == first and {"<|im_start|>", "user", "assistant"} <= set(
        tok.convert_ids_to_tokens(ranking[: len(first)]))
    top = set(tok.convert_ids_to_tokens(ranking[:16384]))
    assert {"Ġdelicious", "Ġvacation", "ĠParis", "Ġbreakfast", ".ĊĊ", "Ġreturn", "self"} <= top


def test_the_draft_answers_mass_takes_the_given_share_and_code_and_prose_the_rest(tokenizer, monkeypatch):
    monkeypatch.setattr(vocab_ranking, "WORD_FORMS", ((" {w}", 1.0),))
    monkeypatch.setattr(vocab_ranking, "PROSE_SYMBOLS", {})
    a, b, c, d = tokenizer.convert_tokens_to_ids(["a", "b", "c", "d"])
    code, words = ["aaab"], {"c": 1.0}  # code: a 3/4, b 1/4; prose: " " 1/2, c 1/2
    answers = {d: 3.0, b: 1.0}  # d 3/4, b 1/4
    specials = tokenizer.convert_tokens_to_ids(["<eos>", "<unk>"])
    # share 0.5: a 0.1875, b 0.0625 + 0.125, d 0.375, " " and c 0.125 each (ties by id)
    ranking = build_ranking(tokenizer, code, {"en": words}, answers=answers, answers_share=0.5)
    space = tokenizer.convert_tokens_to_ids(" ")
    assert ranking == [*specials, d, a, b, *sorted([space, c])]
    only = build_ranking(tokenizer, code, {"en": words}, answers=answers, answers_share=1.0)
    assert only[2:4] == [d, b] and set(only[4:]) == {a, c, space}  # the rest stay, with no mass: by id
    assert build_ranking(tokenizer, code, {"en": words}) == [*specials, a, *sorted([space, c]), b]


@pytest.mark.parametrize("share, answers", [(1.5, {1: 1.0}), (-0.1, {1: 1.0}), (0.5, None), (0.0, {1: 1.0})])
def test_an_answers_share_outside_0_1_or_without_answers_is_refused(tokenizer, share, answers):
    with pytest.raises(ValueError, match="answers_share"):
        build_ranking(tokenizer, ["a"], {"en": {"c": 1.0}}, answers=answers, answers_share=share)


@pytest.mark.parametrize("argv, message", [
    (["answers", "--count", "0"], "--count: count must be between 1"),
    (["answers", "--count", "100000"], "--count: count must be between 1"),
    (["answers", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["answers", "--target", "t"], "--target is the target of --weight acceptance"),
    (["answers", "--weight", "target"], "invalid choice"),
    (["build", "--tokenizer", "x", "--answers", "m.npy", "--answers-share", "0"], "--answers-share must lie in"),
    (["build", "--tokenizer", "x", "--answers", "m.npy", "--answers-share", "1.5"], "--answers-share must lie in"),
])
def test_bad_ranking_options_are_refused_by_name_before_any_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        vocab_cli.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
