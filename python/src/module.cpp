// defines: the extension module longhaul._C — codecs on tensors (codecs_py.cpp), --sync and DiLoCo's outer step
// (sync_py.cpp) and the torch.distributed backend (torch_backend.cpp). The Python package (python/longhaul/) is its
// only user.
#include <pybind11/pybind11.h>

namespace lh::py {
void bind_codecs(pybind11::module_& m);
void bind_sync(pybind11::module_& m);
void bind_torch(pybind11::module_& m);
}  // namespace lh::py

PYBIND11_MODULE(_C, m) {
  m.doc() = "longhaul's codecs and torch.distributed backend (use the longhaul package, not this module)";
  lh::py::bind_codecs(m);
  lh::py::bind_sync(m);
  lh::py::bind_torch(m);
}
