"""verispec's own decoder loop for Llama-family models (Qwen2, Llama): the same modules and weights as transformers'
forward, fewer framework steps.

Why: on a CPU a one-token forward of the 1.5B target on the int8 path spends about a third of its time outside its
linears, mostly in transformers' generic machinery (mask building, per-module hooks and keyword plumbing, output
records), and a speculative decode runs thousands of such forwards. This loop calls the model's own submodules
(embedding, norms, projections, rotary embedding, LM head) in transformers' order and attends with one
`scaled_dot_product_attention` call per layer (or, on the int4 and int8 paths, verispec's kernel that attends one
query at a time: `verispec.models.query_attention`); it writes the KV cache in place (`verispec.models.kv_cache`;
transformers' `DynamicCache` works too). Where every projection runs on verispec's kernels, those one-query-at-a-time
passes run all layers as one C++ call instead, with the same bits (`verispec.models.decoder_stack`). With torch's
attention, logits and hidden states are bit-identical to transformers' forward (tested in float32, bfloat16 and
float64; other dtypes than float32 run the norm modules themselves, so they follow transformers' upcasting).

Only architectures whose layers are exactly "norm, attention with rotary embedding, residual, norm, gated MLP,
residual" with full attention in every layer are run here (`lean_support`); anything else (sliding windows,
per-head q/k norms, other model types) keeps transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from verispec.models.decoder_stack import decoder_stack
from verispec.models.fused import fused_projections
from verispec.models.kv_cache import InPlaceKVCache
from verispec.models.query_attention import attention_kernel


@dataclass
class StackSegment:
    """One sequence's share of a batched decoder-stack pass (`LeanDecoder.segment`)."""

    x: torch.Tensor  # [T, H] the embedded new tokens
    cos: torch.Tensor  # [T, D] their rotary tables
    sin: torch.Tensor
    keys: list[torch.Tensor]  # per layer, the sequence's cache buffers [1, kv_heads, room, D]
    values: list[torch.Tensor]
    start: int  # the first new position in the cache
    mask: torch.Tensor | None  # [T, start + T] bool for tree attention; None: causal after the cache


# The model types whose layer structure this loop reproduces (checked against transformers 5's modeling files)
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


def lean_support(model: Any) -> str | None:
    """Return None when `model` (a transformers CausalLM) can run on `LeanDecoder`, else why it cannot."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model type {kind!r} (the loop covers {', '.join(SUPPORTED_MODEL_TYPES)})"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "sliding-window layers"
    for layer in model.model.layers:
        attn = layer.self_attn
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention"
        if abs(attn.scaling - attn.head_dim ** -0.5) > 1e-12 or hasattr(attn, "q_norm"):
            return "attention other than plain scaled dot product"
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanDecoder:
    """Run a supported transformers CausalLM (see `lean_support`) over new tokens with a KV cache (`InPlaceKVCache`
    or transformers' `DynamicCache`). `fuse`: run the projections that share an input as one call where the linear
    backend allows (`fused_projections`). `query_rows`: forwards over at most this many tokens attend one query at
    a time (`verispec.models.query_attention`; the caller checks `query_attention_support`), longer ones (prompts)
    with torch's fused kernel; None: torch's kernel always."""

    def __init__(self, model: Any, fuse: bool = True, query_rows: int | None = None) -> None:
        reason = lean_support(model)
        assert reason is None, f"LeanDecoder cannot run this model: {reason}"
        self.model = model
        self.inner = model.model
        config = model.config
        self.layers = list(self.inner.layers)[: config.num_hidden_layers]
        self.hidden_size = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = self.layers[0].self_attn.head_dim
        self.scale = self.layers[0].self_attn.scaling
        # Per layer, the projections that read the same input, as one call each: on the int4 backend its 4-bit
        # layers run as one kernel call (bit-identical; one activation quantization and thread pass instead of one
        # per layer), on any other backend the modules one after another.
        self.qkv = [fused_projections([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], fuse)
                    for layer in self.layers]
        self.gate_up = [fused_projections([layer.mlp.gate_proj, layer.mlp.up_proj], fuse) for layer in self.layers]
        # SiLU and the product in place on the projections' own outputs: the same bits without two more
        # intermediate-sized buffers per layer (a 256-token prompt's are 9 MB each on the default target)
        self.silu = getattr(config, "hidden_act", None) == "silu"
        self.query_rows = query_rows
        self.query_kernel = attention_kernel() if query_rows is not None else None
        # Where attention runs one query at a time, its module also runs the rotary embedding (the same bits) and
        # RMSNorm (each row on its own) of those passes; False keeps torch's ops (to measure what the kernels save).
        self.small_ops = True
        # Where every projection runs on verispec's kernels, those passes run all layers as one C++ call (the same
        # bits: `verispec.models.decoder_stack`) when the cache is an InPlaceKVCache; False: step by step, to measure.
        self.stack = decoder_stack(model, self.layers, fuse) if self.query_kernel is not None else None
        self.whole_stack = True

    def _norm(self, module: Any, x: torch.Tensor, in_kernel: bool) -> torch.Tensor:
        if in_kernel:  # decode and verify passes on the per-query module: one call, each row on its own
            return self.query_kernel.rms_norm(x, module.weight, module.variance_epsilon)
        if x.dtype == torch.float32:  # one fused op, bit-identical to transformers' float32 RMSNorm (tested)
            return F.rms_norm(x, (self.hidden_size,), module.weight, module.variance_epsilon)
        return module(x)  # other dtypes: transformers' own upcasting

    def __call__(self, ids: torch.Tensor, cache: Any, n_logits: int, return_hidden: bool = False,
                 tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return (logits [n_logits, V], last hidden states [n_logits, H] or None) of `ids` [1, T] after the cached
        tokens, appending them to `cache`. `tree`: (mask [T, cache+T] bool, depths [T]) for tree attention. Call it
        under torch.inference_mode (`HFCausalLM._run` does), as transformers' forward is."""
        length = ids.shape[1]
        x = self.inner.embed_tokens(ids)  # [1, T, H]
        per_query = self.query_kernel is not None and length <= self.query_rows
        if tree is None:
            past = cache.get_seq_length()
            positions = torch.arange(past, past + length, device=ids.device)
            # One new token attends to everything cached. Several on an empty cache (a prompt): sdpa's own causal
            # flag, with which its flash kernel skips the blocks above the diagonal (half the work of a long
            # prompt). Several after cached tokens: the causal mask offset by the cache (sdpa's flag aligns to the
            # top left, which would hide cached tokens).
            # (The per-query kernel applies the offset causal rule itself.)
            causal = length > 1 and past == 0
            mask = None if length == 1 or causal or per_query else torch.ones(length, past + length, dtype=torch.bool,
                                                                 device=ids.device).tril(past)
        else:
            causal = False
            mask, positions = tree[0].to(ids.device), tree[1].to(ids.device)
        cos, sin = self.inner.rotary_emb(x, positions.unsqueeze(0))  # [1, T, D] each
        small_ops = per_query and self.small_ops  # rotary and norms of this pass in the per-query module
        # The rotation in one kernel call at any size: its bits are torch's (RMSNorm's are not: decode passes only)
        rotate_in_kernel = self.query_kernel is not None and self.small_ops
        if rotate_in_kernel:
            cos_rows, sin_rows = cos[0].contiguous(), sin[0].contiguous()  # [T, D]
        if small_ops:
            if self.stack is not None and self.whole_stack and isinstance(cache, InPlaceKVCache):
                keys, values, start = cache.claim(length, x.new_empty(1, self.kv_heads, 0, self.head_dim))
                x = self.stack.forward(x[0], keys, values, start, cos_rows, sin_rows, mask)[None]
                return self._head(x, n_logits, return_hidden, small_ops)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = self._norm(layer.input_layernorm, x, small_ops)
            q, k, v = self.qkv[index](h)
            q = q.view(1, length, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(1, length, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(1, length, self.kv_heads, self.head_dim).transpose(1, 2)
            if rotate_in_kernel:  # the same bits in one kernel call instead of twelve elementwise ones
                self.query_kernel.rotate_qk(q, k, cos_rows, sin_rows)
            else:
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
            k, v = cache.update(k, v, index)
            if per_query:  # [1, T, heads, D]; causal after the cache unless a tree mask says otherwise
                o = self.query_kernel.attend(q, k, v, mask, self.scale)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale,
                                                   enable_gqa=self.heads != self.kv_heads).transpose(1, 2)
            # the residual adds in place: the same bits without a new hidden-sized buffer each (x is this pass's own)
            x = x.add_(attn.o_proj.forward(o.reshape(1, length, self.heads * self.head_dim)))
            h = self._norm(layer.post_attention_layernorm, x, small_ops)
            gate, up = self.gate_up[index](h)
            act = F.silu(gate, inplace=True).mul_(up) if self.silu else layer.mlp.act_fn(gate) * up
            x = x.add_(layer.mlp.down_proj.forward(act))
        return self._head(x, n_logits, return_hidden, small_ops)

    def stacks(self, length: int, cache: Any) -> bool:
        """Return whether a forward over `length` new tokens after `cache` runs as one call of the decoder stack (a
        decode or verify pass where every projection is on verispec's kernels): the passes `segment` and
        `run_segments` batch across sequences."""
        return (self.stack is not None and self.whole_stack and self.small_ops and self.query_rows is not None
                and 1 <= length <= self.query_rows and isinstance(cache, InPlaceKVCache))

    def segment(self, ids: torch.Tensor, cache: InPlaceKVCache,
                tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> StackSegment:
        """Prepare one sequence's pass for `run_segments` (`stacks` must hold): embed `ids` [1, T], compute their
        rotary tables and claim their cache positions, as `__call__` does for a stacked pass."""
        length = ids.shape[1]
        x = self.inner.embed_tokens(ids)  # [1, T, H]
        if tree is None:
            past = cache.get_seq_length()
            mask, positions = None, torch.arange(past, past + length, device=ids.device)
        else:
            mask, positions = tree[0].to(ids.device), tree[1].to(ids.device)
        cos, sin = self.inner.rotary_emb(x, positions.unsqueeze(0))  # [1, T, D] each
        keys, values, start = cache.claim(length, x.new_empty(1, self.kv_heads, 0, self.head_dim))
        return StackSegment(x[0], cos[0].contiguous(), sin[0].contiguous(), keys, values, start, mask)

    def run_segments(self, segments: list[StackSegment], n_logits: list[int], return_hidden: bool = False
                     ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Run several sequences' passes (from `segment`) as one call of the decoder stack and one LM head pass;
        return each one's (logits [n, V], hidden [n, H] or None) for its last `n_logits` rows. Every row is computed
        as in its own sequence's pass alone (the stack's and the head's kernels compute each row on its own, and the
        head runs at most `query_rows` rows per call, the kernels of decode passes), so the outputs are the same bits.
        """
        x = torch.cat([s.x for s in segments]) if len(segments) > 1 else segments[0].x
        cos = torch.cat([s.cos for s in segments]) if len(segments) > 1 else segments[0].cos
        sin = torch.cat([s.sin for s in segments]) if len(segments) > 1 else segments[0].sin
        specs = [(s.keys, s.values, s.start, s.x.shape[0], s.mask) for s in segments]
        states = self.stack.forward_batch(x, specs, cos, sin)  # [N, H]
        rows, end = [], 0
        for s, n in zip(segments, n_logits, strict=True):
            end += s.x.shape[0]
            rows.append(states[end - n: end])
        hidden = self._norm(self.inner.norm, torch.cat(rows), True)  # [sum n, H]
        step = self.query_rows or hidden.shape[0]
        logits = torch.cat([self.model.lm_head.forward(hidden[i: i + step]) for i in range(0, hidden.shape[0], step)])
        out, start = [], 0
        for n in n_logits:
            out.append((logits[start: start + n], hidden[start: start + n] if return_hidden else None))
            start += n
        return out

    def _head(self, x: torch.Tensor, n_logits: int, return_hidden: bool, small_ops: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = self._norm(self.inner.norm, x[0, -n_logits:], small_ops)  # [n, H]: only the rows whose logits are used
        logits = self.model.lm_head.forward(hidden)  # [n, V]
        return logits, (hidden if return_hidden else None)
