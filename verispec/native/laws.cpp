// Vocabulary-wide steps of the verification laws, each fused into a few passes over one row: GBV's order and q_skew
// at a node (docs/algorithms.md §2.2-2.3) and BV's leftover mass (§1.2). The torch code beside each call
// (verispec/verify/gbv.py, block.py) is the reference; tests hold the two equal.
//
// Why: on a 151,936-token vocabulary GBV's law made about 18 full-vocabulary tensor passes per node of the path
// (order, prefix sums, q_skew, normalisation), each a separate allocation and loop; here a node is three passes
// and one sort of the ranked tokens only. Everything is float64 and single-threaded, like the engine's verify step.
#include <torch/extension.h>

#include <algorithm>
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

// below[t] = Σ_{s<t, q_s < threshold} q_s for the unranked tokens (q_t < threshold); the ranked tokens' entries are
// left for the caller. Returns the unranked mass. The vocabulary is cut into kLanes chunks whose running sums
// advance side by side (a prefix sum is one long chain of dependent adds otherwise), then each chunk is shifted
// by the mass of the chunks before it.
double unranked_prefix(const double* q, int64_t n, double threshold, double* below) {
  const int64_t chunk = (n + kLanes - 1) / kLanes;
  double lane[kLanes] = {0.0};
  const int64_t whole = n / chunk;  // chunks with `chunk` entries (the last one may be shorter)
  for (int64_t i = 0; i < chunk; ++i) {
    for (int j = 0; j < whole; ++j) {  // branch-free: a ranked token adds 0 and its entry is overwritten later
      const int64_t t = j * chunk + i;
      const double mass = q[t] < threshold ? q[t] : 0.0;
      below[t] = lane[j];
      lane[j] += mass;
    }
  }
  for (int64_t t = whole * chunk; t < n; ++t) {
    const double mass = q[t] < threshold ? q[t] : 0.0;
    below[t] = lane[whole];
    lane[whole] += mass;
  }
  double offset = lane[0];
  for (int j = 1; j < kLanes; ++j) {
    const int64_t end = std::min(n, (j + 1) * chunk);
    for (int64_t t = j * chunk; t < end; ++t) below[t] += offset;  // ranked entries are overwritten later
    offset += lane[j];
  }
  return offset;
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
// Returns (below at `tokens`, threshold): below[t] is the q-mass ranked strictly below t (the unranked tokens first,
// by id; then the ranked ones by (p/q, id)); t is ranked when q(t|u) >= threshold = min(min_q, min_share·max q).
std::tuple<torch::Tensor, double> skewed_draft_row(torch::Tensor p, torch::Tensor q, double min_q, double min_share,
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

  const double threshold = std::min(min_q, min_share * max_of(qq, vocab));

  // The unranked tokens below every ranked one, by id; then the ranked ones by their keys.
  const double unranked = unranked_prefix(qq, vocab, threshold, below);
  std::vector<std::pair<int64_t, int64_t>> ranked;  // (key bits, id)
  for (int64_t t = 0; t < vocab; ++t)
    if (qq[t] >= threshold) ranked.emplace_back(ratio_bits(pp[t], qq[t]), t);
  std::sort(ranked.begin(), ranked.end());  // ascending key, ties by id: one total order (§2.2)
  double mass = unranked;
  for (const auto& entry : ranked) {
    below[entry.second] = mass;
    mass += qq[entry.second];
  }
  auto below_at = torch::empty({tokens.numel()}, q.options());
  const int64_t* ids = tokens.contiguous().data_ptr<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < vocab, "token ", ids[i], " is outside the vocabulary");
    below_at.data_ptr<double>()[i] = below[ids[i]];
  }

  double* skew = out.data_ptr<double>();
  if (k == 1) {  // §2.6: one path, q_skew = q
    std::memcpy(skew, qq, vocab * sizeof(double));
    return {below_at, threshold};
  }
  const double scale = std::max(mass_a + mass_x, kMinDraftProb);
  const double x_scaled = mass_x / scale;
  const double a_scaled = mass_a / scale;
  switch (k) {  // the common path counts as compile-time constants, so the loop vectorises
    case 2: skew_weights<2>(qq, below, vocab, x_scaled, a_scaled, k, skew); break;
    case 3: skew_weights<3>(qq, below, vocab, x_scaled, a_scaled, k, skew); break;
    case 4: skew_weights<4>(qq, below, vocab, x_scaled, a_scaled, k, skew); break;
    default: skew_weights<0>(qq, below, vocab, x_scaled, a_scaled, k, skew);
  }
  const double total = sum_of(skew, vocab);
  if (total > 0.0) {
    for (int64_t t = 0; t < vocab; ++t) skew[t] /= total;
  } else {  // underflow only
    std::memcpy(skew, qq, vocab * sizeof(double));
  }
  return {below_at, threshold};
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
  auto out = torch::empty({rows}, p.options());
  for (int64_t r = 0; r < rows; ++r) {
    const double* pr = p.data_ptr<double>() + r * vocab;
    const double* qr = q.data_ptr<double>() + r * vocab;
    const double w = weights.data_ptr<double>()[r];
    double lane[kLanes] = {0.0};
    int64_t v = 0;
    for (; v + kLanes <= vocab; v += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += std::max(w * pr[v + j] - qr[v + j], 0.0);
    for (; v < vocab; ++v) lane[0] += std::max(w * pr[v] - qr[v], 0.0);
    double sum = 0.0;
    for (double x : lane) sum += x;
    out.data_ptr<double>()[r] = sum;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skewed_draft_row", &skewed_draft_row, "GBV's order and q_skew at one node (docs/algorithms.md §2.2-2.3)");
  m.def("positive_mass", &positive_mass, "BV's leftover target mass per row (docs/algorithms.md §1.2)");
}
