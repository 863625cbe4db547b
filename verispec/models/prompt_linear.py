"""What reads prompts on the int4 path: the decode kernels themselves, an int8 copy of the weights on verispec's 8-bit
kernel or on fbgemm, or a bfloat16 copy on oneDNN.

Why: a prompt-sized forward is bound by arithmetic, not by the bytes read, and each kernel level does that
arithmetic at its own speed. Measured on the default target with 2 threads on 2-core Xeons:
  - with AMX tiles (Intel Xeon since Sapphire Rapids), verispec's 8-bit kernel runs passes on tiles: an int8 copy of
    the 4-bit layers on it read 256 / 1,024-token prompts in 0.85x / 0.95x of the time of a bfloat16 copy on
    oneDNN's AMX kernels (`benchmarks/prompt_linears.py`), for 1.6 GB of memory against 3.9 GB (measured once), at
    the precision of decode passes (NLL per token 2.6211 against 2.6160 on held-out text); the layers already on the
    8-bit kernel read prompts themselves;
  - at the AVX-512 VNNI level without AMX, the kernel is within reach of fbgemm's int8: an int8 copy read prompts of
    128 / 512 / 1,024 tokens in 0.92x / 0.85x / 0.89x of its time, and 600-700-token prompts of a decode in
    0.75-0.85x, for 2.2 GB of memory and 25-36 s to build for the default pair: no copy is made there;
  - the 256-bit levels (AVX2, AVX-VNNI; `VERISPEC_ISA`) are not: the AVX2 kernel took 2.4x the int8 copy's time on
    those 600-700-token prompts (16.4-17.3 s per 1,000 tokens, against 6.5-7.2), so fbgemm's copy is made there, as
    on the portable level.
Every method reads its prompt in one such forward, so prompt positions are computed alike for all methods, and a
row's outputs do not depend on the other rows (no activation scale is shared across the batch).

Formats (`CHOICES`; `VERISPEC_PROMPT_COPY` sets what "auto" means): "none", the layer's own kernel; "int8-rows",
verispec's 8-bit kernel (weights rounded to 8 bits per row, activations to 8 bits per token, integer sums);
"int8", fbgemm with weights rounded to 8 bits per channel and activations to 8 bits per token; "bf16", weights and
activations rounded to bfloat16 (8 significant bits), products summed in float32, outputs rounded to bfloat16.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.models.quantized import QuantizedLinear

PACK_ROWS = 256  # the batch size oneDNN packs the bfloat16 weights for (a typical prompt)
CHOICES = ("auto", "none", "int8-rows", "int8", "bf16")
CHOICE_VARIABLE = "VERISPEC_PROMPT_COPY"  # what "auto" means, where set


@functools.cache
def amx_available() -> bool:
    """Return whether this CPU has AMX tiles and torch's oneDNN can use them for bfloat16 linears."""
    import torch.cpu  # not imported by `import torch` in every version

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe is not None and probe() and onednn_bf16())


@functools.cache
def onednn_bf16() -> bool:
    """Return whether torch's oneDNN runs bfloat16 linears on this CPU (AVX-512 BF16 or AMX)."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and supported is not None and supported())


KERNEL_READS_PROMPTS = ("avx512-vnni",)  # the kernel levels that read prompts themselves where there is no AMX


def kernel_level() -> str:
    """Return the instruction-set level the int4 kernel runs at on this host (`verispec.native.cpu.best_isa`)."""
    from verispec.native.cpu import best_isa

    return best_isa()


def kernel_tiles() -> bool:
    """Return whether verispec's 8-bit kernel runs prompt-sized passes on AMX tiles on this host: its level is built
    with them (`verispec.native.cpu.amx_tiles`), and the OS grants them to this process (torch's probe in
    `amx_available` asks)."""
    from verispec.native.cpu import amx_tiles

    return amx_tiles(kernel_level()) and amx_available()


def prompt_format(choice: str = "auto") -> str:
    """Return the prompt copy's format for `choice`: "none" (no copy), "int8-rows", "int8" or "bf16"; "auto" means
    `$VERISPEC_PROMPT_COPY` where set, else int8-rows where the 8-bit kernel has AMX tiles, bf16 where only oneDNN
    has them, none where the kernel runs at the AVX-512 VNNI level, int8 elsewhere (the module's docstring)."""
    if choice not in CHOICES:
        raise ConfigError(f"unknown prompt copy format {choice!r}; choose one of {', '.join(CHOICES)}")
    if choice == "auto":
        chosen = os.environ.get(CHOICE_VARIABLE, "auto")
        if chosen not in CHOICES:
            raise ConfigError(f"{CHOICE_VARIABLE}={chosen!r} is not a prompt copy format; choose one of "
                              f"{', '.join(CHOICES)}")
        if chosen != "auto":
            return chosen
        if amx_available():
            return "int8-rows" if kernel_tiles() else "bf16"
        return "none" if kernel_level() in KERNEL_READS_PROMPTS else "int8"
    return choice


def copy_format(copy: Any) -> str:
    """Return the format of the prompt copy `copy`: its `format` (a lazy copy's, or its class's), else int8 (fbgemm)."""
    return getattr(copy, "format", "int8")


def prompt_copy(choice: str = "auto") -> str:
    """Return, in words, what reads prompts on the int4 path (for the outputs' kernel description)."""
    kind = prompt_format(choice)
    if kind == "bf16":
        return "a bfloat16 copy (oneDNN" + (", AMX)" if amx_available() else ")")
    if kind == "int8-rows":
        return "an int8 copy (verispec's 8-bit kernel" + (", AMX tiles)" if kernel_tiles() else ")")
    return "an int8 copy (fbgemm)" if kind == "int8" else "the same kernels"


class Bf16Linear:
    """y = x W^T + b with W and x in bfloat16, summed in float32 by oneDNN (AMX tiles where the CPU has them)."""

    format = "bf16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        w = weight.detach().to(torch.bfloat16).contiguous()
        # oneDNN's packed bfloat16 linear where this CPU has bfloat16 instructions; torch's own elsewhere (slow, same
        # formats: for tests on such hosts)
        self.onednn = onednn_bf16()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if self.onednn else w
        self.bias = bias.detach().float() if bias is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x W^T + b for `x` of shape [..., in] in any float dtype (returned in x's)."""
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if self.onednn:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "").float()
        else:
            y = torch.nn.functional.linear(rows, self.weight).float()
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def describe(self) -> str:
        """Return which kernel and number formats this layer runs."""
        return "bfloat16 weights and activations, float32 sums (" + ("oneDNN" + (", AMX)" if amx_available() else ")")
                                                                  if self.onednn else "torch)")


def prompt_layer(weight: torch.Tensor, bias: torch.Tensor | None, choice: str = "auto"
                 ) -> QuantizedLinear | Bf16Linear | None:
    """Return the copy of a linear's weights that reads prompts, in `prompt_format(choice)` ("int8" or "bf16"); None
    where that is "none" (the layer reads prompts itself). int8-rows copies live on verispec's kernel:
    `verispec.models.int4.prompt_copy_of` makes them (and every other format through this)."""
    kind = prompt_format(choice)
    if kind == "int8-rows":
        raise ValueError("int8-rows prompt copies are made by verispec.models.int4.prompt_copy_of")
    if kind == "none":
        return None
    return Bf16Linear(weight, bias) if kind == "bf16" else QuantizedLinear(weight, bias)
