"""Tiny randomly initialised Hugging Face models and a character tokenizer, built locally (no download).

They exercise the real adapter, its KV cache and rollback in the fast tests.
"""

from __future__ import annotations

import string
from typing import Any

import torch

TINY_CHARS = string.ascii_lowercase + string.digits + " .,!?\n"
EOS = "<eos>"


def tiny_tokenizer(chars: str = TINY_CHARS) -> Any:
    """Return a character-level PreTrainedTokenizerFast over `chars` plus <eos> and <unk>."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS: 0, "<unk>": 1} | {c: i + 2 for i, c in enumerate(chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()  # characters join back without spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, unk_token="<unk>")


def tiny_qwen2(
    vocab_size: int, seed: int, hidden: int = 32, layers: int = 2, dtype: torch.dtype = torch.float64,
    tie_embeddings: bool = False, heads: int = 4, kv_heads: int = 2,
) -> Any:
    """Return a Qwen2ForCausalLM with random weights drawn from a generator seeded by `seed` (with
    `tie_embeddings`, the LM head shares the embedding's weight, as in Qwen2.5's small models)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=tie_embeddings,
        eos_token_id=0,
    )
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    perturb(model, scale=None, seed=seed)
    return model


@torch.no_grad()
def perturb(model: Any, scale: float | None, seed: int) -> Any:
    """Redraw (scale None) or add noise of relative size `scale` to every weight matrix; return `model`.

    Vectors (norm weights) are left alone. The draws come from a generator seeded by `seed`, so models
    are reproducible without touching the global RNG.
    """
    gen = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        if param.dim() < 2:
            continue
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
        if scale is None:
            param.copy_(noise * 0.5)  # std 0.5: logits spread enough that greedy ties are vanishingly rare
        else:
            param.add_(noise * scale * param.std())
    return model
