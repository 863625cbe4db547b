"""A GGUF's config and tokenizer as `verispec.models.gguf_meta` reads them, against transformers' whole route
(`AutoConfig` / `AutoTokenizer.from_pretrained(gguf_file=)`): the same config, the same tokenizer files and ids."""

from __future__ import annotations

import pytest

from tests.models.gguf_cases import write_tiny_gguf
from verispec.models.gguf_file import GGUFFile
from verispec.models.gguf_meta import read_config, read_config_and_tokenizer

TEXTS = ["abab ba", "hello, world\n\tx = 1 + 22", "  leading spaces and émoji 🙂<eos>"]


def assert_as_transformers_reads(path, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    config, tokenizer = read_config_and_tokenizer(path)
    reference_config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(config) is type(reference_config) and config.to_dict() == reference_config.to_dict()
    assert type(tokenizer) is type(reference)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    tokenizer.save_pretrained(ours)
    reference.save_pretrained(theirs)
    names = sorted(p.name for p in theirs.iterdir())
    assert names == sorted(p.name for p in ours.iterdir()) and "tokenizer.json" in names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == reference(text)["input_ids"]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("tied", [False, True])
def test_tiny_files_read_as_transformers_reads_them(tmp_path, arch, tied):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch, tied=tied)
    config = read_config(GGUFFile(path))
    assert config.tie_word_embeddings is tied and config.vocab_size == 64 and config.num_hidden_layers == 2
    assert_as_transformers_reads(path, tmp_path)


def test_a_config_key_holding_an_array_is_refused(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    source = GGUFFile(path)
    source.arrays = source.arrays | {"qwen2.block_count"}  # as a file whose block count is an array would parse
    with pytest.raises(ValueError, match="qwen2.block_count"):
        read_config(source)


@pytest.mark.slow
def test_the_default_draft_reads_as_transformers_reads_it(tmp_path):
    """The embedded draft (its 151,936-token vocabulary and merges; the target's metadata has the same keys)."""
    from verispec.models.default_pair import DRAFT, assembled

    assert_as_transformers_reads(assembled(DRAFT), tmp_path)
