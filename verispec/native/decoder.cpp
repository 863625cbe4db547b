// A model's whole stack of decoder layers in one call, for the decode and verify passes that attend one query at a
// time (verispec/models/decoder_stack.py builds it once per model and the decoder loop calls it once per forward).
//
// Why: a one-token forward of the 0.5B draft made about 40 small Python and torch calls per layer around its four
// linears (views, casts, splits, residual adds, cache writes, the activation): about a third of its time, and a
// fifth of the target's. Here a layer is those same steps on raw buffers: RMSNorm, the q/k/v projections, the rotary
// embedding, the write of the new keys and values into the cache, attention, the output projection and residual, the
// second norm, gate and up, SiLU(gate) * up, the down projection and residual. Every step is the code the decoder
// loop's per-step calls run (the extension links this file with the two kernels' own translation units,
// attention.cpp and int4_linear.cpp, declared in their headers), SiLU and its product run through ATen as the loop
// runs them, and the residual adds round as torch's do, so the hidden states are bit-identical to the loop's
// (tested); each token's outputs therefore stay independent of the call's other tokens.
//
// A projection is a list of parts, each a 4-bit (packed uint8) or 8-bit (packed int8, per-row scale and weight sums)
// linear, whose outputs lie side by side in the projection's output row (q, k and v; gate and up).
// torch's pybind11 casters only (at::Tensor, optional, containers), not <torch/extension.h>: a third of the
// compile time.
#include <torch/csrc/utils/pybind.h>

#include <ATen/ops/silu.h>

#include "attention.h"
#include "int4_linear.h"

#include <cstring>
#include <tuple>
#include <vector>

namespace {

// (packed, scale, rowsum, bias) as the Python side hands them over; scale and rowsum are empty for 4-bit parts.
using PartSpec = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// (input norm weight, its eps, q/k/v parts, output parts, post-attention norm weight, its eps, gate/up parts, down).
using LayerSpec = std::tuple<at::Tensor, double, std::vector<PartSpec>, std::vector<PartSpec>, at::Tensor, double,
                             std::vector<PartSpec>, std::vector<PartSpec>>;

// One sequence of a batched pass: its cache (keys, values per layer), first new position, token count, mask.
using SegmentSpec = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, int64_t, int64_t,
                               c10::optional<at::Tensor>>;

struct Part {
  bool four_bit;
  at::Tensor packed, scale, rowsum, bias;
  int64_t outputs, inputs;
};

struct Projection {
  std::vector<Part> parts;
  int64_t inputs = 0, outputs = 0;

  // y [T, outputs] from x [T, inputs]: each part into its columns.
  void run(const float* x, int64_t T, float* y) const {
    int64_t column = 0;
    for (const Part& p : parts) {
      const float* bias = p.bias.numel() > 0 ? p.bias.data_ptr<float>() : nullptr;
      if (p.four_bit)
        linear_rows(x, T, inputs, p.packed.data_ptr<uint8_t>(), p.packed.size(0), bias, y + column, outputs);
      else
        linear8_rows(x, T, inputs, reinterpret_cast<const uint8_t*>(p.packed.data_ptr<int8_t>()), p.packed.size(0),
                     p.scale.data_ptr<float>(), p.rowsum.data_ptr<int32_t>(), bias, y + column, outputs);
      column += p.outputs;
    }
  }
};

Projection make_projection(const std::vector<PartSpec>& specs, int64_t inputs, int64_t outputs, const char* name) {
  TORCH_CHECK(!specs.empty(), "decoder stack: projection ", name, " has no parts");
  Projection projection;
  projection.inputs = inputs;
  for (const auto& [packed, scale, rowsum, bias] : specs) {
    Part p{packed.scalar_type() == at::kByte, packed, scale, rowsum, bias, 0, 0};
    if (p.four_bit)
      check_packed4(packed);
    else
      check_packed8(packed, scale, rowsum);
    p.outputs = packed.size(0) * kQuad * kRows;
    p.inputs = packed.size(1) * kGroup;
    TORCH_CHECK(p.inputs == inputs, "decoder stack: projection ", name, " reads ", p.inputs, " inputs, expected ",
                inputs);
    TORCH_CHECK(bias.numel() == 0 || (bias.numel() == p.outputs && bias.scalar_type() == at::kFloat &&
                                      bias.is_contiguous()),
                "decoder stack: projection ", name, ": bias must be empty or [outputs] float32");
    projection.outputs += p.outputs;
    projection.parts.push_back(std::move(p));
  }
  TORCH_CHECK(projection.outputs == outputs, "decoder stack: projection ", name, " gives ", projection.outputs,
              " outputs, expected ", outputs);
  return projection;
}

struct Layer {
  at::Tensor norm1, norm2;
  double eps1, eps2;
  Projection qkv, o, gate_up, down;
};

at::Tensor checked_norm(const at::Tensor& w, int64_t hidden) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == hidden && w.scalar_type() == at::kFloat,
              "decoder stack: norm weights must be [hidden] float32");
  return w.contiguous();
}

void add_rows(float* __restrict x, const float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];  // one rounding per element, as torch's add
}

}  // namespace

class DecoderStack {
 public:
  DecoderStack(const std::vector<LayerSpec>& layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
               int64_t intermediate, double scale)
      : hidden_(hidden), heads_(heads), kv_heads_(kv_heads), dim_(head_dim), intermediate_(intermediate),
        scale_(static_cast<float>(scale)) {
    TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "decoder stack: heads must be a multiple of kv_heads");
    TORCH_CHECK(head_dim % 2 == 0, "decoder stack: the head dimension must be even (rotary embedding)");
    const int64_t qkv = (heads + 2 * kv_heads) * head_dim;
    for (const auto& [n1, e1, qkv_parts, o_parts, n2, e2, gu_parts, down_parts] : layers) {
      layers_.push_back(Layer{checked_norm(n1, hidden), checked_norm(n2, hidden), e1, e2,
                              make_projection(qkv_parts, hidden, qkv, "q/k/v"),
                              make_projection(o_parts, heads * head_dim, hidden, "output"),
                              make_projection(gu_parts, hidden, 2 * intermediate, "gate/up"),
                              make_projection(down_parts, intermediate, hidden, "down")});
    }
  }

  int64_t size() const { return static_cast<int64_t>(layers_.size()); }

  // x [T, hidden] float32: the embedded new tokens; keys[l], values[l] [1, kv_heads, room, head_dim] float32
  // contiguous with room >= start + T: layer l's cache, the first `start` positions filled (the new ones are written
  // at start .. start + T); cos, sin [T, head_dim]; mask [T, start + T] bool or none (causal after the cache).
  // Returns the hidden states [T, hidden] after the last layer (before the final norm).
  at::Tensor forward(const at::Tensor& x, const std::vector<at::Tensor>& keys,
                        const std::vector<at::Tensor>& values, int64_t start, const at::Tensor& cos,
                        const at::Tensor& sin, const c10::optional<at::Tensor>& mask) const {
    TORCH_CHECK(x.dim() == 2, "decoder stack: x must be [tokens, hidden] float32");
    return run({SegmentSpec{keys, values, start, x.size(0), mask}}, x, cos, sin);
  }

  // Several sequences in one pass (a server's batch): x [N, hidden] holds each sequence's new tokens in turn, with
  // `segments` saying, in that order, each one's cache (keys, values per layer), first new position, token count and
  // mask; cos, sin [N, head_dim]. Every linear runs once over all N rows and attention runs per sequence over its
  // own cache; each row is computed as in a pass of its sequence alone, so the outputs are bit-identical to it.
  at::Tensor forward_batch(const at::Tensor& x, const std::vector<SegmentSpec>& segments,
                              const at::Tensor& cos, const at::Tensor& sin) const {
    return run(segments, x, cos, sin);
  }

 private:
  struct Segment {
    const std::vector<at::Tensor>* keys;
    const std::vector<at::Tensor>* values;
    int64_t start, T, row;
    at::Tensor mask;  // [T, start + T] bool, or undefined (causal after the cache)
  };

  at::Tensor run(const std::vector<SegmentSpec>& specs, const at::Tensor& x, const at::Tensor& cos,
                    const at::Tensor& sin) const {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == hidden_ && x.scalar_type() == at::kFloat,
                "decoder stack: x must be [tokens, hidden] float32");
    const int64_t T = x.size(0), D = dim_;
    std::vector<Segment> segments;
    int64_t row = 0;
    for (const auto& [keys, values, start, tokens, mask] : specs) {
      TORCH_CHECK(start >= 0 && tokens >= 0, "decoder stack: start and token counts must be >= 0");
      const int64_t S = start + tokens;
      TORCH_CHECK(static_cast<int64_t>(keys.size()) == size() && static_cast<int64_t>(values.size()) == size(),
                  "decoder stack: one key and one value buffer per layer");
      for (const auto* store : {&keys, &values})
        for (const at::Tensor& b : *store)
          TORCH_CHECK(b.dim() == 4 && b.size(0) == 1 && b.size(1) == kv_heads_ && b.size(2) >= S && b.size(3) == D &&
                          b.scalar_type() == at::kFloat && b.is_contiguous(),
                      "decoder stack: cache buffers must be [1, kv_heads, >= start + tokens, head_dim] float32 "
                      "contiguous");
      segments.push_back(Segment{&keys, &values, start, tokens, row, checked_mask(mask, tokens, S, "decoder stack")});
      row += tokens;
    }
    TORCH_CHECK(row == T, "decoder stack: the segments hold ", row, " tokens, x has ", T);
    check_rotary_table(cos, sin, T, D, "decoder stack");
    const auto options = x.options();
    at::Tensor state = x.contiguous().clone();
    if (T == 0) return state;
    const int64_t H = hidden_, I = intermediate_, Q = heads_ * D, KV = kv_heads_ * D, N = Q + 2 * KV;
    at::Tensor h = at::empty({T, H}, options), qkv = at::empty({T, N}, options);
    at::Tensor att = at::empty({T, Q}, options), out = at::empty({T, H}, options);
    at::Tensor gate_up = at::empty({T, 2 * I}, options);
    const at::Tensor gate = gate_up.narrow(1, 0, I), up = gate_up.narrow(1, I, I);
    float* xs = state.data_ptr<float>();
    float* hs = h.data_ptr<float>();
    float* qs = qkv.data_ptr<float>();
    float* os = out.data_ptr<float>();
    float* as = att.data_ptr<float>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    for (int64_t l = 0; l < size(); ++l) {
      const Layer& layer = layers_[l];
      rms_norm_rows(xs, T, H, layer.norm1.data_ptr<float>(), layer.eps1, hs);
      layer.qkv.run(hs, T, qs);
      rotate_rows(qs, heads_, D, T, N, D, cp, sp);          // q: head h of token t at t * N + h * D
      rotate_rows(qs + Q, kv_heads_, D, T, N, D, cp, sp);   // k
      for (const Segment& s : segments) {
        if (s.T == 0) continue;
        const at::Tensor& kt = (*s.keys)[l];
        const at::Tensor& vt = (*s.values)[l];
        const int64_t room = kt.size(2);
        float* kb = kt.data_ptr<float>();
        float* vb = vt.data_ptr<float>();
        const float* rows = qs + s.row * N;
        for (int64_t g = 0; g < kv_heads_; ++g)
          for (int64_t t = 0; t < s.T; ++t) {
            std::memcpy(kb + (g * room + s.start + t) * D, rows + t * N + Q + g * D, D * sizeof(float));
            std::memcpy(vb + (g * room + s.start + t) * D, rows + t * N + Q + KV + g * D, D * sizeof(float));
          }
        const bool* visible = s.mask.defined() ? s.mask.data_ptr<bool>() : nullptr;
        attend_rows(rows, D, N, kb, room * D, D, vb, room * D, D, visible, heads_, kv_heads_, s.T, s.start + s.T, D,
                    scale_, as + s.row * Q);
      }
      layer.o.run(as, T, os);
      add_rows(xs, os, T * H);
      rms_norm_rows(xs, T, H, layer.norm2.data_ptr<float>(), layer.eps2, hs);
      layer.gate_up.run(hs, T, gate_up.data_ptr<float>());
      at::Tensor act = at::silu(gate);  // through ATen: the bits of the decoder loop's F.silu(gate) * up
      act.mul_(up);
      layer.down.run(act.data_ptr<float>(), T, os);
      add_rows(xs, os, T * H);
    }
    return state;
  }

  std::vector<Layer> layers_;
  int64_t hidden_, heads_, kv_heads_, dim_, intermediate_;
  float scale_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: each instruction-set level's build of this file registers its own class (tests load several)
  py::class_<DecoderStack>(m, "DecoderStack", py::module_local())
      .def(py::init<const std::vector<LayerSpec>&, int64_t, int64_t, int64_t, int64_t, int64_t, double>(),
           py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("intermediate"), py::arg("scale"))
      .def("__len__", &DecoderStack::size)
      .def("forward", &DecoderStack::forward, "run every layer over the new tokens, writing their keys and values",
           py::arg("x"), py::arg("keys"), py::arg("values"), py::arg("start"), py::arg("cos"), py::arg("sin"),
           py::arg("mask") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("forward_batch", &DecoderStack::forward_batch,
           "run every layer over several sequences' new tokens at once, each attending to its own cache",
           py::arg("x"), py::arg("segments"), py::arg("cos"), py::arg("sin"), py::call_guard<py::gil_scoped_release>());
  m.def("amx", &amx, "whether 8-bit passes of several tokens run on AMX tiles");
  m.def("amx_min_tokens", &amx_min_tokens, "the fewest tokens a pass on AMX tiles takes");
  m.def("set_amx", &set_amx, "turn the AMX tile path on or off", py::arg("on"), py::arg("min_tokens") = 0);
  m.def("amx4_min_tokens", &amx4_min_tokens, "the fewest tokens a 4-bit pass on AMX tiles takes (0: none does)");
  m.def("set_amx4", &set_amx4, "move or stop the 4-bit layers' AMX tile path", py::arg("min_tokens") = 0);
}
