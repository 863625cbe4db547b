// The attention extension's Python functions (verispec/models/query_attention.py builds this with attention.cpp).
// torch's pybind11 casters only (at::Tensor, optional, containers), not <torch/extension.h>: a third of the
// compile time.
#include <torch/csrc/utils/pybind.h>
#include "attention.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 rows, each on its own", py::arg("x"), py::arg("weight"),
        py::arg("eps"));
  m.def("rotate_qk", &rotate_qk, "rotary position embedding of q and k in place, bit-identical to torch's ops",
        py::arg("q"), py::arg("k"), py::arg("cos"), py::arg("sin"));
  m.def("attend", &attend, "attention one query at a time, independent of the call's other queries",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask") = py::none(), py::arg("scale"));
}
