// The int4 extension's Python functions (verispec/models/int4.py builds this with int4_linear.cpp
// and int4_pack.cpp).
// torch's pybind11 casters only (at::Tensor, optional, containers), not <torch/extension.h>: a third of the
// compile time.
#include <torch/csrc/utils/pybind.h>
#include "int4_linear.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, "4-bit-weight, per-token int8-activation linear");
  m.def("linear8", &linear8, "int8-weight (per-row scale), per-token int8-activation linear");
  m.def("pack4_into", &pack4_into, "write the 4-bit layout of levels, scales and offsets into a uint8 tensor");
  m.def("pack8_from4", &pack8_from4, "write the 8-bit layout, row scales and row sums of a 4-bit layer's weights");
  m.def("isa", &isa, "the instruction-set level this module was compiled for");
  m.def("vnni", &vnni, "whether this build's integer products run on vpdpbusd (AVX-512 VNNI or AVX-VNNI)");
  m.def("amx", &amx, "whether 8-bit passes of several tokens run on AMX tiles");
  m.def("amx_min_tokens", &amx_min_tokens, "the fewest tokens a pass on AMX tiles takes");
  m.def("set_amx", &set_amx, "turn the AMX tile path on or off", py::arg("on"), py::arg("min_tokens") = 0);
  m.def("amx4_min_tokens", &amx4_min_tokens, "the fewest tokens a 4-bit pass on AMX tiles takes (0: none does)");
  m.def("set_amx4", &set_amx4, "move or stop the 4-bit layers' AMX tile path", py::arg("min_tokens") = 0);
  m.def("parallel_threads", &parallel_threads, "the most threads one parallel region of this build ran on");
}
