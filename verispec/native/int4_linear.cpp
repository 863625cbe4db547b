// y = x W^T + b with W in 4 bits (groups of 32 inputs: w = scale * q + offset, q in 0..15) and x quantized to
// int8 per token at run time. verispec/models/int4.py builds this once per machine and packs the weights.
//
// Why: a CPU decode step reads every weight once, so its time is the bytes read; 4-bit weights read half of int8's.
// The integer products run many outputs x 4 inputs per instruction (vpdpbusd, or vpmaddubsw on AVX2: unsigned 4-bit
// weights times signed int8 activations, summed exactly), and one pass over a block of weights serves up to 8
// tokens, so a forward over a few tokens costs little more than one: what a speculative verify pass needs.
//
// Instruction sets: VERISPEC_ISA_LEVEL (set with the level's flags by verispec/native/cpu.py) picks the path: 3
// AVX-512 VNNI (int4_avx512.h, and AMX tiles for 8-bit passes: int4_amx.h), 2 AVX-VNNI and 1 AVX2 (256-bit:
// int4_avx2.h), 0 the portable C++ below. Every path reads the same packed weights and returns the same bits.
//
// Causality and determinism: each token has its own activation scale, its integer sums are exact, and its float
// accumulation runs over the groups in one fixed order whatever the batch (per group, acc = fma(dot, scale, acc),
// then acc = fma(offset, xsum, acc)), so a row's outputs are bit-identical alone or inside any batch, on any path.
//
// Packed layout: output rows in blocks of 16, blocks in quads of 4, stored [quad][group][block][320 bytes] so that
// a thread reads its weights as one sequential stream. Per block and group of 32 inputs, 320 bytes: 4 vectors of 64
// bytes whose byte (p, j, b) holds q[j][4p + b] in its low nibble and q[j][4(p + 4) + b] in its high nibble (j the
// row in the block), then the 16 rows' float16 scales, then their float16 offsets.
//
// linear8: the same for int8 weights with one float32 scale per output row (layers a 4-bit GGUF keeps in more bits).
// The integer sum runs over all inputs at once, so there is no per-group float work; vpdpbusd takes the activations
// as unsigned bytes (int8 + 128) and the weights as signed ones, and 128 x the row's weight sum is taken off after.
// Packed: [quad][chunk of 32 inputs][block][8 vectors of 64 bytes], byte (p, j, b) = w[j][4p + b] (j: row in block).
#include "int4_linear.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef VERISPEC_ISA_LEVEL
#define VERISPEC_ISA_LEVEL 0
#endif
#if VERISPEC_ISA_LEVEL >= 1
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__) || \
    (VERISPEC_ISA_LEVEL >= 2 && !defined(__AVXVNNI__) && !defined(__AVX512VNNI__)) || \
    (VERISPEC_ISA_LEVEL >= 3 && !defined(__AVX512BW__))
#error "VERISPEC_ISA_LEVEL asks for instructions these compiler flags do not enable"
#endif
#include <immintrin.h>
#endif

namespace {

constexpr int kTile = 8;       // tokens per register tile
constexpr int kSuper = 64;     // tokens whose activations stay in cache while every block of weights passes
constexpr int64_t kQuadGroup = kQuad * kCell;
constexpr int64_t kQuadChunk8 = kQuad * kCell8;
constexpr int64_t kPrefetch = 16384;  // bytes ahead of the weights in use that are asked into L2

inline int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Where block r (of its quad) keeps group g: 256 bytes of weights, then 16 float16 scales, then 16 offsets.
inline const uint8_t* at_group(const uint8_t* quad, int64_t g, int r) { return quad + g * kQuadGroup + r * kCell; }

// A path's tiles: tile<RB, TT> fills acc[r][t][16] (float) for RB blocks r of one quad (from `quad`, offset to the
// first) and TT tokens t, the sum over groups of scale * (q . xq) + offset * xsum; tile8<RB, TT> fills int32 sums
// over the inputs for int8 weights. Each path lists, per token count 1..8, its tile and how many of a quad's blocks
// it takes at once (kTiles, kTiles8, kTileBlocks), and how it quantizes one token's row (quantize_row).
using TileFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, const float*, float*);
using Tile8Fn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, int32_t*);

}  // namespace

#if VERISPEC_ISA_LEVEL >= 3
#include "int4_avx512.h"
#elif VERISPEC_ISA_LEVEL >= 1
#include "int4_avx2.h"
#else
namespace {

// The reference every other path matches: the same integer sums and the same float operations in the same order.
inline float quantize_row(const float* row, int64_t K, int8_t* out, float* sums) {
  float peak = 0.0f;
  for (int64_t k = 0; k < K; ++k) peak = std::fmax(peak, std::fabs(row[k]));
  peak = std::fmax(peak, 1e-30f);  // an all-zero row stays zero
  const float inv = 127.0f / peak;
  for (int64_t g = 0; g < K / kGroup; ++g) {
    int32_t sum = 0;
    for (int k = 0; k < kGroup; ++k) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(row[g * kGroup + k] * inv));  // half to even
      out[g * kGroup + k] = static_cast<int8_t>(v);
      sum += v;
    }
    sums[g] = static_cast<float>(sum);
  }
  return peak;
}

template <int RB, int TT>
inline void tile(const uint8_t* quad, int64_t G, const int8_t* xq, int64_t K, const float* xsum, float* acc_out) {
  for (int r = 0; r < RB; ++r) {
    float acc[TT][kRows] = {};
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* p = at_group(quad, g, r);
      const at::Half* sc = reinterpret_cast<const at::Half*>(p + 256);
      const at::Half* of = reinterpret_cast<const at::Half*>(p + 288);
      for (int t = 0; t < TT; ++t) {
        const int8_t* xr = xq + t * K + g * kGroup;
        for (int j = 0; j < kRows; ++j) {
          int32_t dot = 0;
          for (int q = 0; q < 4; ++q) {
            for (int b = 0; b < 4; ++b) {
              const uint8_t byte = p[64 * q + 4 * j + b];
              dot += static_cast<int32_t>(byte & 0x0F) * xr[4 * q + b];
              dot += static_cast<int32_t>(byte >> 4) * xr[4 * (q + 4) + b];
            }
          }
          acc[t][j] = std::fma(static_cast<float>(dot), static_cast<float>(sc[j]), acc[t][j]);
          acc[t][j] = std::fma(static_cast<float>(of[j]), xsum[t * G + g], acc[t][j]);
        }
      }
    }
    std::memcpy(acc_out + r * TT * kRows, acc, sizeof(acc));
  }
}

// Sums xq * w over the inputs (the vector paths sum (xq + 128) * w and take 128 x the row's weight sum off after:
// the same integer).
template <int RB, int TT>
inline void tile8(const uint8_t* quad, int64_t C, const int8_t* xq, int64_t K, int32_t* acc_out) {
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TT; ++t)
      for (int j = 0; j < kRows; ++j) {
        int32_t sum = 0;
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t* cell = quad + c * kQuadChunk8 + r * kCell8;
          for (int p = 0; p < 8; ++p)
            for (int b = 0; b < 4; ++b)
              sum += xq[t * K + c * kGroup + 4 * p + b] * static_cast<int8_t>(cell[64 * p + 4 * j + b]);
        }
        acc_out[(r * TT + t) * kRows + j] = sum;
      }
}

constexpr int32_t kShift8 = 0;
constexpr TileFn kTiles[kTile + 1] = {nullptr, tile<4, 1>, tile<4, 2>, tile<4, 3>, tile<4, 4>, tile<4, 5>,
                                     tile<4, 6>, tile<4, 7>, tile<4, 8>};
constexpr Tile8Fn kTiles8[kTile + 1] = {nullptr, tile8<4, 1>, tile8<4, 2>, tile8<4, 3>, tile8<4, 4>, tile8<4, 5>,
                                        tile8<4, 6>, tile8<4, 7>, tile8<4, 8>};
constexpr int kTileBlocks[kTile + 1] = {0, 4, 4, 4, 4, 4, 4, 4, 4};

}  // namespace
#endif

namespace {

// Per token t: int8 activations xq[t] (x * 127 / max|x| rounded half to even), the scale s = max|x| / 127, and the
// integer sum of xq over each group (for the offsets' term; exact, so its order does not matter).
void quantize_rows(const float* x, int64_t T, int64_t K, int8_t* xq, float* xs, float* xsum) {
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) xs[t] = quantize_row(x + t * K, K, xq + t * K, xsum + t * (K / kGroup)) / 127.0f;
  });
}

}  // namespace

#include "int4_amx.h"

namespace {

// Every token's int8 activations, scale and per-group sums (quantize_rows), for x [T, K].
struct TokenQuant {
  at::Tensor q, scale, sums;
};

TokenQuant quantize_raw(const float* x, int64_t T, int64_t K) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  TokenQuant a{at::empty({T, K}, options.dtype(at::kChar)), at::empty({T}, options),
               at::empty({T, K / kGroup}, options)};
  quantize_rows(x, T, K, a.q.data_ptr<int8_t>(), a.scale.data_ptr<float>(), a.sums.data_ptr<float>());
  return a;
}

// The traversal every path shares: quads of blocks split over the threads, up to kSuper tokens at a time passing each
// quad while its weights stay in cache, register tiles of up to kTile tokens. run(nq, r0, t0, tt, acc) fills acc for
// the tile's blocks r0.. of quad nq and tokens t0..t0+tt; store(n0, t, a) writes token t's outputs n0..n0+15 from a.
template <typename Acc, typename Run, typename Store>
void over_tiles(int64_t NQ, int64_t T, const Run& run, const Store& store) {
  at::parallel_for(0, NQ, 1, [&](int64_t q0, int64_t q1) {
    alignas(64) Acc acc[kTile * kRows * kQuad];
    for (int64_t s0 = 0; s0 < T; s0 += kSuper) {
      const int64_t s1 = std::min(T, s0 + kSuper);
      for (int64_t nq = q0; nq < q1; ++nq) {
        // Tiles as even as they can be: each costs about the same per token, but a pass of 9 as 8 + 1 ran its last
        // token at a one-token pass's full price (the weights streamed again for one token).
        const int64_t tiles = (s1 - s0 + kTile - 1) / kTile;
        int64_t t0 = s0;
        for (int64_t i = 0; i < tiles; ++i) {
          const int tt = static_cast<int>((s1 - t0) / (tiles - i));
          const int rb = kTileBlocks[tt];
          for (int r0 = 0; r0 < kQuad; r0 += rb) {
            run(nq, r0, t0, tt, acc);
            for (int r = 0; r < rb; ++r)
              for (int t = 0; t < tt; ++t) store((nq * kQuad + r0 + r) * kRows, t0 + t, acc + (r * tt + t) * kRows);
          }
          t0 += tt;
        }
      }
    }
  });
}

void check_x_and_bias(const at::Tensor& x, const at::Tensor& bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous [T, K] fp32");
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == N && bias.scalar_type() == at::kFloat), "bias: [N] fp32");
}

}  // namespace

// The 4-bit and 8-bit linears' cores on raw rows, for the checked entry points below and for verispec/native/decoder.cpp
// (declared in int4_linear.h): x [T, K] float32 contiguous; out[t * ldo + n] receives output n of token t.
void linear_rows(const float* x, int64_t T, int64_t K, const uint8_t* pk, int64_t NQ, const float* bs, float* out,
                 int64_t ldo) {
  if (T == 0) return;
  const int64_t G = K / kGroup;
  const TokenQuant a = quantize_raw(x, T, K);
  const int8_t* q = a.q.data_ptr<int8_t>();
  const float* s = a.scale.data_ptr<float>();
  const float* sums = a.sums.data_ptr<float>();
  const auto store = [&](int64_t n0, int64_t t, const float* acc) {
    float* row = out + t * ldo + n0;
    for (int j = 0; j < kRows; ++j) row[j] = std::fma(acc[j], s[t], bs ? bs[n0 + j] : 0.0f);
  };
#if VERISPEC_AMX
  if (amx4_for(T)) {
    over_amx_tiles<float>(
        NQ, T, kAmx4Tokens,
        [](int tt) { configure_tiles4(std::min(tt, kAmxTokens), std::max(tt - kAmxTokens, 0)); },
        [&](int64_t nq, int64_t t0, int tt, float* acc) {
          amx_quad4(pk + nq * G * kQuadGroup, G, q + t0 * K, K, sums + t0 * G, std::min(tt, kAmxTokens),
                    std::max(tt - kAmxTokens, 0), acc);
        },
        store);
    return;
  }
#endif
  over_tiles<float>(
      NQ, T,
      [&](int64_t nq, int r0, int64_t t0, int tt, float* acc) {
        kTiles[tt](pk + nq * G * kQuadGroup + r0 * kCell, G, q + t0 * K, K, sums + t0 * G, acc);
      },
      store);
}

void linear8_rows(const float* x, int64_t T, int64_t K, const uint8_t* pk, int64_t NQ, const float* ws,
                  const int32_t* rs, const float* bs, float* out, int64_t ldo) {
  if (T == 0) return;
  const int64_t C = K / kGroup;
  const TokenQuant a = quantize_raw(x, T, K);
  const int8_t* q = a.q.data_ptr<int8_t>();
  const float* s = a.scale.data_ptr<float>();
  // The VNNI paths sum (xq + 128) * w, the others (AMX tiles among them) xq * w: the same integer once 128 x the
  // row's weight sum is taken off the former.
  const bool amx = amx_for(T);
  const int32_t shift = amx ? 0 : kShift8;
  const auto store = [&](int64_t n0, int64_t t, const int32_t* acc) {
    float* row = out + t * ldo + n0;
    for (int j = 0; j < kRows; ++j) {
      const float dot = static_cast<float>(acc[j] - shift * rs[n0 + j]);  // exact: |.| < 2^31
      row[j] = std::fma(dot, ws[n0 + j] * s[t], bs ? bs[n0 + j] : 0.0f);
    }
  };
#if VERISPEC_AMX
  if (amx) {
    over_amx_tiles<int32_t>(
        NQ, T, kAmxTokens, [](int tt) { configure_tiles(tt); },
        [&](int64_t nq, int64_t t0, int tt, int32_t* acc) {
          amx_quad8(pk + nq * C * kQuadChunk8, C, q + t0 * K, K, tt, acc);
        },
        store);
    return;
  }
#endif
  over_tiles<int32_t>(
      NQ, T,
      [&](int64_t nq, int r0, int64_t t0, int tt, int32_t* acc) {
        kTiles8[tt](pk + nq * C * kQuadChunk8 + r0 * kCell8, C, q + t0 * K, K, acc);
      },
      store);
}

// Checks of the packed weights' layout shared by the entry points here and the decoder stack's constructor.
void check_packed4(const at::Tensor& packed) {
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kQuad && packed.size(3) == kCell &&
                  packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed: [N/64, K/32, 4, 320] uint8");
}

void check_packed8(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& rowsum) {
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kQuad && packed.size(3) == kCell8 &&
                  packed.scalar_type() == at::kChar && packed.is_contiguous(), "packed: [N/64, K/32, 4, 512] int8");
  const int64_t N = packed.size(0) * kQuad * kRows;
  TORCH_CHECK(packed.size(1) * kGroup <= 65536, "the 8-bit path sums in int32: at most 65536 inputs, got ",
              packed.size(1) * kGroup);
  TORCH_CHECK(scale.numel() == N && scale.scalar_type() == at::kFloat && scale.is_contiguous(), "scale: [N] fp32");
  TORCH_CHECK(rowsum.numel() == N && rowsum.scalar_type() == at::kInt && rowsum.is_contiguous(), "rowsum: [N] int32");
}

// x [T, K] float32 (contiguous); packed [N/64, K/32, 4, 320] uint8 (see the layout above); bias [N] float32 or
// empty. Returns [T, N] float32.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias) {
  check_packed4(packed);
  const int64_t NQ = packed.size(0), G = packed.size(1), N = NQ * kQuad * kRows;
  check_x_and_bias(x, bias, N);
  const int64_t T = x.size(0), K = x.size(1);
  TORCH_CHECK(G * kGroup == K, "x has ", K, " inputs, the weights ", G * kGroup);
  auto y = at::empty({T, N}, x.options());
  linear_rows(x.data_ptr<float>(), T, K, packed.data_ptr<uint8_t>(), NQ,
              bias.numel() > 0 ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(), N);
  return y;
}

// x [T, K] float32 (contiguous); packed [N/64, K/32, 4, 512] int8 weights (see the layout above); scale [N] float32
// (per row); rowsum [N] int32 (the row's weight sum); bias [N] float32 or empty. Returns [T, N] float32.
at::Tensor linear8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                      const at::Tensor& rowsum, const at::Tensor& bias) {
  check_packed8(packed, scale, rowsum);
  const int64_t NQ = packed.size(0), C = packed.size(1), N = NQ * kQuad * kRows;
  check_x_and_bias(x, bias, N);
  const int64_t T = x.size(0), K = x.size(1);
  TORCH_CHECK(C * kGroup == K, "x has ", K, " inputs, the weights ", C * kGroup);
  auto y = at::empty({T, N}, x.options());
  linear8_rows(x.data_ptr<float>(), T, K, reinterpret_cast<const uint8_t*>(packed.data_ptr<int8_t>()), NQ,
               scale.data_ptr<float>(), rowsum.data_ptr<int32_t>(), bias.numel() > 0 ? bias.data_ptr<float>() : nullptr,
               y.data_ptr<float>(), N);
  return y;
}

// The instruction-set level this module was compiled for (verispec/native/cpu.py's names).
std::string isa() {
  constexpr const char* kNames[] = {"portable", "avx2", "avx-vnni", "avx512-vnni"};
  return kNames[VERISPEC_ISA_LEVEL];
}

bool vnni() { return VERISPEC_ISA_LEVEL >= 2; }

// The most threads one at::parallel_for region of this build ran on: torch's thread count when the file is compiled
// with OpenMP (-fopenmp; the runtime is torch's own), 1 when it is not, whatever torch's setting (its parallel
// regions would then run on the calling thread alone).
int64_t parallel_threads() {
  std::atomic<int64_t> most{0};
  at::parallel_for(0, 4096, 1, [&](int64_t, int64_t) {
    const int64_t mine = at::get_thread_num() + 1;
    int64_t seen = most.load();
    while (seen < mine && !most.compare_exchange_weak(seen, mine)) {
    }
  });
  return most.load();
}
