// defines: longhaul._C's --sync bindings — parse_sync (the jobs' --sync grammar), check_grad_codec (the jobs' rule for
// a gradient codec under a sync mode) and diloco_outer_update (the jobs' own outer step). longhaul/diloco.py uses them.
//
// No torch header here: buffers arrive as data pointers from longhaul/diloco.py, which checks dtype, device, size and
// contiguity and keeps the tensors alive for the call.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "comm/dp_reducer.h"
#include "comm/sync_config.h"

namespace lh::py {
namespace {

namespace pb = pybind11;

[[noreturn]] void throw_status(const Status& s) {
  if (s.code() == StatusCode::kInvalidArgument) throw pb::value_error(s.message());
  throw std::runtime_error(std::string(status_code_name(s.code())) + ": " + s.message());
}

SyncConfig parsed(const std::string& text) {
  auto c = parse_sync(text);
  if (!c.ok()) throw_status(c.status());
  return *c;
}

const char* kind_name(SyncConfig::Kind k) {
  switch (k) {
    case SyncConfig::Kind::kEveryStep:
      return "every-step";
    case SyncConfig::Kind::kDelayed:
      return "delayed";
    case SyncConfig::Kind::kDiloco:
      return "diloco";
  }
  return "?";
}

pb::dict sync_dict(const std::string& text) {
  const SyncConfig c = parsed(text);
  pb::dict d;
  d["kind"] = kind_name(c.kind);
  d["H"] = c.H;
  d["outer_lr"] = c.outer_lr;
  d["outer_momentum"] = c.outer_momentum;
  d["D"] = c.D;
  d["predict"] = c.predict;
  d["canonical"] = c.to_string();
  return d;
}

void check_grad_codec(const std::string& spec, const std::string& sync) {
  const Status s = check_grad_codec_spec(spec, parsed(sync));
  if (!s.ok()) throw_status(s);
}

void outer_update(uintptr_t sync, uintptr_t momentum, uintptr_t avg_delta, int64_t n, double lr, double mu) {
  if (n < 0) throw pb::value_error("diloco_outer_update: n = " + std::to_string(n) + " is negative");
  if (n > 0 && (sync == 0 || momentum == 0 || avg_delta == 0))
    throw pb::value_error("diloco_outer_update: a null buffer for " + std::to_string(n) + " elements");
  pb::gil_scoped_release nogil;
  diloco_outer_update(reinterpret_cast<float*>(sync), reinterpret_cast<float*>(momentum),
                      reinterpret_cast<const float*>(avg_delta), n, lr, mu);
}

}  // namespace

void bind_sync(pybind11::module_& m) {
  m.def("parse_sync", &sync_dict, pb::arg("text"),
        "The --sync grammar (every-step, delayed:D=N, diloco:H=N,outer_lr=X,outer_momentum=M) as a dict: kind, H, "
        "outer_lr, outer_momentum, D, predict, canonical. A bad spec raises ValueError naming the bad part.");
  m.def("check_grad_codec", &check_grad_codec, pb::arg("spec"), pb::arg("sync"),
        "Raises ValueError unless `spec` is a codec the jobs take for weight gradients under --sync `sync`.");
  m.def("diloco_outer_update", &outer_update, pb::arg("sync_ptr"), pb::arg("momentum_ptr"), pb::arg("delta_ptr"),
        pb::arg("n"), pb::arg("lr"), pb::arg("mu"),
        "DiLoCo's outer step in place on n float32s (the jobs' own code, comm/dp_reducer.h): m := mu*m + delta; "
        "sync := sync - lr*(delta + mu*m). The pointers must each hold n float32s.");
}

}  // namespace lh::py
