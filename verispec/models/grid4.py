"""Finding the 4-bit grid of float weights: per group of 32 inputs, whether the weights are exactly
`offset + scale * q` with q in 0..15 (as a 4-bit GGUF's dequantised Q4_K sub-blocks are), and that grid; groups on
no grid are rounded onto one. `verispec.models.int4` packs the result for its kernel.
"""

from __future__ import annotations

import torch

GROUP = 32  # inputs per scale and offset (llama.cpp's Q4_K sub-block)


def grid_4bit(weight: torch.Tensor, rel_tol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Return (q [out, in] uint8 in 0..15, scale [out, in/32], offset [out, in/32], share of groups on a grid).

    Per group of 32 inputs: where the weights are exactly offset + scale * q with integer q in 0..15 (to `rel_tol`
    of the group's range), that grid is recovered (offset = the group's minimum; the scale is the range divided by
    the largest level 15, 14, ... that puts every weight on an integer); elsewhere the group is rounded onto 16
    levels between its minimum and maximum. The share says how many groups were exact. Rows are taken in chunks
    (a 150k-row LM head would otherwise need several GB of temporaries); a chunk where fewer than half the groups
    sit on the 15-level grid, and fewer than half of its first 1,024 on any, is searched no further (it is no 4-bit
    tensor).
    """
    out_features, in_features = weight.shape
    qs, scales, offsets, exact_groups = [], [], [], 0
    chunk = max(1, (1 << 22) // in_features)
    for start in range(0, out_features, chunk):
        g = weight[start: start + chunk].detach().float().reshape(-1, GROUP)
        low = g.amin(1, keepdim=True)
        span = g.amax(1, keepdim=True) - low
        scale = (span / 15).clamp_min(torch.finfo(torch.float32).tiny)
        exact = (span[:, 0] == 0) | ((low + scale * torch.round((g - low) / scale) - g).abs() <= span * rel_tol).all(1)
        sample = torch.arange(min(1024, g.shape[0]))
        if exact.float().mean() >= 0.5 or _lower_tops(g, low, span, scale, exact, sample, rel_tol) >= 0.5:
            _lower_tops(g, low, span, scale, exact, torch.arange(g.shape[0]), rel_tol)
        qs.append(torch.round((g - low) / scale).clamp_(0, 15).to(torch.uint8))
        scales.append(scale)
        offsets.append(low)
        exact_groups += int(exact.sum())
    shape = (out_features, in_features // GROUP)
    q = torch.cat(qs).reshape(out_features, in_features)
    share = exact_groups / (shape[0] * shape[1])
    return q, torch.cat(scales).reshape(shape), torch.cat(offsets).reshape(shape), share


def _lower_tops(g: torch.Tensor, low: torch.Tensor, span: torch.Tensor, scale: torch.Tensor, exact: torch.Tensor,
                rows: torch.Tensor, rel_tol: float) -> float:
    """Try top levels 14..1 on the groups `rows` not yet `exact` (a Q4_K group need not reach level 15); update
    `scale` and `exact` in place where a grid fits; return the share of `rows` now exact."""
    for top in range(14, 0, -1):
        rest = rows[~exact[rows]]
        if rest.numel() == 0:
            break
        step = span[rest] / top
        fits = ((low[rest] + step * torch.round((g[rest] - low[rest]) / step) - g[rest]).abs()
                <= span[rest] * rel_tol).all(1)
        scale[rest[fits]] = step[fits]
        exact[rest[fits]] = True
    return exact[rows].float().mean().item()
