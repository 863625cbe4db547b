// Attention one query at a time and the same passes' small per-token ops (attention.cpp), declared for the files
// compiled and linked with it: attention_module.cpp (the attention extension's Python functions) and decoder.cpp.
#pragma once

// ATen's tensor type and the few operators used, not <torch/extension.h>: that header (the C++ frontend and the
// Python bindings) costs about 30 s of compiler time per file on a 2-core Xeon, these about 6 s.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cstdint>

// Checks shared with the decoder stack: a [T, S] bool mask made contiguous (undefined when absent); the rotary cos
// and sin tables [T, D] float32, contiguous.
at::Tensor checked_mask(const c10::optional<at::Tensor>& mask, int64_t T, int64_t S, const char* caller);
void check_rotary_table(const at::Tensor& cos, const at::Tensor& sin, int64_t T, int64_t D, const char* caller);

// The cores on raw pointers (strides and layouts described at their definitions).
void attend_rows(const float* qp, int64_t qs_head, int64_t qs_token, const float* kp, int64_t ks_head, int64_t ks_row,
                 const float* vp, int64_t vs_head, int64_t vs_row, const bool* visible, int64_t heads, int64_t kv_heads,
                 int64_t T, int64_t S, int64_t D, float scale, float* op);
void rotate_rows(float* base, int64_t heads, int64_t head_stride, int64_t T, int64_t token_stride, int64_t D,
                 const float* cp, const float* sp);
void rms_norm_rows(const float* xp, int64_t rows, int64_t H, const float* wp, double eps, float* op);

// The checked entry points.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const c10::optional<at::Tensor>& mask, double scale);
void rotate_qk(at::Tensor q, at::Tensor k, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
