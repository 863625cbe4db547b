// Attention one query at a time and the same passes' small per-token ops (attention.cpp), declared for the files
// compiled and linked with it: attention_module.cpp (the attention extension's Python functions) and decoder.cpp.
#pragma once

#include <torch/extension.h>

#include <cstdint>

// Checks shared with the decoder stack: a [T, S] bool mask made contiguous (undefined when absent); the rotary cos
// and sin tables [T, D] float32, contiguous.
torch::Tensor checked_mask(const c10::optional<torch::Tensor>& mask, int64_t T, int64_t S, const char* caller);
void check_rotary_table(const torch::Tensor& cos, const torch::Tensor& sin, int64_t T, int64_t D, const char* caller);

// The cores on raw pointers (strides and layouts described at their definitions).
void attend_rows(const float* qp, int64_t qs_head, int64_t qs_token, const float* kp, int64_t ks_head, int64_t ks_row,
                 const float* vp, int64_t vs_head, int64_t vs_row, const bool* visible, int64_t heads, int64_t kv_heads,
                 int64_t T, int64_t S, int64_t D, float scale, float* op);
void rotate_rows(float* base, int64_t heads, int64_t head_stride, int64_t T, int64_t token_stride, int64_t D,
                 const float* cp, const float* sp);
void rms_norm_rows(const float* xp, int64_t rows, int64_t H, const float* wp, double eps, float* op);

// The checked entry points.
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const c10::optional<torch::Tensor>& mask, double scale);
void rotate_qk(torch::Tensor q, torch::Tensor k, const torch::Tensor& cos, const torch::Tensor& sin);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
