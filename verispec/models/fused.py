"""Projections that read the same input (q, k, v; gate, up) run as one 4-bit kernel call in decode and verify
passes.

Why: a one-token forward of the default target makes 197 linear calls, and each pays a fixed cost besides its
weights' bytes (quantizing the activations, waking the threads, the Python call); the 4-bit kernel computes every
output column from its own weights and the token's own activations, so concatenating the layers' weights changes
no bit of any output and saves two or three calls per decoder layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from verispec.models.int4 import PROMPT_ROWS, Int4Linear, huge_page_copy


class FusedInt4:
    """Several 4-bit layers that read the same input, run as one kernel call in decode and verify passes: one
    quantization of the activations and one pass of the threads instead of one per layer. Each output column is
    computed as its own layer computes it, so the results are bit-identical; prompts run each layer's own copy.
    The layers' packed weights become views into the fused buffer (no second copy)."""

    def __init__(self, layers: Sequence[Int4Linear]) -> None:
        self.layers = list(layers)
        self.in_features = layers[0].in_features
        self.sizes = [layer.out_features for layer in layers]
        # Fused once already (a rebuilt decoder loop): the layers' weights lie back to back in one buffer
        self.packed = _back_to_back([layer.packed for layer in layers])
        if self.packed is None:
            self.packed = huge_page_copy(torch.cat([layer.packed for layer in layers]))
        biases = [layer.bias if layer.bias.numel() else torch.zeros(layer.out_features) for layer in layers]
        self.bias = torch.cat(biases) if any(layer.bias.numel() for layer in layers) else torch.empty(0)
        self.kernel = layers[0].kernel
        start = 0
        for layer in layers:
            quads = layer.packed.shape[0]
            layer.packed = self.packed[start: start + quads]
            start += quads

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Return each layer's x W^T + b for `x` [..., in] (computed in fp32, returned in x's dtype)."""
        rows = x.reshape(-1, self.in_features).float().contiguous()
        if self.layers[0].prompt_linear is not None and rows.shape[0] > PROMPT_ROWS:
            return tuple(layer(x) for layer in self.layers)
        y = self.kernel.linear(rows, self.packed, self.bias).to(x.dtype)
        return tuple(part.reshape(*x.shape[:-1], part.shape[-1]) for part in y.split(self.sizes, dim=-1))


def _back_to_back(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Return `tensors` (contiguous, same trailing shape) as one view concatenated along dim 0 where they lie back
    to back in one buffer, else None."""
    first = tensors[0]
    storage, offset = first.untyped_storage(), first.storage_offset()
    end = offset
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage.data_ptr() or t.storage_offset() != end or not t.is_contiguous():
            return None
        end += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.new_empty(0).set_(storage, offset, (rows, *first.shape[1:]))


def projection_runs(modules: Sequence[torch.nn.Module], fuse: bool = True) -> list[list[torch.nn.Module]]:
    """Split `modules` (read the same input, in output order) into runs that run as one call: consecutive modules on
    the 4-bit kernel (`Int4Linear`, same input size) together (unless not `fuse`), any other module on its own."""
    runs: list[list[torch.nn.Module]] = []
    for module in modules:
        layer = getattr(module, "quantized", None)
        last = getattr(runs[-1][-1], "quantized", None) if runs else None
        if fuse and isinstance(layer, Int4Linear) and isinstance(last, Int4Linear) \
                and layer.in_features == last.in_features:
            runs[-1].append(module)
        else:
            runs.append([module])
    return runs


def fused_projections(modules: Sequence[torch.nn.Module], fuse: bool = True
                      ) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """Return a callable giving each of `modules`' outputs for one shared input: each run of `projection_runs` of
    several modules as one `FusedInt4` call, any other module on its own."""
    calls = [FusedInt4([m.quantized for m in run]) if len(run) > 1 else (lambda x, m=run[0]: (m.forward(x),))
             for run in projection_runs(modules, fuse)]
    if len(calls) == 1:
        return calls[0]
    return lambda x: tuple(out for call in calls for out in call(x))
