"""What a draft/target pair shares: one vocabulary and tokenizer, the prompt's encoding, the ids that end generation.

The public `Decoder` (verispec.api) and the learned verifier's data collection both load a pair; they share these
pieces from here, below both, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.models.hf import HFCausalLM
from verispec.models.protocol import CausalLM


def check_compatible(target: HFCausalLM, draft: HFCausalLM) -> None:
    """Raise IncompatibleModelsError unless draft and target share the vocabulary and the tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise IncompatibleModelsError(
            f"draft and target have different vocabularies: target {target.name!r} has {target.vocab_size} "
            f"output tokens, draft {draft.name!r} has {draft.vocab_size}; speculative decoding needs one vocabulary"
        )
    if target.tokenizer is not None and draft.tokenizer is not None:
        if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
            raise IncompatibleModelsError(
                f"draft {draft.name!r} and target {target.name!r} use different tokenizers (their token-to-id "
                f"maps differ); speculative decoding needs the same tokenizer"
            )


def encode_prompt(tokenizer: Any, prompt: str, chat_template: bool = True) -> list[int]:
    """Return the prompt's token ids, through the tokenizer's chat template when it has one."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("the prompt is empty: give some text to continue")
    if chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def eos_token_ids(model: CausalLM) -> set[int]:
    """Return the token ids that end generation: the tokenizer's EOS and the model's generation EOS ids."""
    ids = set()
    if model.tokenizer is not None and model.tokenizer.eos_token_id is not None:
        ids.add(int(model.tokenizer.eos_token_id))
    configured = getattr(model.generation_config, "eos_token_id", None)  # a generation config need not name one
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    return ids
