// The 256-bit path of verispec/native/int4_linear.cpp (included there at the avx2 and avx-vnni levels, after the
// layout's constants), for CPUs without AVX-512: the same packed weights, the same integers, the same bits.
//
// Layout: a 64-byte vector of a 16-row block holds rows 0-7 in its first 32 bytes and rows 8-15 in its last (byte
// 4j + b for row j), and each 32-byte field of float16 scales or offsets the rows 0-7 in its first 16 bytes; so a
// 256-bit vector covers a half block of 8 rows, and a tile runs the halves one after the other.
//
// Products: on AVX-VNNI, 256-bit vpdpbusd as the 512-bit path; on AVX2, vpmaddubsw (pairs of u8 x s8 products in
// int16) then vpmaddwd with ones (the pairs of a row into its int32 lane). Both give each row's exact integer sum.
//
// Tiles: a pass over a quad reads its 4 blocks group by group, one sequential stream, for every token count (16 ymm
// registers hold no accumulators for 4 blocks x 8 tokens, so the float sums live in the tile's output buffer in L1
// and are loaded and stored once per group; the integer work per group is 16-20 instructions per half block and
// token against those 2 memory operations). Within a half block, a token's sums over one group (4-bit) or chunk of
// 32 inputs (8-bit) stay in a register.
//
// Measured (benchmarks/isa_levels.py, one thread of an AVX-512 Xeon, the default target's shapes): streamed from
// memory, 4-bit passes of 1-8 tokens take 0.85-1.1x the 512-bit path's time on either 256-bit level; from cache,
// 1.1-1.3x at one token and 1.4-2.3x at 4-8 (half the vector width). Tried and dropped: two vpdpbusd chains per
// token (1-2% faster), and int16 vpmaddwd products instead of the sign trick on AVX2's 8-bit path (1.1x slower).
#pragma once

namespace {

constexpr int kHalf = kRows / 2;  // rows per 256-bit vector of int32 / float32

inline __m256i broadcast4(const int8_t* x) { return _mm256_set1_epi32(load32(x)); }

// `v` as it is, through an empty asm the compiler cannot see into. Why: g++ reassociates a chain of wrapping integer
// adds into a tree, which keeps every product of a group live at once: more than 16 registers from 3 tokens on (the
// 8-token tile spilled 110 vectors). A chain keeps one sum per token.
inline __m256i chained(__m256i v) {
  asm("" : "+x"(v));
  return v;
}

#if VERISPEC_ISA_LEVEL == 2
// u8 x s8 products summed 4 to a 32-bit lane: AVX-VNNI's VEX form where the CPU has it, else (an AVX-512 host
// testing this level) the EVEX form of the same instruction on the same 256-bit vectors.
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_dpbusd_epi32(acc, u, s);
#endif
}

// One token's sum over a group of 32 inputs for 8 rows: 4-bit weights (u8, 0..15) times int8 activations.
struct Dot4 {
  __m256i sum = _mm256_setzero_si256();
  void add(__m256i w, __m256i x) { sum = dpbusd(sum, w, x); }
  __m256i total() const { return sum; }
};

// One token's sum over a chunk of 32 inputs for 8 rows of int8 weights: (xq + 128) * w, as the 512-bit path.
struct Dot8 {
  __m256i sum = _mm256_setzero_si256();
  static __m256i prepare(__m256i w) { return w; }
  static __m256i activations(__m256i x) { return _mm256_xor_si256(x, _mm256_set1_epi8(-128)); }  // xq + 128, u8
  void add(__m256i prepared, __m256i, __m256i x) { sum = dpbusd(sum, x, prepared); }
};
constexpr int32_t kShift8 = 128;  // 128 x the row's weight sum comes off after
#else
struct Dot4 {
  // Each int16 lane of vpmaddubsw is 2 products, |.| <= 2 * 15 * 127 = 3810; a group's 8 of them (4 vectors, low
  // and high nibbles) summed in int16: |.| <= 8 * 3810 = 30480 < 32767, exact, then one vpmaddwd per group.
  __m256i sum = _mm256_setzero_si256();
  void add(__m256i w, __m256i x) { sum = chained(_mm256_add_epi16(sum, _mm256_maddubs_epi16(w, x))); }
  __m256i total() const { return _mm256_madd_epi16(sum, _mm256_set1_epi16(1)); }
};

struct Dot8 {
  // xq * w directly: (xq + 128) * w would saturate vpmaddubsw (2 * 255 * 127 > 32767). |w| (u8, up to 128) times
  // xq * sign(w) (s8, |xq| <= 127) is w * xq; a lane's pair |.| <= 2 * 128 * 127 = 32512 < 32767, exact, and
  // vpmaddwd with ones takes each pair to int32 before the next is added.
  __m256i sum = _mm256_setzero_si256();
  static __m256i prepare(__m256i w) { return _mm256_abs_epi8(w); }
  static __m256i activations(__m256i x) { return x; }
  void add(__m256i prepared, __m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(prepared, _mm256_sign_epi8(x, w));
    sum = chained(_mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))));
  }
};
constexpr int32_t kShift8 = 0;  // the sums are xq * w already
#endif

// Token row `row` [K] into int8 `out` and per-group sums `sums`; returns max |x| (see quantize_rows).
inline float quantize_row(const float* row, int64_t K, int8_t* out, float* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(row + k)));
  __m128 top = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  top = _mm_max_ps(top, _mm_movehl_ps(top, top));
  top = _mm_max_ss(top, _mm_movehdup_ps(top));
  const float peak = std::fmax(_mm_cvtss_f32(top), 1e-30f);  // an all-zero row stays zero
  const __m256 inv = _mm256_set1_ps(127.0f / peak);
  // vpackssdw and vpacksswb interleave their inputs per 128-bit lane: this puts the 32 bytes back in input order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + g * kGroup + 8 * i), inv));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + g * kGroup), _mm256_permutevar8x32_epi32(bytes, order));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    sums[g] = static_cast<float>(_mm_cvtsi128_si32(h));
  }
  return peak;
}

inline void prefetch(const uint8_t* from, int bytes) {
  for (int c = 0; c < bytes; c += 64) _mm_prefetch(reinterpret_cast<const char*>(from + c + kPrefetch), _MM_HINT_T1);
}

// acc[r][t][16] for RB blocks r of one quad and TT tokens t, as the 512-bit tile: the sum over groups of
// scale * (q . xq) + offset * xsum, each (row, token) in the same fma order.
template <int RB, int TT>
inline void tile(const uint8_t* quad, int64_t G, const int8_t* xq, int64_t K, const float* xsum, float* acc) {
  std::fill(acc, acc + RB * TT * kRows, 0.0f);
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    prefetch(at_group(quad, g, 0), RB * kCell);
    for (int r = 0; r < RB; ++r) {
      const uint8_t* cell = at_group(quad, g, r);
      for (int h = 0; h < 2; ++h) {
        Dot4 dot[TT];
        for (int p = 0; p < 4; ++p) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 64 * p + 32 * h));
          const __m256i lo = _mm256_and_si256(v, low);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          for (int t = 0; t < TT; ++t) {
            const int8_t* xr = xq + t * K + g * kGroup;
            dot[t].add(lo, broadcast4(xr + 4 * p));
            dot[t].add(hi, broadcast4(xr + 4 * (p + 4)));
          }
        }
        const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cell + 256 + 16 * h)));
        const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cell + 288 + 16 * h)));
        for (int t = 0; t < TT; ++t) {
          float* out = acc + (r * TT + t) * kRows + kHalf * h;
          // exact: |dot| <= 32 * 15 * 127
          __m256 s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t].total()), a, _mm256_loadu_ps(out));
          s = _mm256_fmadd_ps(b, _mm256_set1_ps(xsum[t * G + g]), s);
          _mm256_storeu_ps(out, s);
        }
      }
    }
  }
}

// acc[r][t][16] (int32) for RB blocks r of one quad of int8 weights and TT tokens t: each row's exact sum over the
// inputs (of (xq + 128) * w or xq * w: kShift8 says which).
template <int RB, int TT>
inline void tile8(const uint8_t* quad, int64_t C, const int8_t* xq, int64_t K, int32_t* acc) {
  std::fill(acc, acc + RB * TT * kRows, 0);
  for (int64_t c = 0; c < C; ++c) {
    const uint8_t* chunk = quad + c * kQuadChunk8;
    prefetch(chunk, RB * kCell8);
    // The chunk's activations as the products take them, so that each broadcast is one load. The halves read them
    // through `xs`, which the compiler cannot see is xc: else it keeps all 8 x TT broadcasts of the chunk live across
    // the halves, more than the 16 registers (the 8-token tile spilled 60 vectors).
    alignas(32) int8_t xc[TT][kGroup];
    for (int t = 0; t < TT; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * K + c * kGroup));
      _mm256_store_si256(reinterpret_cast<__m256i*>(xc[t]), Dot8::activations(x));
    }
    for (int r = 0; r < RB; ++r)
      for (int h = 0; h < 2; ++h) {
        const int8_t* xs = xc[0];
        asm("" : "+r"(xs));
        Dot8 dot[TT];
        for (int p = 0; p < 8; ++p) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + r * kCell8 + 64 * p + 32 * h));
          const __m256i prepared = Dot8::prepare(w);
          for (int t = 0; t < TT; ++t) dot[t].add(prepared, w, broadcast4(xs + t * kGroup + 4 * p));
        }
        for (int t = 0; t < TT; ++t) {
          __m256i* out = reinterpret_cast<__m256i*>(acc + (r * TT + t) * kRows + kHalf * h);
          _mm256_storeu_si256(out, _mm256_add_epi32(_mm256_loadu_si256(out), dot[t].sum));
        }
      }
  }
}

// Every token count reads the whole quad in one pass (see Tiles above).
constexpr TileFn kTiles[kTile + 1] = {nullptr, tile<4, 1>, tile<4, 2>, tile<4, 3>, tile<4, 4>, tile<4, 5>,
                                     tile<4, 6>, tile<4, 7>, tile<4, 8>};
constexpr Tile8Fn kTiles8[kTile + 1] = {nullptr, tile8<4, 1>, tile8<4, 2>, tile8<4, 3>, tile8<4, 4>, tile8<4, 5>,
                                        tile8<4, 6>, tile8<4, 7>, tile8<4, 8>};
constexpr int kTileBlocks[kTile + 1] = {0, 4, 4, 4, 4, 4, 4, 4, 4};

}  // namespace
