// The 4-bit and 8-bit linears of int4_linear.cpp (layout and arithmetic described there), declared for the files
// compiled and linked with it: int4_module.cpp (the int4 extension's Python functions) and decoder.cpp; and the
// packing of int4_pack.cpp.
#pragma once

// ATen's tensor type and the few operators used, not <torch/extension.h>: that header (the C++ frontend and the
// Python bindings) costs about 30 s of compiler time per file on a 2-core Xeon, these about 6 s.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <string>

constexpr int kRows = 16;   // output rows per block (one 512-bit vector of int32 / float32)
constexpr int kGroup = 32;  // inputs per group (one scale and offset)
constexpr int kQuad = 4;    // blocks stored interleaved, group by group: one sequential stream per thread
constexpr int kCell = 320;  // bytes per block and group: 256 of weights, 32 of scales, 32 of offsets
constexpr int kCell8 = 512; // int8 weights: bytes per block and chunk of 32 inputs

// The cores on raw rows: x [T, K] float32 contiguous; packed weights of NQ quads; bias [N] or null; out[t * ldo + n]
// receives output n of token t. linear8_rows also takes the rows' scales ws [N] and weight sums rs [N].
void linear_rows(const float* x, int64_t T, int64_t K, const uint8_t* pk, int64_t NQ, const float* bs, float* out,
                 int64_t ldo);
void linear8_rows(const float* x, int64_t T, int64_t K, const uint8_t* pk, int64_t NQ, const float* ws,
                  const int32_t* rs, const float* bs, float* out, int64_t ldo);

// Checks of the packed weights' layout: [N/64, K/32, 4, 320] uint8; [N/64, K/32, 4, 512] int8 with scale and rowsum.
void check_packed4(const at::Tensor& packed);
void check_packed8(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& rowsum);

// The packed layout of 4-bit levels q [N, K] uint8 (0..15) with float32 scale and offset [N, K/32], written into out
// [N/64, K/32, 4, 320] uint8 (int4_pack.cpp).
void pack4_into(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& offset, at::Tensor& out);
// The 8-bit layout (out [N/64, K/32, 4, 512] int8, row scales [N] float32, row sums [N] int32) of a 4-bit layer's
// packed weights, rounded to 8 bits per row as `Int8RowLinear` rounds float weights (int4_pack.cpp).
void pack8_from4(const at::Tensor& packed4, at::Tensor& out, at::Tensor& scale, at::Tensor& rowsum);

// The checked entry points: y [T, N] float32.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias);
at::Tensor linear8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                      const at::Tensor& rowsum, const at::Tensor& bias);

std::string isa();           // the instruction-set level this build was compiled for (verispec/native/cpu.py's names)
bool vnni();                 // whether its integer products run on vpdpbusd
int64_t parallel_threads();  // the most threads one parallel region of this build ran on

// The AMX tile path of 8-bit passes (int4_amx.h): whether it runs, from how many tokens, and turning it on or off.
bool amx();
int64_t amx_min_tokens();
void set_amx(bool on, int64_t min_tokens);
int64_t amx4_min_tokens();
void set_amx4(int64_t min_tokens);
