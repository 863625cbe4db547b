// The AMX paths of verispec/native/int4_linear.cpp's linears (included there, after the layout's constants): 8-bit
// passes of several tokens, and 4-bit passes of many, on the tile unit of Intel Xeons since Sapphire Rapids.
//
// Why: on the vector path every token costs one vpdpbusd per 16 rows x 4 inputs, so past about 5 tokens an 8-bit
// layer becomes compute-bound: a 9-token pass over the target's 151,936 x 1536 head (8-bit, a fifth of its weights)
// cost 1.6-2.5x a one-token pass. One tile instruction multiplies up to 16 tokens by 16 rows x 32 inputs, and the
// head's 9-token pass costs about 1.1-1.7x (benchmarks/kernel_revisions.py, over runs).
//
// Same bits: the tile unit sums xq * w over all inputs exactly in int32, the vector path (xq + 128) * w, from which
// 128 x the row's weight sum is taken off: the same integer, then the same float operations, so a token's outputs
// are bit-identical whichever path ran and whatever else is in its batch (tested).
//
// The 4-bit layers take the tiles only in passes of kAmx4MinTokens or more (amx_quad4: a batched server's passes,
// trees, catch-ups): their float scale and offset per group of 32 inputs must be applied to each group's sums, so
// every group's tile of sums goes out through memory, and the nibbles are unpacked into a tile's layout (once per
// group for up to two tiles of tokens). The default target's layers against the vector path
// (benchmarks/int4_tiles.py): 0.92-1.56x the time at 4-8 tokens, 0.85-0.98x at 10-12, 0.64-0.89x at 16-48.
//
// Tiles: tmm0 the tokens' int8 activations of one chunk of 32 inputs (rows = tokens, 32 bytes); tmm1 and tmm2 a
// block's weights of the chunk, which the packed layout already holds as a tile's 8 rows of 64 bytes (row p: inputs
// 4p..4p+3 of the 16 rows); tmm4..tmm7 the int32 sums of the quad's four blocks.
#pragma once

#if VERISPEC_ISA_LEVEL >= 3 && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define VERISPEC_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define VERISPEC_AMX 0
#endif

namespace {

constexpr int kAmxTokens = 16;    // rows of an activation tile

// Whether the OS lets this process use the tile registers (Linux asks each process to request them once).
bool amx_granted() {
#if VERISPEC_AMX
  static const bool granted = [] {
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

// Passes of at least this many tokens take the tile path. Measured in the default target's forwards
// (benchmarks/tile_passes.py, tiles against the vector path in one process): 0.94-0.97x the time at 5 tokens, a tie
// at 3, 0.93x at 9 and 0.87x at 13. (Layer by layer, streamed alone, 5 tokens came out anywhere from 0.96x to 1.15x
// over runs of benchmarks/kernel_revisions.py; the model's forward is what decoding runs.)
constexpr int64_t kAmxMinTokens = 5;

// set_amx() changes both, to measure the two paths against each other: off keeps the vector path at every size.
std::atomic<bool> amx_wanted{true};
std::atomic<int64_t> amx_threshold{kAmxMinTokens};

bool amx_for(int64_t T) {
  return T >= amx_threshold.load(std::memory_order_relaxed) && amx_wanted.load(std::memory_order_relaxed) &&
         amx_granted();
}

// The 4-bit layers' tile path: their per-group scale and offset leave the tiles through memory, so it pays only
// for passes of many tokens (a batched server's, several sequences' blocks in one pass). set_amx4() moves it.
constexpr int64_t kAmx4MinTokens = 10;
std::atomic<int64_t> amx4_threshold{kAmx4MinTokens};  // 0: off

bool amx4_for(int64_t T) {
  const int64_t least = amx4_threshold.load(std::memory_order_relaxed);
  return least > 0 && T >= least && amx_wanted.load(std::memory_order_relaxed) && amx_granted();
}

#if VERISPEC_AMX
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Configure the tiles for `tt` tokens (the calling thread's tile state; other code on this thread, oneDNN's AMX
// kernels among it, configures its own before use).
inline void configure_tiles(int tt) {
  TileConfig c;
  c.rows[0] = static_cast<uint8_t>(tt);
  c.colsb[0] = kGroup;
  for (int b = 1; b <= 2; ++b) {
    c.rows[b] = 8;
    c.colsb[b] = 64;
  }
  for (int r = 4; r < 8; ++r) {
    c.rows[r] = static_cast<uint8_t>(tt);
    c.colsb[r] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(c));  // not _tile_loadconfig: GCC 12 may drop the stores to `c` before it
}

// acc[r][t][16] = sum over inputs of xq * w (int32, exact) for the four blocks r of one quad of int8 weights and tt
// tokens t. The packed chunk of a block is already a tile's 8 rows of 64 bytes.
inline void amx_quad8(const uint8_t* quad, int64_t C, const int8_t* xq, int64_t K, int tt, int32_t* acc) {
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t c = 0; c < C; ++c) {
    const uint8_t* chunk = quad + c * kQuadChunk8;
    for (int b = 0; b < kQuad * kCell8; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(chunk + b + kPrefetch), _MM_HINT_T1);
    _tile_loadd(0, xq + c * kGroup, K);
    _tile_loadd(1, chunk, 64);
    _tile_dpbssd(4, 0, 1);
    _tile_loadd(2, chunk + kCell8, 64);
    _tile_dpbssd(5, 0, 2);
    _tile_loadd(1, chunk + 2 * kCell8, 64);
    _tile_dpbssd(6, 0, 1);
    _tile_loadd(2, chunk + 3 * kCell8, 64);
    _tile_dpbssd(7, 0, 2);
  }
  _tile_stored(4, acc, 64);
  _tile_stored(5, acc + tt * kRows, 64);
  _tile_stored(6, acc + 2 * tt * kRows, 64);
  _tile_stored(7, acc + 3 * tt * kRows, 64);
}

// The 4-bit path's tiles for tt0 + tt1 tokens (tt1 may be 0): tmm0 and tmm3 the two tiles of tokens' activations
// (one group of 32 inputs), tmm1 and tmm2 two blocks' unpacked weights, tmm4 and tmm5 the first tile's sums with
// them, tmm6 and tmm7 the second's.
inline void configure_tiles4(int tt0, int tt1) {
  TileConfig c;
  const int tiles[2] = {tt0, tt1};
  for (int i = 0; i < 2; ++i) {
    if (tiles[i] == 0) continue;  // left unconfigured, and unused
    c.rows[i == 0 ? 0 : 3] = static_cast<uint8_t>(tiles[i]);
    c.colsb[i == 0 ? 0 : 3] = kGroup;
    for (int r = 4 + 2 * i; r < 6 + 2 * i; ++r) {
      c.rows[r] = static_cast<uint8_t>(tiles[i]);
      c.colsb[r] = 64;
    }
  }
  for (int b = 1; b <= 2; ++b) {
    c.rows[b] = 8;
    c.colsb[b] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(c));
}

constexpr int kAmx4Tokens = 2 * kAmxTokens;  // tokens per unpacking of a quad's weights: two tiles

// acc[r][t][16] (float) for the four blocks r of one quad of 4-bit weights and tt = tt0 + tt1 tokens t (tiles as
// configure_tiles4 set them): per group, the exact int32 sums q . xq on tiles (the nibbles unpacked once for both
// tiles into a tile's layout: row p of a block's tile holds inputs 4p..4p+3 of its 16 rows, the low nibbles of the
// layout's vector p for p < 4, the high ones of vector p - 4), then acc = fma(dot, scale, acc), acc = fma(offset,
// xsum, acc): the vector path's integers and float operations in its order, so the same bits.
inline void amx_quad4(const uint8_t* quad, int64_t G, const int8_t* xq, int64_t K, const float* xsum, int tt0,
                      int tt1, float* acc) {
  alignas(64) uint8_t w[kQuad][8 * 64];
  alignas(64) int32_t dots[kQuad][kAmx4Tokens * kRows];
  const int tt = tt0 + tt1;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int i = 0; i < kQuad * tt; ++i) _mm512_storeu_ps(acc + i * kRows, _mm512_setzero_ps());
  for (int64_t g = 0; g < G; ++g) {
    for (int c = 0; c < kQuad * kCell; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(at_group(quad, g, 0) + c + kPrefetch), _MM_HINT_T1);
    for (int r = 0; r < kQuad; ++r) {
      const uint8_t* cell = at_group(quad, g, r);
      for (int p = 0; p < 4; ++p) {
        const __m512i v = _mm512_loadu_si512(cell + 64 * p);
        _mm512_store_si512(w[r] + 64 * p, _mm512_and_si512(v, low));
        _mm512_store_si512(w[r] + 64 * (p + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
      }
    }
    _tile_loadd(0, xq + g * kGroup, K);
    if (tt1) _tile_loadd(3, xq + kAmxTokens * K + g * kGroup, K);
    for (int r = 0; r < kQuad; r += 2) {
      _tile_loadd(1, w[r], 64);
      _tile_loadd(2, w[r + 1], 64);
      _tile_zero(4);
      _tile_zero(5);
      _tile_dpbsud(4, 0, 1);
      _tile_dpbsud(5, 0, 2);
      _tile_stored(4, dots[r], 64);
      _tile_stored(5, dots[r + 1], 64);
      if (tt1) {
        _tile_zero(6);
        _tile_zero(7);
        _tile_dpbsud(6, 3, 1);
        _tile_dpbsud(7, 3, 2);
        _tile_stored(6, dots[r] + tt0 * kRows, 64);
        _tile_stored(7, dots[r + 1] + tt0 * kRows, 64);
      }
    }
    for (int r = 0; r < kQuad; ++r) {
      const uint8_t* cell = at_group(quad, g, r);
      const __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 256)));
      const __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 288)));
      for (int t = 0; t < tt; ++t) {
        float* out = acc + (r * tt + t) * kRows;
        __m512 x = _mm512_loadu_ps(out);
        x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots[r] + t * kRows)), a, x);
        x = _mm512_fmadd_ps(b, _mm512_set1_ps(xsum[t * G + g]), x);
        _mm512_storeu_ps(out, x);
      }
    }
  }
}
#endif

// The tile paths' traversal: quads split over the threads, up to kSuper tokens passing each quad while its weights
// stay in cache, `tokens` tokens per run (16: one tile; 32: the 4-bit path's two). run(nq, t0, tt, acc) fills
// acc[r][t][16] for the quad's four blocks and tokens t0..t0+tt, configure(tt) sets the tiles for tt tokens (when
// they change); store(n0, t, a) writes token t's outputs n0..n0+15 from a.
template <typename Acc, typename Configure, typename Run, typename Store>
void over_amx_tiles(int64_t NQ, int64_t T, int tokens, const Configure& configure, const Run& run,
                    const Store& store) {
#if VERISPEC_AMX
  at::parallel_for(0, NQ, 1, [&](int64_t q0, int64_t q1) {
    alignas(64) Acc acc[kQuad * kAmx4Tokens * kRows];
    int configured = 0;
    for (int64_t s0 = 0; s0 < T; s0 += kSuper) {
      const int64_t s1 = std::min(T, s0 + kSuper);
      for (int64_t nq = q0; nq < q1; ++nq) {
        for (int64_t t0 = s0; t0 < s1; t0 += tokens) {
          const int tt = static_cast<int>(std::min<int64_t>(tokens, s1 - t0));
          if (tt != configured) configure(configured = tt);
          run(nq, t0, tt, acc);
          for (int r = 0; r < kQuad; ++r)
            for (int t = 0; t < tt; ++t) store((nq * kQuad + r) * kRows, t0 + t, acc + (r * tt + t) * kRows);
        }
      }
    }
    _tile_release();
  });
#else
  (void)NQ, (void)T, (void)tokens, (void)configure, (void)run, (void)store;
#endif
}

}  // namespace

// Whether the 8-bit path runs passes of amx_min_tokens() or more on AMX tiles: built with them, granted by the OS,
// and not turned off.
bool amx() { return amx_wanted.load() && amx_granted(); }
int64_t amx_min_tokens() { return amx_threshold.load(); }
int64_t amx4_min_tokens() { return amx() && amx4_threshold.load() > 0 ? amx4_threshold.load() : 0; }

// Passes of `min_tokens` or more of the 4-bit layers on tiles (0: the default; -1: never); the same bits either way.
void set_amx4(int64_t min_tokens) {
  TORCH_CHECK(min_tokens >= -1, "min_tokens must be >= -1 (-1: off, 0: the default, ", kAmx4MinTokens, "), got ",
              min_tokens);
  amx4_threshold.store(min_tokens == 0 ? kAmx4MinTokens : std::max<int64_t>(min_tokens, 0));
}

// Turn the tile path on or off for this module, from passes of `min_tokens` (0: the default); both paths give the
// same bits, so this only serves to measure them.
void set_amx(bool on, int64_t min_tokens) {
  TORCH_CHECK(min_tokens >= 0, "min_tokens must be >= 0 (0: the default, ", kAmxMinTokens, "), got ", min_tokens);
  amx_threshold.store(min_tokens == 0 ? kAmxMinTokens : std::max<int64_t>(min_tokens, 1));
  amx_wanted.store(on);
}
