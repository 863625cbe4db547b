"""GGUF test material: random raw blocks of each quantization type, and tiny qwen2 / llama models written as GGUF
files (the shapes multiples of 256, as K-quants need; the vocabulary 64 wide, as the kernel's LM head needs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as GGML
from gguf.quants import quantize

# Where each type keeps its float16 factors (byte offsets in a block), and their magnitude: small enough that a
# tiny model's activations stay moderate (a Q6_K weight is d * scale * q with |scale| <= 128, |q| <= 32).
FACTORS = {GGML.Q4_0: ([0], 0.01), GGML.Q4_1: ([0, 2], 0.01), GGML.Q4_K: ([0, 2], 0.001),
           GGML.Q5_0: ([0], 0.01), GGML.Q5_1: ([0, 2], 0.01), GGML.Q8_0: ([0], 0.001),
           GGML.Q5_K: ([0, 2], 0.001), GGML.Q6_K: ([208], 1e-4)}
QUANTIZABLE = (GGML.Q4_0, GGML.Q4_1, GGML.Q5_0, GGML.Q5_1, GGML.Q8_0)  # gguf quantizes these itself

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, LAYERS = 256, 512, 4, 2, 64, 2


def random_blocks(ggml_type: GGML, rows: int, cols: int, seed: int) -> np.ndarray:
    """Raw bytes [rows, bytes per row] of a random tensor of `ggml_type`: random bits (every pattern of levels and
    6-bit scales is a valid block) with finite float16 factors of either sign."""
    block, size = GGML_QUANT_SIZES[ggml_type]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    starts, magnitude = FACTORS.get(ggml_type, ([], 0.0))  # other types: random bits only
    for start in starts:
        values = rng.uniform(-magnitude, magnitude, (raw.shape[0], 1)).astype(np.float16)
        raw[:, start: start + 2] = values.view(np.uint8)
    return raw.reshape(rows, -1)


def tensor_bytes(ggml_type: GGML, rows: int, cols: int, seed: int) -> np.ndarray:
    """A tensor [rows, cols] of `ggml_type` as it lies in a GGUF: gguf's own quantization of random weights where it
    has one, random blocks otherwise, float32 values for F32."""
    rng = np.random.default_rng(seed)
    if ggml_type == GGML.F32:
        return rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    if ggml_type in QUANTIZABLE:
        return quantize(rng.normal(0, 0.05, (rows, cols)).astype(np.float32), ggml_type)
    return random_blocks(ggml_type, rows, cols, seed)


# The projections of one layer and their types: every direct 4-bit type, and types that are dequantised.
LAYER_TYPES = {"attn_q": GGML.Q4_K, "attn_k": GGML.Q4_0, "attn_v": GGML.Q8_0, "attn_output": GGML.Q4_1,
               "ffn_gate": GGML.Q4_K, "ffn_up": GGML.Q5_0, "ffn_down": GGML.Q6_K}


def write_tiny_gguf(path: Path, arch: str = "qwen2", tied: bool = False, embedding: GGML = GGML.Q4_K,
                    types: dict[str, GGML] | None = None, head: GGML = GGML.Q8_0, seed: int = 0) -> Path:
    """Write a tiny `arch` ("qwen2" or "llama") model to `path`: 2 layers, hidden 256, a 64-token byte-level BPE
    vocabulary; `tied`: no output.weight (the head reads the embedding). Return `path`."""
    types = {**LAYER_TYPES, **(types or {})}
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<eos>", *letters, *[f"a{c}" for c in letters], *[f"b{c}" for c in letters[: VOCAB - 53]]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(0)
    writer.add_bos_token_id(0)
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * 64, HIDDEN), "attn_v": (KV_HEADS * 64, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
              "ffn_down": (HIDDEN, FFN)}
    seeds = iter(range(seed * 1000, seed * 1000 + 1000))

    def add(name: str, ggml_type: GGML, rows: int, cols: int) -> None:
        data = tensor_bytes(ggml_type, rows, cols, next(seeds))
        writer.add_tensor(name, data, raw_dtype=ggml_type if ggml_type != GGML.F32 else None)

    def add_norm(name: str) -> None:
        rng = np.random.default_rng(next(seeds))
        writer.add_tensor(name, (1.0 + rng.normal(0, 0.1, HIDDEN)).astype(np.float32))

    add("token_embd.weight", embedding, VOCAB, HIDDEN)
    for layer in range(LAYERS):
        add_norm(f"blk.{layer}.attn_norm.weight")
        add_norm(f"blk.{layer}.ffn_norm.weight")
        for name, ggml_type in types.items():
            add(f"blk.{layer}.{name}.weight", ggml_type, *shapes[name])
        if arch == "qwen2":  # qwen2's q, k and v projections have biases
            for name in ("attn_q", "attn_k", "attn_v"):
                rows = shapes[name][0]
                rng = np.random.default_rng(next(seeds))
                writer.add_tensor(f"blk.{layer}.{name}.bias", rng.normal(0, 0.05, rows).astype(np.float32))
    add_norm("output_norm.weight")
    if not tied:
        add("output.weight", head, VOCAB, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
