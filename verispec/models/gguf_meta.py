"""The transformers config and tokenizer of a GGUF file, read from its metadata in one pass each.

Why: for qwen2 and llama files, transformers 5.24 reads the metadata behind `AutoConfig.from_pretrained(gguf_file=)`
through gguf's GGUFReader, which builds numpy views of each of the vocabulary's 300,000 strings, and
`AutoTokenizer.from_pretrained(gguf_file=)` reads it that way a second time to choose the tokenizer's class: 25-29 s
per file of the default pair on a 2-core Xeon (the two calls), most of `verispec setup`. Here:
  - the config is built from verispec's own header parse (`GGUFFile`: scalars only, in well under a second) with the
    key table transformers itself uses (`GGUF_CONFIG_MAPPING`), and the same rules for the output layer's tying,
    the vocabulary size and the architecture's defaults;
  - the tokenizer comes from transformers' own GGUF tokenizer reader (vocabulary and merges only, a few seconds),
    its class named by the architecture rather than looked up through a second config read (qwen2; llama, which
    names no tokenizer class, still takes AutoTokenizer's whole route).
A test holds both to transformers' whole route on the tiny test files and on the default pair. Other architectures
take transformers' route unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verispec.models.gguf_file import GGUFFile

ARCHITECTURES = ("qwen2", "llama")  # read here; any other goes through transformers' own readers


def read_config(source: GGUFFile) -> Any:
    """Return the transformers config of the GGUF `source` (qwen2 or llama; see `read_config_and_tokenizer`)."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    architecture = source.architecture
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture {architecture!r} is read by transformers (here: {', '.join(ARCHITECTURES)})")
    values: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in source.tensors}
    for key, default in GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture, {}).items():
        values.setdefault(key, default)
    for key, value in source.metadata.items():
        prefix, _, name = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(name)
        if renamed is None or renamed == -1:  # not part of the config (None: read and dropped, as transformers does)
            continue
        if key in source.arrays:  # `metadata` holds its length only; no qwen2 or llama config key is an array
            raise ValueError(f"the config key {key} holds an array")
        values[renamed] = value
    if "vocab_size" not in values and "tokenizer.ggml.tokens" in source.metadata:
        values["vocab_size"] = source.metadata["tokenizer.ggml.tokens"]  # the array's length: the vocabulary's
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


def read_config_and_tokenizer(path: str | Path) -> tuple[Any, Any]:
    """Return (config, tokenizer) of the GGUF file at `path`, as `AutoConfig.from_pretrained` and
    `AutoTokenizer.from_pretrained` give them with `gguf_file=` (tested equal), reading its metadata once for the
    config (qwen2, llama) and once for the vocabulary (qwen2)."""
    from transformers import AutoConfig, AutoTokenizer

    path = Path(path)
    source = GGUFFile(path)
    if source.architecture not in ARCHITECTURES:
        return (AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name),
                AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    config = read_config(source)
    config.name_or_path = str(path.parent)  # as from_pretrained records the folder it read
    # tokenizer_type: the class AutoTokenizer maps this model type to, without its second read of the metadata.
    # A type it maps to no class (llama: AutoTokenizer then decides from the config and the vocabulary) takes
    # AutoTokenizer's whole route.
    named = {"tokenizer_type": config.model_type} if TOKENIZER_MAPPING_NAMES.get(config.model_type) else {}
    return config, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, **named)
