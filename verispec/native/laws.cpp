// Vocabulary-wide steps of the verification laws, each fused into a few passes over one row: GBV's order and q_skew
// at a node (docs/algorithms.md §2.2-2.3) and BV's leftover mass (§1.2). The torch code beside each call
// (verispec/verify/gbv.py, block.py) is the reference; tests hold the two equal.
//
// Why: on a 151,936-token vocabulary GBV's law made about 18 full-vocabulary tensor passes per node of the path
// (order, prefix sums, q_skew, normalisation), each a separate allocation and loop; here a node is five passes (the
// maximum, the prefix sums and their shift, q_skew with its sum, the normalisation) and sorts of the ranked tokens
// only (per chunk, then merged). Everything is float64; the passes run over fixed chunks of the vocabulary
// on torch's threads, so the results do not depend on how many threads ran them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
// torch's pybind11 casters only, not <torch/extension.h> (the C++ frontend too): a third of the compile time.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

// The 512-bit code runs at the avx512-vnni level only (VERISPEC_ISA_LEVEL 3, set by verispec/native/cpu.py): an
// AVX-512 host's lower levels define __AVX512F__ too, and must compile what a CPU without AVX-512 runs.
#if defined(VERISPEC_ISA_LEVEL) && VERISPEC_ISA_LEVEL >= 3
#include <immintrin.h>
#define VERISPEC_AVX512 1
#else
#define VERISPEC_AVX512 0
#endif

namespace {

constexpr double kMinDraftProb = 1e-300;  // verispec.verify.common.MIN_DRAFT_PROB

void check_row(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be one row [V]");
  TORCH_CHECK(t.scalar_type() == at::kDouble, name, " must be float64");
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
}

// The bits of a non-negative double read as int64 order like the double (gbv.py `key_bits`); +0.0 folds -0.0.
inline int64_t ratio_bits(double p, double q) {
  double key = p / std::max(q, kMinDraftProb);
  key = std::max(key, 0.0) + 0.0;
  int64_t bits;
  std::memcpy(&bits, &key, sizeof bits);
  return bits;
}

constexpr int kLanes = 8;  // independent accumulators: a float add waits ~4 cycles for the one before it

double max_of(const double* x, int64_t n) {
  double lane[kLanes] = {0.0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], x[i + j]);
  for (; i < n; ++i) lane[0] = std::max(lane[0], x[i]);
  return *std::max_element(lane, lane + kLanes);
}

double sum_of(const double* x, int64_t n) {
  double lane[kLanes] = {0.0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += x[i + j];
  for (; i < n; ++i) lane[0] += x[i];
  double total = 0.0;
  for (double v : lane) total += v;
  return total;
}

// The vocabulary cut into kChunks contiguous chunks, the same for any thread count: the chunks' partial sums are
// combined in chunk order, so every result is the same whether one thread or several ran the chunks.
constexpr int64_t kChunks = 8;

struct Chunk {
  int64_t begin, end;
};

inline Chunk chunk_of(int64_t j, int64_t n) {
  const int64_t size = (n + kChunks - 1) / kChunks;
  return {std::min(n, j * size), std::min(n, (j + 1) * size)};
}

// Run body(j) for every chunk j, the chunks spread over torch's threads (at::parallel_for: OpenMP in this build).
template <typename Body>
void for_each_chunk(Body body) {
  at::parallel_for(0, kChunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) body(j);
  });
}

// Tokens begin..end of one chunk: below[t] = the q of the unranked tokens (q < threshold) before t in the chunk, for
// every t (a ranked token's entry is overwritten later); the ranked tokens go to `ranked` as (key bits, id), in id
// order. Returns the chunk's unranked mass. A running sum token by token is one chain of dependent adds (an add's
// latency per token); here each 8 tokens are summed as a tree (pairs, fours, eights: one vector in AVX-512) and only
// their total joins the chain. The portable code does the same additions in the same order: the same bits.
double unranked_prefix(const double* q, const double* p, int64_t begin, int64_t end, double threshold, double* below,
                       std::vector<std::pair<int64_t, int64_t>>& ranked) {
  double carry = 0.0;
  int64_t t = begin;
#if VERISPEC_AVX512
  const __m512d limit = _mm512_set1_pd(threshold);
  const __m512d zero = _mm512_setzero_pd();
  const __m512i lane7 = _mm512_set1_epi64(7);
  __m512d carried = zero;  // carry in every lane
  for (; t + 8 <= end; t += 8) {
    const __m512d v = _mm512_loadu_pd(q + t);
    const __mmask8 unranked = _mm512_cmp_pd_mask(v, limit, _CMP_LT_OQ);
    // inclusive sums: lane i += lane i-1, then i-2, then i-4 (zeros shifted in)
    __m512d incl = _mm512_maskz_mov_pd(unranked, v);
    incl = _mm512_add_pd(incl, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(incl),
                                                                          _mm512_castpd_si512(zero), 7)));
    incl = _mm512_add_pd(incl, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(incl),
                                                                          _mm512_castpd_si512(zero), 6)));
    incl = _mm512_add_pd(incl, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(incl),
                                                                          _mm512_castpd_si512(zero), 4)));
    // exclusive: lane i gets lane i-1's inclusive sum (lane 0 gets 0), plus the carry
    const __m512d before = _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(incl),
                                                                     _mm512_castpd_si512(zero), 7));
    _mm512_storeu_pd(below + t, _mm512_add_pd(carried, before));
    carried = _mm512_add_pd(carried, _mm512_permutexvar_pd(lane7, incl));
    if (unranked != 0xFF)
      for (int i = 0; i < 8; ++i)
        if (!((unranked >> i) & 1)) ranked.emplace_back(ratio_bits(p[t + i], q[t + i]), t + i);
  }
  carry = _mm512_cvtsd_f64(carried);
#else
  for (; t + 8 <= end; t += 8) {
    double x[8], s[8], u[8];
    bool any_ranked = false;
    for (int i = 0; i < 8; ++i) {
      const bool unranked = q[t + i] < threshold;
      x[i] = unranked ? q[t + i] : 0.0;
      any_ranked |= !unranked;
    }
    s[0] = x[0];  // lane i += lane i-1, then i-2, then i-4, as the vector code adds
    for (int i = 1; i < 8; ++i) s[i] = x[i] + x[i - 1];
    u[0] = s[0];
    u[1] = s[1];
    for (int i = 2; i < 8; ++i) u[i] = s[i] + s[i - 2];
    for (int i = 4; i < 8; ++i) s[i] = u[i] + u[i - 4];
    for (int i = 0; i < 4; ++i) s[i] = u[i];
    below[t] = carry + 0.0;
    for (int i = 1; i < 8; ++i) below[t + i] = carry + s[i - 1];
    carry += s[7];
    if (any_ranked)
      for (int i = 0; i < 8; ++i)
        if (!(q[t + i] < threshold)) ranked.emplace_back(ratio_bits(p[t + i], q[t + i]), t + i);
  }
#endif
  for (; t < end; ++t) {
    below[t] = carry;
    if (q[t] < threshold) {
      carry += q[t];
    } else {
      ranked.emplace_back(ratio_bits(p[t], q[t]), t);
    }
  }
  return carry;
}

// skew[t] = q(t)·Σ_{j<K} a^j b^(K−1−j) (unnormalised q_skew, §2.3) with a, b the best-of-K CDF bounds of token t
// divided by (A + x) ("Stable evaluation"), by S_1 = 1, S_{m+1} = a·S_m + b^m. K_FIXED = 0: K is `k`.
template <int K_FIXED>
void skew_weights(const double* q, const double* below, int64_t n, double x_scaled, double a_scaled, int64_t k,
                  double* skew) {
  const int64_t paths = K_FIXED ? K_FIXED : k;
  for (int64_t t = 0; t < n; ++t) {
    const double b_raw = below[t] * x_scaled + a_scaled;
    const double a = std::clamp(b_raw + q[t] * x_scaled, 0.0, 1.0);
    const double b = std::clamp(b_raw, 0.0, 1.0);
    double powers = a + b;
    double b_power = b;
    for (int64_t m = 2; m < paths; ++m) {
      b_power *= b;
      powers = b_power + powers * a;
    }
    skew[t] = powers * q[t];
  }
}

}  // namespace

// One node u of GBV's selected path: the order of §2.2 and q_skew(·|u) of §2.3, written to `out` [V].
// Returns (below at `tokens`, threshold, key at `tokens`): below[t] is the q-mass ranked strictly below t (the
// unranked tokens first, by id; then the ranked ones by (p/q, id)); t is ranked when q(t|u) >= threshold =
// min(min_q, min_share·max q). The key orders `tokens` as the order does, with (key, id): the ratio's bits where t is
// ranked, -1 where it is not (so a caller selects among them without reading the rows again).
std::tuple<at::Tensor, double, at::Tensor> skewed_draft_row(at::Tensor p, at::Tensor q, double min_q, double min_share,
                                                   double mass_a, double mass_x, int64_t k, at::Tensor out,
                                                   at::Tensor tokens) {
  check_row(p, "p");
  check_row(q, "q");
  check_row(out, "out");
  TORCH_CHECK(p.numel() == q.numel() && out.numel() == q.numel(), "p, q and out must have one vocabulary");
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == at::kLong, "tokens must be [n] int64");
  TORCH_CHECK(k >= 1, "k must be >= 1");
  p = p.contiguous();
  q = q.contiguous();
  const int64_t vocab = q.numel();
  const double* pp = p.data_ptr<double>();
  const double* qq = q.data_ptr<double>();
  thread_local std::vector<double> scratch;  // reused: a fresh [V] buffer per node costs its page faults
  scratch.resize(vocab);
  double* below = scratch.data();
  std::array<double, kChunks> part{};  // one partial result per chunk

  for_each_chunk([&](int64_t j) {
    const Chunk c = chunk_of(j, vocab);
    part[j] = max_of(qq + c.begin, c.end - c.begin);
  });
  const double threshold = std::min(min_q, min_share * *std::max_element(part.begin(), part.end()));

  // The unranked tokens below every ranked one, by id: each chunk's running sum of their q, shifted by the chunks
  // before it. Then the ranked ones by their keys. Each chunk lists its ranked tokens and sorts them.
  std::array<std::vector<std::pair<int64_t, int64_t>>, kChunks> ranked_in;  // (key bits, id)
  for_each_chunk([&](int64_t j) {
    const Chunk c = chunk_of(j, vocab);
    part[j] = unranked_prefix(qq, pp, c.begin, c.end, threshold, below, ranked_in[j]);
    std::sort(ranked_in[j].begin(), ranked_in[j].end());  // ascending key, ties by id: one total order (§2.2)
  });
  std::array<double, kChunks> offset{};
  double unranked = 0.0;
  for (int64_t j = 0; j < kChunks; ++j) {
    offset[j] = unranked;
    unranked += part[j];
  }
  for_each_chunk([&](int64_t j) {
    const Chunk c = chunk_of(j, vocab);
    if (j > 0)
      for (int64_t t = c.begin; t < c.end; ++t) below[t] += offset[j];
  });
  // The chunks' sorted runs merged pairwise: the order of one sort of them all, at less cost.
  std::vector<std::pair<int64_t, int64_t>> ranked;
  std::array<size_t, kChunks + 1> run{};
  for (int64_t j = 0; j < kChunks; ++j) {
    ranked.insert(ranked.end(), ranked_in[j].begin(), ranked_in[j].end());
    run[j + 1] = ranked.size();
  }
  for (int64_t width = 1; width < kChunks; width *= 2)
    for (int64_t j = 0; j + width < kChunks; j += 2 * width)
      std::inplace_merge(ranked.begin() + run[j], ranked.begin() + run[j + width],
                         ranked.begin() + run[std::min(j + 2 * width, kChunks)]);
  double mass = unranked;
  for (const auto& entry : ranked) {
    below[entry.second] = mass;
    mass += qq[entry.second];
  }
  auto below_at = at::empty({tokens.numel()}, q.options());
  auto key_at = at::empty({tokens.numel()}, tokens.options());
  const int64_t* ids = tokens.contiguous().data_ptr<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    const int64_t t = ids[i];
    TORCH_CHECK(t >= 0 && t < vocab, "token ", t, " is outside the vocabulary");
    below_at.data_ptr<double>()[i] = below[t];
    key_at.data_ptr<int64_t>()[i] = qq[t] < threshold ? -1 : ratio_bits(pp[t], qq[t]);
  }

  double* skew = out.data_ptr<double>();
  if (k == 1) {  // §2.6: one path, q_skew = q
    std::memcpy(skew, qq, vocab * sizeof(double));
    return {below_at, threshold, key_at};
  }
  const double scale = std::max(mass_a + mass_x, kMinDraftProb);
  const double x_scaled = mass_x / scale;
  const double a_scaled = mass_a / scale;
  for_each_chunk([&](int64_t j) {
    const Chunk c = chunk_of(j, vocab);
    const int64_t n = c.end - c.begin;
    const double *qc = qq + c.begin, *bc = below + c.begin;
    double* sc = skew + c.begin;
    switch (k) {  // the common path counts as compile-time constants, so the loop vectorises
      case 2: skew_weights<2>(qc, bc, n, x_scaled, a_scaled, k, sc); break;
      case 3: skew_weights<3>(qc, bc, n, x_scaled, a_scaled, k, sc); break;
      case 4: skew_weights<4>(qc, bc, n, x_scaled, a_scaled, k, sc); break;
      default: skew_weights<0>(qc, bc, n, x_scaled, a_scaled, k, sc);
    }
    part[j] = sum_of(sc, n);
  });
  double total = 0.0;
  for (double v : part) total += v;
  if (total > 0.0) {
    for_each_chunk([&](int64_t j) {
      const Chunk c = chunk_of(j, vocab);
      for (int64_t t = c.begin; t < c.end; ++t) skew[t] /= total;
    });
  } else {  // underflow only
    std::memcpy(skew, qq, vocab * sizeof(double));
  }
  return {below_at, threshold, key_at};
}

// ρ_r = Σ_v (w_r·p[r, v] − q[r, v])_+ for each row r: the target mass left over at a node of BV (§1.2).
at::Tensor positive_mass(at::Tensor weights, at::Tensor p, at::Tensor q) {
  TORCH_CHECK(p.dim() == 2 && q.dim() == 2 && p.sizes() == q.sizes(), "p and q must be [rows, V] of one shape");
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == p.size(0), "weights must be [rows]");
  TORCH_CHECK(p.scalar_type() == at::kDouble && q.scalar_type() == at::kDouble &&
                  weights.scalar_type() == at::kDouble,
              "p, q and weights must be float64");
  p = p.contiguous();
  q = q.contiguous();
  weights = weights.contiguous();
  const int64_t rows = p.size(0), vocab = p.size(1);
  std::vector<double> part(rows * kChunks, 0.0);  // (row, chunk) partial sums, combined in chunk order
  at::parallel_for(0, rows * kChunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / kChunks;
      const Chunk c = chunk_of(i % kChunks, vocab);
      const double* pr = p.data_ptr<double>() + r * vocab;
      const double* qr = q.data_ptr<double>() + r * vocab;
      const double w = weights.data_ptr<double>()[r];
      double lane[kLanes] = {0.0};
      int64_t v = c.begin;
      for (; v + kLanes <= c.end; v += kLanes)
        for (int j = 0; j < kLanes; ++j) lane[j] += std::max(w * pr[v + j] - qr[v + j], 0.0);
      for (; v < c.end; ++v) lane[0] += std::max(w * pr[v] - qr[v], 0.0);
      double sum = 0.0;
      for (double x : lane) sum += x;
      part[i] = sum;
    }
  });
  auto out = at::empty({rows}, p.options());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < kChunks; ++j) sum += part[r * kChunks + j];
    out.data_ptr<double>()[r] = sum;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skewed_draft_row", &skewed_draft_row, "GBV's order and q_skew at one node (docs/algorithms.md §2.2-2.3)");
  m.def("positive_mass", &positive_mass, "BV's leftover target mass per row (docs/algorithms.md §1.2)");
}
