"""CPU fast paths: the registry of linear backends, and the oneDNN one (every nn.Linear with a pre-packed weight).

Why: on x86 CPUs PyTorch's default fp32 linear (MKL) is efficient for one row (a GEMV at the memory-bandwidth
floor) but 5-8x slower for 2-16 rows, exactly the sizes a speculative target pass has. oneDNN with a weight packed
once (`mkldnn::_reorder_linear_weight`) keeps a forward over a few tokens close to the cost of one, so the
ratio f(k) = time(k-token forward) / time(1-token forward) that decides whether speculation pays stays low.
Numerics: the same fp32 (or bf16) arithmetic, another summation order (differences ~1e-6 relative in fp32).
The "int8" backend (verispec.models.quantized) reads 4x fewer weight bytes, LM head included; "int4"
(verispec.models.int4) keeps the linears of a 4-bit GGUF in 4 bits and runs the others in int8; "int4-rounded"
rounds those others to 4 bits too (an approximation: meant for drafts, whose weights change only the acceptance).
"auto" (the default) picks one per model: `resolve_linear_backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.models.int4 import ISA_NAMES, PROMPT_ROWS, use_int4_linears
from verispec.models.prompt_linear import prompt_copy, prompt_format
from verispec.models.quantized import quantized_engine, reduce_range_needed, use_int8_linears

QUANTIZED_BACKENDS = ("int8", "int4", "int4-rounded")  # every token computed on its own (per-token activations)

# What each backend runs, as the outputs report it (`model.linear_kernel`).
KERNELS = {
    "torch": "transformers' own linears ({dtype} weights)",
    "onednn": "oneDNN, packed {dtype} weights",
    "int8": "int8 weights per channel (LM head included), per-token dynamic {bits} activations, fbgemm",
    "int4": "4-bit weights per 32 inputs in {int4} linears and int8 per row in {int8_rows} (verispec's kernel, "
    "{isa}{prompt}), int8 per channel in {int8} (fbgemm), per-token dynamic {bits} activations",
}
KERNELS["int4-rounded"] = KERNELS["int4"].replace("linears and", "linears ({int4_rounded} of them rounded to 4 bits) "
                                                                 "and")


def draft_backend_for(target_backend: str) -> str:
    """Return the draft's linear backend when none is given: the target's, except that an int4 target gets an
    int4-rounded draft (every draft linear in 4 bits: measured on the default pair, c 0.48 -> 0.36 of a target
    forward for 0.3-0.6 points of exact acceptance, BENCHMARKS.md §3; lossless methods keep the target's law
    whatever the draft's weights). "auto" stays "auto": the draft's own rule picks int4-rounded for a GGUF draft."""
    return "int4-rounded" if target_backend == "int4" else target_backend


def is_gguf_spec(spec: str | None) -> bool:
    """Return whether the model spec names a GGUF model: the embedded default pair (None, "default") or a .gguf
    file (not one run by llama.cpp)."""
    return spec is None or spec == "default" or (spec.endswith(".gguf") and not spec.startswith("llamacpp:"))


def kernel_isa() -> str:
    """Return the instruction-set level verispec's 4-bit kernel runs on this CPU ("avx512-vnni", "avx-vnni", "avx2"
    or "portable": `verispec.native.cpu.best_isa`; where that module is absent, torch's reading of the CPU:
    "avx2" for AVX2 or AVX-512, else "portable")."""
    try:
        from verispec.native.cpu import best_isa
    except ImportError:
        return "avx2" if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "portable"
    return best_isa()


def resolve_linear_backend(backend: str, spec: str | None, role: str, device: str | torch.device = "cpu",
                           dtype: str | torch.dtype = "float32") -> str:
    """Return the linear backend that `backend` means for the model `spec` in `role` ("target" or "draft"): itself,
    unless it is "auto", which picks per model:
      - off the CPU: "torch" (transformers' linears on the accelerator);
      - float32 on the CPU, a GGUF model (the embedded pair, a .gguf file), where verispec's kernel has a vector
        path on this CPU (`kernel_isa` is not "portable") and torch has fbgemm: "int4" for a target, "int4-rounded"
        for a draft (`draft_backend_for`): the 4-bit weights the GGUF ships, read straight from its blocks;
      - any other float32 or bfloat16 model on the CPU: "onednn" (packed float weights: the model's own numbers);
      - other dtypes (float16, float64): "torch", as `apply_linear_backend` would fall back to.
    """
    check_linear_backend(backend)
    if backend != "auto":
        return backend
    on_cpu, float32 = torch.device(device).type == "cpu", dtype in ("float32", torch.float32)
    if on_cpu and float32 and is_gguf_spec(spec) and quantized_engine() is not None and kernel_isa() != "portable":
        return draft_backend_for("int4") if role == "draft" else "int4"
    return float_backend(device, dtype)


def float_backend(device: str | torch.device, dtype: str | torch.dtype) -> str:
    """Return what "auto" picks for a model with float weights: "onednn" for float32 or bfloat16 on the CPU (where
    torch has oneDNN's linear ops), "torch" otherwise."""
    on_cpu = torch.device(device).type == "cpu"
    packable = dtype in ("float32", "bfloat16", torch.float32, torch.bfloat16)
    return "onednn" if on_cpu and packable and onednn_available() else "torch"


def check_linear_backend(backend: str) -> str:
    """Return `backend` if it names a linear backend; raise ConfigError naming the choices otherwise."""
    if backend not in LINEAR_BACKENDS:
        raise ConfigError(f"unknown linear backend {backend!r}; choose one of {', '.join(LINEAR_BACKENDS)}")
    return backend


def onednn_available() -> bool:
    """Return whether this torch build has the oneDNN linear ops used here (CPU builds for x86 and ARM do)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None, out_features: int, min_rows: int) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # oneDNN takes a 2-D input: [tokens, in]
        n = rows.shape[0]
        if n < min_rows:
            # Measured here: oneDNN's kernel for 1-3 rows is slower than its kernel for the packed batch size,
            # so a 1-token forward runs faster padded with zero rows (sliced off below).
            rows = torch.cat([rows, rows.new_zeros(min_rows - n, rows.shape[1])])
        y = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")  # [rows, out]
        return y[:n].reshape(*x.shape[:-1], out_features)

    return forward


@torch.no_grad()
def use_onednn_linears(model: torch.nn.Module, batch_hint: int = 4, min_rows: int = 4) -> int:
    """Route every CPU nn.Linear of `model` through oneDNN with a packed weight; return how many were changed.

    The dense weight is released (the packed copy replaces it), so memory does not double; the module keeps a
    zero-width placeholder weight so that code reading `weight.shape[0]`, dtype or device still works.
    Tied weights (shared with an embedding) are left alone.
    """
    if not onednn_available():
        return 0
    shared = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    changed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or id(module.weight) in shared:
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
            continue
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        bias = module.bias.detach() if module.bias is not None else None
        module.forward = _packed_forward(packed, bias, module.out_features, min_rows)
        module.weight = torch.nn.Parameter(weight.new_empty(module.out_features, 0), requires_grad=False)
        changed += 1
    return changed


def _onednn(model: Any, backend: str) -> dict[str, int]:
    return {"linears": use_onednn_linears(model.model)}


def _int8(model: Any, backend: str) -> dict[str, int]:
    return {"linears": use_int8_linears(model.model, lm_head=model.model.get_output_embeddings())}


def _int4(model: Any, backend: str) -> dict[str, int]:
    return use_int4_linears(model.model, lm_head=model.model.get_output_embeddings(),
                            round_to_4bit=backend == "int4-rounded")


# The linear backends that replace a CPU model's linears: name -> the builder that routes an `HFCausalLM`'s float
# linears through it and returns the layers it changed per kind (all zero: nothing it applies to, e.g. no oneDNN in
# this torch or float64 weights). "torch" keeps transformers' linears; "auto" picks one (`resolve_linear_backend`).
LINEAR_BUILDERS: dict[str, Callable[[Any, str], dict[str, int]]] = {
    "onednn": _onednn,
    "int8": _int8,
    "int4": _int4,
    "int4-rounded": _int4,
}
LINEAR_BACKENDS = ("auto", "torch", *LINEAR_BUILDERS)


def apply_linear_backend(model: Any, backend: str, requested: str | None = None) -> str:
    """Route the linears of `model` (an `HFCausalLM` with float weights) through `backend`, record it as
    `model.linear_backend` (and what runs as `model.linear_kernel`) and return it: the backend actually in effect,
    "torch" off the CPU, for weights other than float32/bfloat16 (float64 test models), or where torch lacks the
    kernels. "auto" is resolved from the model's device and dtype as for a float model (`resolve_linear_backend`).
    `requested`: what the user asked for, when `backend` is already its resolution (the record says both)."""
    requested = requested or check_linear_backend(backend)
    if backend == "auto":
        backend = float_backend(model.device, model.model.dtype)
    applied, counts = "torch", {}
    builder = LINEAR_BUILDERS.get(backend)
    if model.device.type == "cpu" and builder is not None:
        counts = builder(model, backend)
        if sum(counts.values()) > 0:
            applied = backend
    return record_linear_backend(model, applied, requested, counts)


def record_linear_backend(model: Any, applied: str, requested: str, counts: dict[str, int]) -> str:
    """Record on `model` (an `HFCausalLM` whose linears now run `applied`; `counts`: its layers per kind, as
    `use_int4_linears` gives them, for int4 backends) what runs: `linear_backend`, `linear_kernel` and the forward
    settings the backend needs; rebuild its decoder loop over the new linears. Return `applied`."""
    model.linear_backend = applied
    # Linears that compute every token on its own: decode and verify passes also attend one query at a time
    # (verispec.models.query_attention), so a drafted block gets exactly the logits one-token forwards give it;
    # forwards over more than PROMPT_ROWS tokens (prompts) run other kernels, so the engine reads prompts apart.
    row_exact = applied in QUANTIZED_BACKENDS
    model.per_query_attention = row_exact
    model.prompt_rows = PROMPT_ROWS if row_exact else None
    if applied != "torch":
        model.linears_changed()
    bits = "8-bit"
    if applied in QUANTIZED_BACKENDS and reduce_range_needed():
        bits = "7-bit (this CPU's int8 kernel adds in int16)"
    isa = ISA_NAMES[kernel_isa()] if applied in ("int4", "int4-rounded") else ""
    dtype = str(model.model.dtype).removeprefix("torch.")
    prompt = "" if prompt_format() == "none" else f"; prompts over {PROMPT_ROWS} tokens on {prompt_copy()}"
    model.linear_kernel = KERNELS[applied].format(bits=bits, prompt=prompt, isa=isa, dtype=dtype, **counts)
    if requested == "auto":
        model.linear_kernel += f" (auto's choice for {dtype} weights on {model.device})"
    elif applied != requested:
        model.linear_kernel += f" ({requested} requested; not applicable to {dtype} weights on {model.device})"
    return applied
