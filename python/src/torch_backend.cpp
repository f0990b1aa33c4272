#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/python.h>

namespace lh::py {
class Probe : public c10d::ProcessGroup {
 public:
  Probe(int r, int s) : c10d::ProcessGroup(r, s) {}
  const std::string getBackendName() const override { return "longhaul"; }
};
void bind_torch(pybind11::module_& m) {
  pybind11::class_<Probe, c10d::ProcessGroup, c10::intrusive_ptr<Probe>>(m, "_Probe")
      .def(pybind11::init([](const c10::intrusive_ptr<c10d::Store>& store, int r, int s) {
        return c10::make_intrusive<Probe>(r, s);
      }));
}
}  // namespace lh::py
