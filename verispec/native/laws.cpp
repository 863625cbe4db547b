// Vocabulary-wide steps of the verification laws, each fused into a few passes over one row: GBV's order and q_skew
// at a node (docs/algorithms.md §2.2-2.3) and BV's leftover mass (§1.2). The torch code beside each call
// (verispec/verify/gbv.py, block.py) is the reference; tests hold the two equal.
//
// Why: on a 151,936-token vocabulary GBV's law made about 18 full-vocabulary tensor passes per node of the path
// (order, prefix sums, q_skew, normalisation), each a separate allocation and loop; here a node is five passes (the
// maximum, the prefix sums and their shift, q_skew with its sum, the normalisation) and one sort of the ranked
// tokens only. Everything is float64; the passes run over fixed chunks of the vocabulary
// on torch's threads, so the results do not depend on how many threads ran them.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

namespace {

constexpr double kMinDraftProb = 1e-300;  // verispec.verify.common.MIN_DRAFT_PROB

void check_row(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be one row [V]");
  TORCH_CHECK(t.scalar_type() == torch::kFloat64, name, " must be float64");
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
std::tuple<torch::Tensor, double, torch::Tensor> skewed_draft_row(torch::Tensor p, torch::Tensor q, double min_q, double min_share,
                                                   double mass_a, double mass_x, int64_t k, torch::Tensor out,
                                                   torch::Tensor tokens) {
  check_row(p, "p");
  check_row(q, "q");
  check_row(out, "out");
  TORCH_CHECK(p.numel() == q.numel() && out.numel() == q.numel(), "p, q and out must have one vocabulary");
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == torch::kLong, "tokens must be [n] int64");
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

  // The unranked tokens below every ranked one, by id: each chunk's running sum of their q (a prefix sum is one
  // chain of dependent adds, so the chunks run side by side), shifted by the chunks before it. Then the ranked
  // ones by their keys. Each chunk also lists its ranked tokens, in id order.
  std::array<std::vector<std::pair<int64_t, int64_t>>, kChunks> ranked_in;  // (key bits, id)
  for_each_chunk([&](int64_t j) {
    const Chunk c = chunk_of(j, vocab);
    double mass = 0.0;
    for (int64_t t = c.begin; t < c.end; ++t) {
      below[t] = mass;  // a ranked token's entry is overwritten below
      if (qq[t] < threshold) {
        mass += qq[t];
      } else {
        ranked_in[j].emplace_back(ratio_bits(pp[t], qq[t]), t);
      }
    }
    part[j] = mass;
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
  std::vector<std::pair<int64_t, int64_t>> ranked;
  for (const auto& chunk : ranked_in) ranked.insert(ranked.end(), chunk.begin(), chunk.end());
  std::sort(ranked.begin(), ranked.end());  // ascending key, ties by id: one total order (§2.2)
  double mass = unranked;
  for (const auto& entry : ranked) {
    below[entry.second] = mass;
    mass += qq[entry.second];
  }
  auto below_at = torch::empty({tokens.numel()}, q.options());
  auto key_at = torch::empty({tokens.numel()}, tokens.options());
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
torch::Tensor positive_mass(torch::Tensor weights, torch::Tensor p, torch::Tensor q) {
  TORCH_CHECK(p.dim() == 2 && q.dim() == 2 && p.sizes() == q.sizes(), "p and q must be [rows, V] of one shape");
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == p.size(0), "weights must be [rows]");
  TORCH_CHECK(p.scalar_type() == torch::kFloat64 && q.scalar_type() == torch::kFloat64 &&
                  weights.scalar_type() == torch::kFloat64,
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
  auto out = torch::empty({rows}, p.options());
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
