"""A model's decoder layers as one C++ call per decode or verify pass (verispec/native/decoder.cpp).

Why: between its linears, a one-token forward of the decoder loop makes about 40 small Python and torch calls per
layer (views, casts, splits, residual adds, cache writes, the activation), each costing more in dispatch than in
arithmetic: measured, a third of the 0.5B draft's one-token forward and a fifth of the 1.5B target's. The stack runs
the same steps with the same kernels on raw buffers, so its hidden states are bit-identical to the loop's (tested).

It is built where every projection of every layer runs on verispec's kernels (the int4 path's `Int4Linear` and
`Int8RowLinear`) and attention runs one query at a time; otherwise the decoder loop runs its layers step by step.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.models.fused import FusedInt4, projection_runs
from verispec.models.int4 import INCLUDES as INT4_INCLUDES
from verispec.models.int4 import Int4Linear, Int8RowLinear, extension
from verispec.models.query_attention import INCLUDES as ATTENTION_INCLUDES
from verispec.models.query_attention import attention_extension
from verispec.native.build import load_native

NATIVE = Path(__file__).resolve().parent.parent / "native"
# The stack, linked with the two kernels it calls as the kernels' own extensions compiled them for the same level
# (attention.o, int4_linear.o: not compiled a second time; their Python modules are not part of it).
SOURCES = (NATIVE / "decoder.cpp",)
INCLUDES = (*ATTENTION_INCLUDES, *INT4_INCLUDES)


@functools.cache
def stack_kernel(isa: str | None = None) -> Any | None:
    """Return the decoder stack's extension for instruction-set level `isa` (verispec.native.cpu; None: the level
    the layers' kernel runs), built once per machine; None where it cannot be built. Every level's stack gives the
    same bits."""
    try:
        kernels = (extension(isa), attention_extension(isa))
        objects = tuple(Path(kernel.__file__).parent / name
                        for kernel, name in zip(kernels, KERNEL_OBJECTS, strict=True))
        if not all(path.is_file() for path in objects):  # a build folder pruned by hand: compile them here
            return load_native((*SOURCES, NATIVE / "int4_linear.cpp", NATIVE / "attention.cpp"), "decoder", isa,
                               includes=INCLUDES)
        return load_native(SOURCES, "decoder", isa, includes=INCLUDES, objects=objects)
    except ConfigError:
        return None


KERNEL_OBJECTS = ("int4_linear.o", "attention.o")  # what torch's builder names the two kernels' compiled units


def set_amx_tiles(on: bool, min_tokens: int | None = None) -> None:
    """Let the kernel's 8-bit layers run passes of `min_tokens` or more (None: the default, 5) on AMX tiles where the
    CPU has them (the default), or keep them on the vector path: both give the same bits, so this only serves to
    measure one against the other. Applies to both copies of the kernel: the layers' and this stack's."""
    if min_tokens is not None and min_tokens < 1:
        raise ValueError(f"min_tokens must be >= 1 (or None for the default), got {min_tokens}")
    for kernel in (extension(), stack_kernel()):
        if kernel is not None:
            kernel.set_amx(on, min_tokens or 0)


def set_amx4_tiles(min_tokens: int | None = None) -> None:
    """Let the kernel's 4-bit layers run passes of `min_tokens` tokens or more on AMX tiles (None: the default, 10;
    0: never), where the CPU has them and `set_amx_tiles` has not turned tiles off; both paths give the same bits,
    so this only serves to measure them. Applies to both kernel copies."""
    if min_tokens is not None and min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0 (0: never; None: the default), got {min_tokens}")
    for kernel in (extension(), stack_kernel()):
        if kernel is not None:
            kernel.set_amx4(-1 if min_tokens == 0 else (min_tokens or 0))


def _parts(modules: list[torch.nn.Module], fuse: bool) -> list[tuple[torch.Tensor, ...]] | None:
    """Return the kernel's parts of a projection over `modules` (run as the decoder loop runs them), or None when
    one of them is not on the kernel."""
    empty = torch.empty(0)
    parts = []
    for run in projection_runs(modules, fuse):
        layers = [getattr(module, "quantized", None) for module in run]
        if len(layers) > 1:  # the loop's FusedInt4 made their weights back to back: this one copies nothing
            fused = FusedInt4(layers)  # type: ignore[arg-type]  # projection_runs fuses Int4Linear only
            parts.append((fused.packed, empty, empty, fused.bias))
        elif isinstance(layers[0], Int4Linear):
            parts.append((layers[0].packed, empty, empty, layers[0].bias))
        elif isinstance(layers[0], Int8RowLinear):
            parts.append((layers[0].packed, layers[0].scale, layers[0].rowsum, layers[0].bias))
        else:
            return None
    return parts


def decoder_stack(model: Any, layers: list[Any], fuse: bool = True, isa: str | None = None) -> Any | None:
    """Return a `DecoderStack` over `layers` (of `model`, a transformers CausalLM the decoder loop runs), compiled
    for instruction-set level `isa` (None: this CPU's best), or None when a projection is not on verispec's kernels
    or the extension cannot be built."""
    kernel = stack_kernel(isa)
    if kernel is None:
        return None
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return None
    specs = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections = [_parts([attn.q_proj, attn.k_proj, attn.v_proj], fuse), _parts([attn.o_proj], fuse),
                       _parts([mlp.gate_proj, mlp.up_proj], fuse), _parts([mlp.down_proj], fuse)]
        if any(parts is None for parts in projections):
            return None
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if any(norm.weight.dtype != torch.float32 for norm in norms):
            return None
        qkv, o, gate_up, down = projections
        specs.append((norms[0].weight.detach(), float(norms[0].variance_epsilon), qkv, o,
                      norms[1].weight.detach(), float(norms[1].variance_epsilon), gate_up, down))
    attn = layers[0].self_attn
    return kernel.DecoderStack(specs, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                               attn.head_dim, config.intermediate_size, attn.scaling)
