// defines: longhaul._C's codec bindings (longhaul.codecs wraps them).
#include <pybind11/pybind11.h>

namespace lh::py {
void bind_codecs(pybind11::module_& m) {}
}  // namespace lh::py
