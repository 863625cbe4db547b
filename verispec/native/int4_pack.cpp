// The 4-bit kernel's weight layout (described in int4_linear.cpp) built from levels, scales and offsets in one pass,
// quads split over the threads: what verispec/models/int4.py's `pack` computes, without the several passes of
// whole-tensor byte permutes it took in torch (2.3 s of the default target's 10 s load).
#include "int4_linear.h"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

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
