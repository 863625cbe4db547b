// Attention computed one query at a time, in an order that does not depend on the other queries of the call.
//
// Why: a fused attention kernel (torch's scaled_dot_product_attention) blocks its queries and keys by the shape of
// the call, so a token's attention output differs in the last bits depending on how many tokens share its forward
// (measured ~2e-6 on the 1.5B target). On the int4 path every linear is computed per token, so that difference is
// the only thing that makes a verify pass over a drafted block disagree with the one-token forwards of plain
// decoding, and the per-token int8 activation rounding amplifies it to whole logits. Here every (head, query) pair
// is computed on its own, over exactly the keys it sees, in position order, with the same instructions whether it
// is alone in the call or one of many: a block's outputs are bit-identical to one-token forwards'.
//
// q [1, heads, T, D], k and v [1, kv_heads, S, D] (any strides, the last dimension contiguous), float32. Query i
// sees the keys where mask[i] is true (mask [T, S] bool), or with no mask keys 0 .. S - T + i (causal after the
// cached S - T). Returns [1, T, heads, D] contiguous (the layout the output projection reads).
//
// The same passes' small per-token ops run here too (rotate_qk, rms_norm at the end of the file): in torch each is
// several calls that cost more in dispatch than in arithmetic on a decode pass's few rows.

#include "attention.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t LANES = 16;  // partial sums per dot product: one 512-bit vector of floats

// Sums the LANES partial sums pairwise (a short dependency chain instead of LANES adds in a row).
inline float reduce(float* partial) {
  for (int64_t width = LANES / 2; width >= 1; width /= 2)
    for (int64_t l = 0; l < width; ++l) partial[l] += partial[l + width];
  return partial[0];
}

constexpr int64_t MAX_GROUP = 8;  // query heads handled together (heads sharing a key-value head, up to this many)

// scores[h * n + t] = scale * <query h, key t> for the H query heads at queries (row stride q_stride) and the n keys
// at rows keys[0..n) of kh (row stride `stride`). Each key row is read once for all H heads (they share their keys),
// two keys at a time: 2 H independent chains of multiply-adds, held in registers since H is fixed at compile time.
// An odd last key runs the same code paired with itself, so every score comes from the same instructions.
template <int64_t H>
void dots(const float* __restrict queries, int64_t q_stride, const float* __restrict kh, int64_t stride,
          const int64_t* __restrict keys, int64_t n, int64_t D, float scale, float* __restrict scores) {
  for (int64_t t = 0; t < n; t += 2) {
    const bool pair = t + 1 < n;
    const float* r0 = kh + keys[t] * stride;
    const float* r1 = pair ? kh + keys[t + 1] * stride : r0;
    float p0[H][LANES] = {}, p1[H][LANES] = {};
    int64_t d = 0;
    for (; d + LANES <= D; d += LANES)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t l = 0; l < LANES; ++l) {
          const float x = queries[h * q_stride + d + l];
          p0[h][l] = std::fma(x, r0[d + l], p0[h][l]);
          p1[h][l] = std::fma(x, r1[d + l], p1[h][l]);
        }
    for (int64_t h = 0; h < H; ++h)  // a head size that is no multiple of LANES: the rest into the first lanes
      for (int64_t l = 0; d + l < D; ++l) {
        const float x = queries[h * q_stride + d + l];
        p0[h][l] = std::fma(x, r0[d + l], p0[h][l]);
        p1[h][l] = std::fma(x, r1[d + l], p1[h][l]);
      }
    for (int64_t h = 0; h < H; ++h) {
      scores[h * n + t] = reduce(p0[h]) * scale;
      if (pair) scores[h * n + t + 1] = reduce(p1[h]) * scale;
    }
  }
}

constexpr int64_t WIDTH = 32;  // output dimensions per head held in registers while the keys stream by

// out[h * D + d] = sum over t of p[h * n + t] * (value row keys[t])[d], keys in order, for H heads at once: each
// value row chunk is read once for the H heads.
template <int64_t H>
void weighted_sums(const float* __restrict p, int64_t n, const float* __restrict vh, int64_t stride,
                   const int64_t* __restrict keys, int64_t D, float* __restrict out) {
  int64_t d0 = 0;
  for (; d0 + WIDTH <= D; d0 += WIDTH) {
    float acc[H][WIDTH] = {};
    for (int64_t t = 0; t < n; ++t) {
      const float* row = vh + keys[t] * stride + d0;
      for (int64_t h = 0; h < H; ++h) {
        const float w = p[h * n + t];
        for (int64_t d = 0; d < WIDTH; ++d) acc[h][d] = std::fma(w, row[d], acc[h][d]);
      }
    }
    for (int64_t h = 0; h < H; ++h) std::copy(acc[h], acc[h] + WIDTH, out + h * D + d0);
  }
  if (d0 == D) return;
  const int64_t width = D - d0;  // a head size that is no multiple of WIDTH: the rest, the same sums in order
  float acc[H][WIDTH] = {};
  for (int64_t t = 0; t < n; ++t) {
    const float* row = vh + keys[t] * stride + d0;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < width; ++d) acc[h][d] = std::fma(p[h * n + t], row[d], acc[h][d]);
  }
  for (int64_t h = 0; h < H; ++h) std::copy(acc[h], acc[h] + width, out + h * D + d0);
}

// Calls body.template operator()<H>(first head, H) over the `count` heads in blocks of MAX_GROUP, then the rest as
// one block: the same block sizes for every call on one model, whatever its queries.
template <typename Body>
void head_blocks(int64_t count, const Body& body) {
  int64_t h = 0;
  for (; h + MAX_GROUP <= count; h += MAX_GROUP) body.template operator()<MAX_GROUP>(h);
  switch (count - h) {
    case 1: body.template operator()<1>(h); break;
    case 2: body.template operator()<2>(h); break;
    case 3: body.template operator()<3>(h); break;
    case 4: body.template operator()<4>(h); break;
    case 5: body.template operator()<5>(h); break;
    case 6: body.template operator()<6>(h); break;
    case 7: body.template operator()<7>(h); break;
    default: break;
  }
}

// The largest of s[0..n) and, after exp_shifted, their sum in a fixed order: LANES partial sums (or maxima) side by
// side, then pairwise (a long chain of dependent scalar adds cost as much as the dot products).
float maximum(const float* s, int64_t n) {
  float partial[LANES];
  std::fill(partial, partial + LANES, -INFINITY);
  int64_t t = 0;
  for (; t + LANES <= n; t += LANES)
    for (int64_t l = 0; l < LANES; ++l) partial[l] = partial[l] > s[t + l] ? partial[l] : s[t + l];
  float top = -INFINITY;
  for (int64_t l = 0; l < LANES; ++l) top = std::fmax(top, partial[l]);
  for (; t < n; ++t) top = std::fmax(top, s[t]);
  return top;
}

float sum(const float* s, int64_t n) {
  float partial[LANES] = {};
  int64_t t = 0;
  for (; t + LANES <= n; t += LANES)
    for (int64_t l = 0; l < LANES; ++l) partial[l] += s[t + l];
  float total = reduce(partial);
  for (; t < n; ++t) total += s[t];
  return total;
}

// s[j] = exp(s[j] - shift) for s[j] <= shift, as a branch-free loop the compiler vectorises (std::exp and
// std::floor keep it scalar): 2^k * e^r with x = k ln 2 + r, k rounded to nearest by adding and subtracting 1.5 * 2^23,
// and Cephes' degree-6 polynomial for e^r (relative error about 1e-7). The multiply-adds here and in the dot products
// are explicit fma calls (the build rounds every other product and sum as written, so that all instruction-set levels
// agree): one instruction where the CPU has FMA, and the same bits from the C library's fmaf where it has none.
void exp_shifted(float* __restrict s, int64_t n, float shift) {
  for (int64_t j = 0; j < n; ++j) {
    float x = s[j] - shift;
    x = x < -87.0f ? -87.0f : x;
    const float k = std::fma(x, 1.44269504088896341f, 12582912.f) - 12582912.f;
    float r = std::fma(k, -0.693359375f, x);
    r = std::fma(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = std::fma(p, r, 1.3981999507e-3f);
    p = std::fma(p, r, 8.3334519073e-3f);
    p = std::fma(p, r, 4.1665795894e-2f);
    p = std::fma(p, r, 1.6666665459e-1f);
    p = std::fma(p, r, 5.0000001201e-1f);
    const float e = std::fma(p * r, r, r) + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;  // 2^k as a float's bits
    s[j] = e * __builtin_bit_cast(float, bits);
  }
}

}  // namespace

// The checks the per-query entry points here and the decoder stack (decoder.cpp) share: a [T, S] bool mask, made
// contiguous (undefined when absent), and the rotary cos and sin tables [T, D] float32, contiguous.
at::Tensor checked_mask(const c10::optional<at::Tensor>& mask, int64_t T, int64_t S, const char* caller) {
  if (!mask.has_value()) return at::Tensor();
  at::Tensor m = mask->contiguous();
  TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(0) == T && m.size(1) == S, caller,
              ": mask must be [tokens, keys] bool (", T, " x ", S, ")");
  return m;
}

void check_rotary_table(const at::Tensor& cos, const at::Tensor& sin, int64_t T, int64_t D, const char* caller) {
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat && cos.numel() == T * D && sin.numel() == T * D,
              caller, ": cos and sin must be [tokens, dim] float32, contiguous");
}

// The attention core on raw pointers, for attend below and for verispec/native/decoder.cpp (declared in attention.h):
// query h of token i at qp + h * qs_head + i * qs_token, key (value) j of key-value head g at kp + g * ks_head +
// j * ks_row (vp, vs_head, vs_row); output row i, head h at op + (i * heads + h) * D. `visible` [T, S] or null
// (causal after the cached S - T).
void attend_rows(const float* qp, int64_t qs_head, int64_t qs_token, const float* kp, int64_t ks_head, int64_t ks_row,
                 const float* vp, int64_t vs_head, int64_t vs_row, const bool* visible, int64_t heads, int64_t kv_heads,
                 int64_t T, int64_t S, int64_t D, float scale, float* op) {
  const int64_t group = heads / kv_heads;
  // One work item per (key-value head, query): the group of query heads sharing that key-value head, so that each
  // key and value row is read once per item. Every head's arithmetic is the same whatever the call's other queries.
  at::parallel_for(0, kv_heads * T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * S), acc(group * D);
    std::vector<int64_t> keys(S);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t g = item / T, i = item % T;
      const float* queries = qp + g * group * qs_head + i * qs_token;
      const float* kh = kp + g * ks_head;
      const float* vh = vp + g * vs_head;
      int64_t n = 0;
      if (visible != nullptr) {
        for (int64_t j = 0; j < S; ++j)
          if (visible[i * S + j]) keys[n++] = j;
      } else {
        for (int64_t j = 0; j <= S - T + i; ++j) keys[n++] = j;
      }
      float* o = op + (i * heads + g * group) * D;  // the group's heads are adjacent in the output row
      if (n == 0) {
        std::fill(o, o + group * D, 0.f);
        continue;
      }
      head_blocks(group, [&]<int64_t H>(int64_t h) {
        dots<H>(queries + h * qs_head, qs_head, kh, ks_row, keys.data(), n, D, scale, scores.data() + h * n);
      });
      std::vector<float> total(group);
      for (int64_t h = 0; h < group; ++h) {
        float* s = scores.data() + h * n;
        exp_shifted(s, n, maximum(s, n));
        total[h] = sum(s, n);
      }
      head_blocks(group, [&]<int64_t H>(int64_t h) {
        weighted_sums<H>(scores.data() + h * n, n, vh, vs_row, keys.data(), D, acc.data() + h * D);
      });
      for (int64_t h = 0; h < group; ++h) {
        const float inverse = 1.f / total[h];
        for (int64_t d = 0; d < D; ++d) o[h * D + d] = acc[h * D + d] * inverse;
      }
    }
  });
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const c10::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attend: q, k, v must be [1, heads, tokens, dim]");
  TORCH_CHECK(q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1, "attend: batch size 1 only");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "attend: float32 only");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "attend: the last dimension must be contiguous");
  const int64_t heads = q.size(1), T = q.size(2), D = q.size(3), kv_heads = k.size(1), S = k.size(2);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "attend: heads must be a multiple of kv_heads");
  TORCH_CHECK(k.size(3) == D && v.size(3) == D && v.size(1) == kv_heads && v.size(2) == S, "attend: shape mismatch");
  TORCH_CHECK(S >= T, "attend: fewer keys than queries");
  const at::Tensor m = checked_mask(mask, T, S, "attend");
  const bool* visible = m.defined() ? m.data_ptr<bool>() : nullptr;
  auto out = at::empty({1, T, heads, D}, q.options());
  attend_rows(q.data_ptr<float>(), q.stride(1), q.stride(2), k.data_ptr<float>(), k.stride(1), k.stride(2),
              v.data_ptr<float>(), v.stride(1), v.stride(2), visible, heads, kv_heads, T, S, D,
              static_cast<float>(scale), out.data_ptr<float>());
  return out;
}

// Rotary position embedding of one layer's q and k in place, x <- x·cos + rotate_half(x)·sin with rotate_half(x) =
// (-x[D/2:], x[:D/2]) (transformers' apply_rotary_pos_emb). Why: in torch that is six elementwise calls per tensor
// per layer, each paying a dispatch larger than its arithmetic in a decode pass. Every product and sum is rounded as
// torch's separate calls round them (no fused multiply-add, hence the attribute), so the bits are the same.
// q [1, heads, T, D], k [1, kv_heads, T, D] (any strides, the last dimension contiguous); cos, sin [T, D] contiguous.
// One tensor's rotation: head h of token t at base + h * head_stride + t * token_stride; cos, sin [T, D].
__attribute__((optimize("fp-contract=off"))) void rotate_rows(float* base, int64_t heads, int64_t head_stride,
                                                              int64_t T, int64_t token_stride, int64_t D,
                                                              const float* cp, const float* sp) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = base + h * head_stride + t * token_stride;
      const float* c = cp + t * D;
      const float* s = sp + t * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = row[i], b = row[i + half];
        row[i] = a * c[i] - b * s[i];
        row[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

// q [1, heads, T, D], k [1, kv_heads, T, D] (any strides, the last dimension contiguous); cos, sin [T, D] contiguous.
void rotate_qk(at::Tensor q, at::Tensor k, const at::Tensor& cos, const at::Tensor& sin) {
  for (const at::Tensor* x : {&q, &k}) {
    TORCH_CHECK(x->dim() == 4 && x->size(0) == 1 && x->scalar_type() == at::kFloat && x->stride(3) == 1,
                "rotate_qk: q and k must be [1, heads, tokens, dim] float32 with the last dimension contiguous");
  }
  const int64_t T = q.size(2), D = q.size(3);
  TORCH_CHECK(D % 2 == 0 && k.size(2) == T && k.size(3) == D, "rotate_qk: q and k must share tokens and an even dim");
  check_rotary_table(cos, sin, T, D, "rotate_qk");
  for (at::Tensor* x : {&q, &k})
    rotate_rows(x->data_ptr<float>(), x->size(1), x->stride(1), T, x->stride(2), D, cos.data_ptr<float>(),
                sin.data_ptr<float>());
}

// RMSNorm of each row of x [rows, H] float32: x / sqrt(mean(x²) + eps) · weight, the sum of squares in float64 in
// index order. Why: torch's float32 rms_norm is a chain of seven small calls (pow, mean, add, rsqrt, mul, mul, a
// cast), about 12 µs per call on a decode pass's one row, 49 calls per forward of the draft. The result differs from
// torch's in the last bits (another summation order) but, like everything here, not with the call's other rows.
void rms_norm_rows(const float* xp, int64_t rows, int64_t H, const float* wp, double eps, float* op) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * H;
    double squares = 0.0;
    for (int64_t i = 0; i < H; ++i) squares += static_cast<double>(row[i]) * row[i];
    const float inverse = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(H) + eps));
    for (int64_t i = 0; i < H; ++i) op[r * H + i] = (row[i] * inverse) * wp[i];
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm: float32 only");
  const int64_t H = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == H, "rms_norm: weight must be [hidden]");
  auto input = x.contiguous();
  auto w = weight.contiguous();
  auto out = at::empty_like(input);
  const int64_t rows = H ? input.numel() / H : 0;
  rms_norm_rows(input.data_ptr<float>(), rows, H, w.data_ptr<float>(), eps, out.data_ptr<float>());
  return out;
}
