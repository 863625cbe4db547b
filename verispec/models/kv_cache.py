"""A KV cache for verispec's decoder loop that writes new keys and values in place.

Why: transformers' `DynamicCache` appends by concatenation, so every forward copies every cached key and value of
every layer into a new tensor. For the 1.5B target (28 layers, 2 KV heads of 128) after 300 tokens that is 17 MB
copied, and as many freshly allocated pages touched, for each one-token step, growing with the context
(BENCHMARKS.md §3 measures it in decodes). `InPlaceKVCache` keeps, per layer, one buffer of keys and one of values
with room for more positions than are filled, grown by doubling (so each position is copied a bounded number of
times), and hands attention views of the filled part. The values attended to are the same, so the logits are
bit-identical to a forward on `DynamicCache` (tested).

It offers what `verispec.models.lean.LeanDecoder` and `HFCausalLM`'s rollbacks use: `update`, `get_seq_length`,
`crop` (as DynamicCache's) and `keep`.
"""

from __future__ import annotations

import torch

INITIAL_POSITIONS = 256  # room of a layer's first buffer; doubled whenever a forward needs more


class InPlaceKVCache:
    """Per layer, keys and values [batch, kv_heads, room, head_dim] of which the first `length` positions are filled."""

    def __init__(self, layers: int, initial_positions: int | None = None) -> None:
        initial_positions = INITIAL_POSITIONS if initial_positions is None else initial_positions
        if layers < 1 or initial_positions < 1:
            raise ValueError(f"need >= 1 layer and >= 1 initial position, got {layers} and {initial_positions}")
        self.initial_positions = initial_positions
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.lengths = [0] * layers  # filled positions per layer (a forward updates the layers in turn)

    def get_seq_length(self, layer: int = 0) -> int:
        """Return the number of positions held (by `layer`)."""
        return self.lengths[layer]

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `keys` and `values` [batch, kv_heads, T, head_dim] to `layer`; return views of all its positions."""
        start = self.lengths[layer]
        end = start + keys.shape[-2]
        held = self.keys[layer]
        if held is None or held.shape[-2] < end:
            self._grow(layer, end, keys, values)
        k_buffer, v_buffer = self.keys[layer], self.values[layer]
        assert k_buffer is not None and v_buffer is not None
        k_buffer[..., start:end, :].copy_(keys)
        v_buffer[..., start:end, :].copy_(values)
        self.lengths[layer] = end
        return k_buffer[..., :end, :], v_buffer[..., :end, :]

    def claim(self, count: int, like: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """Make room for `count` positions after the filled ones in every layer and count them as filled; return
        (keys, values, start): every layer's whole buffers [batch, kv_heads, room, head_dim] and the first new
        position, for a caller that writes the new keys and values itself (`verispec.models.decoder_stack`).
        `like` [batch, kv_heads, any, head_dim]: the buffers' shape and dtype where they do not exist yet."""
        start = self.lengths[0]
        if any(length != start for length in self.lengths):
            raise ValueError(f"the layers hold different numbers of positions: {self.lengths}")
        for layer in range(len(self.keys)):
            held = self.keys[layer]
            if held is None or held.shape[-2] < start + count:
                self._grow(layer, start + count, like, like)
        self.lengths = [start + count] * len(self.lengths)
        return self.keys, self.values, start  # type: ignore[return-value]  # every layer has buffers now

    def _grow(self, layer: int, needed: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Give `layer` buffers with room for at least `needed` positions, the filled ones copied over."""
        room = self.initial_positions
        while room < needed:
            room *= 2
        filled = self.lengths[layer]
        for store, like in ((self.keys, keys), (self.values, values)):
            buffer = like.new_empty(*like.shape[:-2], room, like.shape[-1])
            old = store[layer]
            if old is not None and filled:
                buffer[..., :filled, :].copy_(old[..., :filled, :])
            store[layer] = buffer

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions; a negative `max_length` removes that many (as DynamicCache.crop)."""
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        self.lengths = [min(length, max(max_length, 0)) for length in self.lengths]

    @torch.inference_mode()  # the buffers were made in the forwards' inference mode
    def keep(self, positions: torch.Tensor) -> None:
        """Keep only `positions` (long [n], ascending), moved to the front in that order."""
        n = int(positions.numel())
        for store in (self.keys, self.values):
            for buffer in store:
                if buffer is not None:
                    buffer[..., :n, :].copy_(buffer.index_select(-2, positions))  # a copy first: the ranges overlap
        self.lengths = [n if buffer is not None else 0 for buffer in self.keys]
