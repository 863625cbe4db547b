// The 4-bit kernel's weight layout (described in int4_linear.cpp) built from levels, scales and offsets in one pass,
// quads split over the threads: what verispec/models/int4.py's `pack` computes, without the several passes of
// whole-tensor byte permutes it took in torch (2.3 s of the default target's 10 s load).
#include "int4_linear.h"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

void pack4_into(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& offset, at::Tensor& out) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte && q.is_contiguous(), "q: contiguous [N, K] uint8");
  const int64_t N = q.size(0), K = q.size(1), G = K / kGroup, NQ = N / (kQuad * kRows);
  TORCH_CHECK(N % (kQuad * kRows) == 0 && K % kGroup == 0, "q: N a multiple of 64 and K of 32, got ", N, " x ", K);
  for (const at::Tensor* t : {&scale, &offset})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == N &&
                    t->size(1) == G, "scale and offset: contiguous [N, K/32] float32");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kByte && out.numel() == NQ * G * kQuad * kCell,
              "out: contiguous [N/64, K/32, 4, 320] uint8");
  const uint8_t* qs = q.data_ptr<uint8_t>();
  const float* sc = scale.data_ptr<float>();
  const float* of = offset.data_ptr<float>();
  uint8_t* pk = out.data_ptr<uint8_t>();
  at::parallel_for(0, NQ, 1, [&](int64_t q0, int64_t q1) {
    for (int64_t nq = q0; nq < q1; ++nq)
      for (int64_t g = 0; g < G; ++g)
        for (int r = 0; r < kQuad; ++r) {
          uint8_t* cell = pk + ((nq * G + g) * kQuad + r) * kCell;
          const int64_t row0 = (nq * kQuad + r) * kRows;
          for (int j = 0; j < kRows; ++j) {
            const uint8_t* levels = qs + (row0 + j) * K + g * kGroup;
            for (int p = 0; p < 4; ++p)  // byte (p, j, b): input 4p + b in the low nibble, 4(p + 4) + b in the high
              for (int b = 0; b < 4; ++b)
                cell[64 * p + 4 * j + b] = static_cast<uint8_t>(levels[4 * p + b] | (levels[4 * (p + 4) + b] << 4));
            // float16 rounded to nearest even, as torch's float -> half
            const c10::Half s(sc[(row0 + j) * G + g]), o(of[(row0 + j) * G + g]);
            std::memcpy(cell + 256 + 2 * j, &s, 2);
            std::memcpy(cell + 288 + 2 * j, &o, 2);
          }
        }
  });
}

// The 8-bit layout of a 4-bit layer's weights (what `Int8RowLinear(Int4Linear.dequantized())` computes in torch, in
// one pass over the packed weights and no float copy: 12 s of float temporaries for the default target otherwise).
// Each weight is dequantized as torch does it (level * scale, then + offset, each rounded: the build's
// -ffp-contract=off), a row's scale is max |w| / 127 (1 for an all-zero row), and each weight is rounded to the
// nearest int8 level, ties to even as torch.round, clamped to +-127.
void pack8_from4(const at::Tensor& packed4, at::Tensor& out, at::Tensor& scale, at::Tensor& rowsum) {
  check_packed4(packed4);
  const int64_t NQ = packed4.size(0), G = packed4.size(1), N = NQ * kQuad * kRows;
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kChar && out.numel() == NQ * G * kQuad * kCell8,
              "out: contiguous [N/64, K/32, 4, 512] int8");
  TORCH_CHECK(scale.is_contiguous() && scale.scalar_type() == at::kFloat && scale.numel() == N,
              "scale: contiguous [N] float32");
  TORCH_CHECK(rowsum.is_contiguous() && rowsum.scalar_type() == at::kInt && rowsum.numel() == N,
              "rowsum: contiguous [N] int32");
  const uint8_t* pk = packed4.data_ptr<uint8_t>();
  int8_t* o8 = out.data_ptr<int8_t>();
  float* sc = scale.data_ptr<float>();
  int32_t* rs = rowsum.data_ptr<int32_t>();
  // Row j's 32 weights of a cell: input 4p + b in the low nibble of byte (p, j, b), 4(p + 4) + b in the high.
  const auto weights = [](const uint8_t* cell, int j, float* w) {
    c10::Half s, o;
    std::memcpy(&s, cell + 256 + 2 * j, 2);
    std::memcpy(&o, cell + 288 + 2 * j, 2);
    const float scale = static_cast<float>(s), offset = static_cast<float>(o);
    for (int k = 0; k < kGroup; ++k) {
      const int p = k / 4, b = k % 4;
      const uint8_t byte = cell[64 * (p % 4) + 4 * j + b];
      const float product = static_cast<float>(p < 4 ? (byte & 0x0F) : (byte >> 4)) * scale;
      w[k] = product + offset;
    }
  };
  at::parallel_for(0, NQ, 1, [&](int64_t q0, int64_t q1) {
    for (int64_t nq = q0; nq < q1; ++nq)
      for (int r = 0; r < kQuad; ++r) {
        float top[kRows] = {};
        for (int64_t g = 0; g < G; ++g) {
          const uint8_t* cell = pk + ((nq * G + g) * kQuad + r) * kCell;
          for (int j = 0; j < kRows; ++j) {
            float w[kGroup];
            weights(cell, j, w);
            for (int k = 0; k < kGroup; ++k) top[j] = std::max(top[j], std::fabs(w[k]));
          }
        }
        float step[kRows];
        int32_t sums[kRows] = {};
        for (int j = 0; j < kRows; ++j) {
          step[j] = top[j] / 127.0f;
          if (!(step[j] > 0.0f)) step[j] = 1.0f;
        }
        for (int64_t g = 0; g < G; ++g) {
          const uint8_t* cell = pk + ((nq * G + g) * kQuad + r) * kCell;
          int8_t* dst = o8 + ((nq * G + g) * kQuad + r) * kCell8;
          for (int j = 0; j < kRows; ++j) {
            float w[kGroup];
            weights(cell, j, w);
            for (int k = 0; k < kGroup; ++k) {
              const int8_t q = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(w[k] / step[j]))));
              dst[64 * (k / 4) + 4 * j + k % 4] = q;
              sums[j] += q;
            }
          }
        }
        for (int j = 0; j < kRows; ++j) {
          const int64_t row = (nq * kQuad + r) * kRows + j;
          sc[row] = step[j];
          rs[row] = sums[j];
        }
      }
  });
}
