// The AVX-512 VNNI path of verispec/native/int4_linear.cpp (included there at the avx512-vnni level, after the
// layout's constants): 16 output rows x 4 inputs per vpdpbusd, a 64-byte vector of the layout at a time.
#pragma once

namespace {

// Token row `row` [K] into int8 `out` and per-group sums `sums`; returns max |x| (see quantize_rows).
inline float quantize_row(const float* row, int64_t K, int8_t* out, float* sums) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
  const float peak = std::fmax(_mm512_reduce_max_ps(m), 1e-30f);  // an all-zero row stays zero
  const __m512 inv = _mm512_set1_ps(127.0f / peak);
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + g * kGroup), inv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + g * kGroup + 16), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g * kGroup), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g * kGroup + 16), _mm512_cvtsepi32_epi8(q1));
    sums[g] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
  return peak;
}

// acc[r][t][16] for RB blocks r of one quad (from `quad`, already offset to the first) and TT tokens t: the sum over
// groups of scale * (q . xq) + offset * xsum. RB * TT independent accumulator chains hide vpdpbusd's latency; the
// weights are unpacked once per group and block and serve all TT tokens.
template <int RB, int TT>
inline void tile(const uint8_t* quad, int64_t G, const int8_t* xq, int64_t K, const float* xsum, float* acc_out) {
  __m512 acc[RB][TT];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    // Ask for the weights 16 KiB ahead into L2: the hardware prefetcher alone kept a one-token pass at about 16 GB/s
    // (fbgemm's int8 kernel streams at 19-25 here); with this, 19 GB/s. Into L1 (T0) it slowed 5-token passes.
    for (int c = 0; c < RB * kCell; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(at_group(quad, g, 0) + c + kPrefetch), _MM_HINT_T1);
    __m512i dot[RB][TT];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TT; ++t) dot[r][t] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      for (int r = 0; r < RB; ++r) {
        const __m512i v = _mm512_loadu_si512(at_group(quad, g, r) + 64 * p);
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int t = 0; t < TT; ++t) {
          const int8_t* xr = xq + t * K + g * kGroup;
          dot[r][t] = _mm512_dpbusd_epi32(dot[r][t], lo, _mm512_set1_epi32(load32(xr + 4 * p)));
          dot[r][t] = _mm512_dpbusd_epi32(dot[r][t], hi, _mm512_set1_epi32(load32(xr + 4 * (p + 4))));
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      const uint8_t* cell = at_group(quad, g, r);
      const __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 256)));
      const __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 288)));
      for (int t = 0; t < TT; ++t) {
        // exact: |dot| <= 32 * 15 * 127
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][t]), a, acc[r][t]);
        acc[r][t] = _mm512_fmadd_ps(b, _mm512_set1_ps(xsum[t * G + g]), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TT; ++t) _mm512_storeu_ps(acc_out + (r * TT + t) * kRows, acc[r][t]);
}

// acc[r][t][16] (int32) for RB blocks r of one quad of int8 weights and TT tokens t: sum over inputs of
// (xq + 128) * w, exact (|sum| < 255 * 127 * K). With one token each sum runs in 4 interleaved accumulators (inputs
// 4p.. into p mod 4; 2 with two tokens): one chain per block read a 1536 x 8960 layer at 13 GB/s, four at 17 (the
// integer sums are exact, so the split changes no bit). More tokens have chains enough, and no registers to spare.
template <int RB, int TT>
inline void tile8(const uint8_t* quad, int64_t C, const int8_t* xq, int64_t K, int32_t* acc_out) {
  constexpr int A = TT == 1 ? 4 : (TT == 2 ? 2 : 1);
  __m512i acc[A][RB][TT];
  for (int a = 0; a < A; ++a)
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TT; ++t) acc[a][r][t] = _mm512_setzero_si512();
  for (int64_t c = 0; c < C; ++c) {
    const uint8_t* chunk = quad + c * kQuadChunk8;
    for (int b = 0; b < RB * kCell8; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(chunk + b + kPrefetch), _MM_HINT_T1);
    for (int p = 0; p < 8; ++p) {
      for (int r = 0; r < RB; ++r) {
        const __m512i v = _mm512_loadu_si512(chunk + r * kCell8 + 64 * p);
        for (int t = 0; t < TT; ++t) {
          const int32_t xu = load32(xq + t * K + c * kGroup + 4 * p) ^ static_cast<int32_t>(0x80808080u);
          acc[p % A][r][t] = _mm512_dpbusd_epi32(acc[p % A][r][t], _mm512_set1_epi32(xu), v);
        }
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TT; ++t) {
      __m512i sum = acc[0][r][t];
      for (int a = 1; a < A; ++a) sum = _mm512_add_epi32(sum, acc[a][r][t]);
      _mm512_storeu_si512(reinterpret_cast<__m512i*>(acc_out + (r * TT + t) * kRows), sum);
    }
}

constexpr int32_t kShift8 = 128;  // tile8 sums (xq + 128) * w: 128 x the row's weight sum comes off after

// Per token count 1..8: the tile, and how many of a quad's blocks it takes at once (more where few tokens would
// leave vpdpbusd's latency exposed).
constexpr TileFn kTiles[kTile + 1] = {nullptr, tile<4, 1>, tile<4, 2>, tile<2, 3>, tile<2, 4>, tile<2, 5>,
                                     tile<2, 6>, tile<1, 7>, tile<1, 8>};
constexpr Tile8Fn kTiles8[kTile + 1] = {nullptr, tile8<4, 1>, tile8<4, 2>, tile8<2, 3>, tile8<2, 4>, tile8<2, 5>,
                                        tile8<2, 6>, tile8<1, 7>, tile8<1, 8>};
constexpr int kTileBlocks[kTile + 1] = {0, 4, 4, 2, 2, 2, 2, 1, 1};

}  // namespace
