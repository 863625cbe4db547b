"""How much one request may ask for: hard caps on every setting that sizes memory or time, and an estimate of a
decode's memory held against what the host (or the GPU) has free.

A server runs what a client sends; without bounds one request (`paths` 1,000,000, a 100 MB stop string, a
gigabyte body) takes the process down for every client. The caps are generous next to any measured setting
(BENCHMARKS.md uses γ ≤ 8 and K ≤ 4); the memory estimate decides the rest, per request, from the models' shapes.
docs/serving.md lists the bounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from verispec.drafters import lookup_length
from verispec.engine import DecodeConfig
from verispec.methods import get_method
from verispec.models.protocol import CausalLM

MAX_BODY_BYTES = 4 << 20  # a full 32k-token prompt in JSON with every character escaped is under 1 MiB
MAX_PATHS = 16  # verispec.paths (K)
MAX_GAMMA = 32  # verispec.gamma: draft tokens per round
MAX_NGRAM_GAMMA = 64  # verispec.ngram_gamma: lookup tokens cost no draft forward, so a round may draft more
MAX_NGRAM = 16  # verispec.ngram_min / ngram_max: the index holds (ngram_max − ngram_min + 1) n-grams per token
MAX_STOPS = 4  # stop strings, as OpenAI
MAX_STOP_CHARS = 512  # characters per stop string: each round compares every prefix of every stop string
MAX_LOGIT_BIAS = 300  # logit_bias entries: each is a column that every row of every round offsets
MAX_CHARS_PER_TOKEN = 64  # prompt characters per token of context: longer text cannot fit, and is not tokenized
# The context assumed for models that state none: the default pair's (Qwen2.5: 32,768 positions).
UNSTATED_CONTEXT = 32768
MEMORY_SHARE = 0.5  # a request may take at most this share of the memory free when it arrives

# Per-request caps on settings of the `verispec` object: request field -> (cap, what it sizes).
CAPS: dict[str, tuple[int, str]] = {
    "verispec.paths": (MAX_PATHS, "draft paths per round"),
    "verispec.gamma": (MAX_GAMMA, "draft tokens per round"),
    "verispec.ngram_gamma": (MAX_NGRAM_GAMMA, "lookup tokens per round"),
    "verispec.ngram_min": (MAX_NGRAM, "tokens of the shortest n-gram looked up"),
    "verispec.ngram_max": (MAX_NGRAM, "tokens of the longest n-gram looked up"),
}


@dataclass(frozen=True)
class ModelShape:
    """What a model's size per request depends on (read from its transformers config where it has one)."""

    vocab: int  # V
    kv_bytes: int  # KV-cache bytes per cached position (all layers, keys and values)
    heads: int  # attention heads (a tree pass's scores are [heads, nodes, context])
    hidden: int
    intermediate: int
    dtype_bytes: int


def model_shape(model: CausalLM) -> ModelShape:
    """Return `model`'s shape; a model that states no config counts as attention-free (its vocabulary remains)."""
    config, dtype_bytes = model.config, model.dtype.itemsize

    def read(name: str) -> int:
        value = getattr(config, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    heads, hidden = read("num_attention_heads"), read("hidden_size")
    head_dim = read("head_dim") or (hidden // heads if heads else 0)
    kv_heads = read("num_key_value_heads") or heads
    kv_bytes = 2 * read("num_hidden_layers") * kv_heads * head_dim * dtype_bytes
    vocab = model.vocab_size
    return ModelShape(int(vocab), kv_bytes, heads, hidden, read("intermediate_size"), dtype_bytes)


def draft_length(config: DecodeConfig) -> int:
    """Return the most tokens one path drafts in a round under `config`."""
    method = get_method(config.method)
    if not method.speculative:
        return 0
    if method.learned_stop:
        return config.cap
    return max(config.gamma, lookup_length(config)) if config.drafter != "model" else config.gamma


def request_bytes(shapes: Iterable[ModelShape], config: DecodeConfig, n_prompt: int, n_context: int) -> int:
    """Estimate the memory a decode with `config` takes beyond the weights: `n_prompt` tokens read, then up to
    `n_context` positions (prompt + max_tokens) cached. An estimate that errs high (every term at its peak, at once).
    """
    shapes = list(shapes)
    k = config.paths
    nodes = k * draft_length(config)  # tokens of the tree one verify pass feeds
    positions = n_context + nodes
    total = 0
    for shape in shapes:
        total += 2 * positions * shape.kv_bytes  # the cache grows by doubling: up to twice the positions it holds
        # the tree pass: a bool mask, its additive copy and the attention scores, each [nodes, positions]
        total += nodes * positions * (1 + shape.dtype_bytes + 4 * shape.heads)
        # reading the prompt: one layer's activations over all of its tokens
        total += n_prompt * (2 * shape.intermediate + 4 * shape.hidden) * shape.dtype_bytes
    vocab = max((shape.vocab for shape in shapes), default=0)
    gamma = draft_length(config)
    # float64 laws over the vocabulary: q [K, γ, V], p [K, γ+1, V] and the softmax of the pass's logits
    total += 8 * vocab * k * (3 * gamma + 2)
    return total


def available_bytes(devices: Iterable[torch.device]) -> int | None:
    """Return the memory free for a decode on `devices` (the GPU's when a model is on one, else the host's), or
    None when it cannot be read."""
    cuda = [device for device in devices if device.type == "cuda"]
    if cuda:
        return min(torch.cuda.mem_get_info(device)[0] for device in cuda)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n: float) -> str:
    """Return `n` bytes in GiB, for messages."""
    return f"{n / (1 << 30):.2f} GiB"
