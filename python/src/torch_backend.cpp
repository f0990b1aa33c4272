// defines: the "longhaul" backend of torch.distributed — lh::py::LonghaulProcessGroup (a c10d::ProcessGroup over
// bridge.h's Group) and its Work — and longhaul._C's functions for it (longhaul/torch.py registers the backend).
// The only translation unit that includes torch's headers.
#include <torch/python.h>

#include <functional>
#include <regex>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "compress/codec_chain.h"
#include "python/src/bridge.h"

namespace lh::py {
namespace {

namespace pyb = pybind11;

// A Status's message for a Python exception, without the [file:line] marks LH_RETURN_IF_ERROR adds on the way up.
std::string status_text(const Status& s) {
  static const std::regex where(R"( ?\[[A-Za-z0-9_/.]+\.(cpp|h):[0-9]+\])");
  return std::regex_replace(s.message().empty() ? s.to_string() : s.message(), where, "");
}

[[noreturn]] void raise(const Status& s) {
  if (s.code() == StatusCode::kInvalidArgument) throw pyb::value_error(status_text(s));
  throw std::runtime_error(status_text(s));
}

Elem elem_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return Elem::f32;
    case at::kDouble:
      return Elem::f64;
    case at::kHalf:
      return Elem::f16;
    case at::kBFloat16:
      return Elem::bf16;
    case at::kLong:
      return Elem::i64;
    case at::kInt:
      return Elem::i32;
    case at::kShort:
      return Elem::i16;
    case at::kChar:
      return Elem::i8;
    case at::kByte:
      return Elem::u8;
    case at::kBool:
      return Elem::boolean;
    default:
      TORCH_CHECK(false, "longhaul: ", what, " has dtype ", t.scalar_type(),
                  ", which the longhaul backend does not move (float32/64, float16, bfloat16, int8/16/32/64, uint8, "
                  "bool)");
  }
}

// A tensor the bridge may read and write in place: CPU, dense, contiguous.
Buffer buffer_of(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "longhaul: ", what, " is an undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "longhaul: ", what,
              " is a sparse tensor; the longhaul backend moves dense ones");
  TORCH_CHECK(t.device().is_cpu(), "longhaul: ", what, " is on ", t.device(),
              "; this longhaul backend moves CPU tensors (a torch with CUDA is not verified)");
  TORCH_CHECK(t.is_contiguous(), "longhaul: ", what, " is not contiguous (call .contiguous() first)");
  return Buffer{t.data_ptr(), t.numel(), elem_of(t, what)};
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "longhaul: ", op, " takes one tensor per process, got ", ts.size());
  return ts[0];
}

ReduceKind kind_of(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceKind::sum;
    case c10d::ReduceOp::AVG:
      return ReduceKind::avg;
    case c10d::ReduceOp::MIN:
      return ReduceKind::min;
    case c10d::ReduceOp::MAX:
      return ReduceKind::max;
    case c10d::ReduceOp::PRODUCT:
      return ReduceKind::product;
    default:
      TORCH_CHECK(false, "longhaul: reduce op ", int(op.op_), " is not supported (SUM, AVG, MIN, MAX, PRODUCT)");
  }
}

class LonghaulWork : public c10d::Work {
 public:
  LonghaulWork(c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  // On a group thread: the future first, so whoever wait() releases finds it complete.
  void complete(const Status& s) {
    if (s.ok()) {
      future_->markCompleted(c10::IValue(outputs_));
      finish();
    } else {
      auto e = std::make_exception_ptr(std::runtime_error(status_text(s)));
      future_->setError(e);
      finish(e);
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class LonghaulProcessGroup : public c10d::ProcessGroup {
 public:
  LonghaulProcessGroup(int rank, int size, std::shared_ptr<Group> group)
      : c10d::ProcessGroup(rank, size), group_(std::move(group)) {}
  // The group's threads may be finishing an op whose future runs Python callbacks: they need the GIL this thread may
  // hold while it joins them.
  ~LonghaulProcessGroup() override {
    if (PyGILState_Check()) {
      pyb::gil_scoped_release nogil;
      group_.reset();
    }
  }

  const std::string getBackendName() const override { return "longhaul"; }
  Group& group() { return *group_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor& t = single(tensors, "broadcast");
    const Buffer b = buffer_of(t, "broadcast's tensor");
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "longhaul: broadcast root ", opts.rootRank,
                " is not a rank of this group of ", getSize());
    const int root = int(opts.rootRank);
    return run(c10d::OpType::BROADCAST, {t}, [g = group_.get(), b, root] { return g->broadcast(b, root); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor& t = single(tensors, "allreduce");
    const Buffer b = buffer_of(t, "allreduce's tensor");
    const ReduceKind k = kind_of(opts.reduceOp);
    return run(c10d::OpType::ALLREDUCE, {t}, [g = group_.get(), b, k] { return g->all_reduce(b, k); });
  }

  // longhaul.torch.all_reduce: its own codec and stream (`spec` checked here, before it is queued).
  c10::intrusive_ptr<c10d::Work> allreduce_coded(at::Tensor& t, const std::string& op, const std::string& spec,
                                                 int stream) {
    const Buffer b = buffer_of(t, "all_reduce's tensor");
    ReduceKind k = ReduceKind::sum;
    if (op == "avg")
      k = ReduceKind::avg;
    else if (op != "sum")
      throw pyb::value_error("longhaul: all_reduce's op is 'sum' or 'avg', got '" + op + "'");
    if (Status s = compress::parse_codec_spec(spec).status(); !s.ok()) raise(s);
    if (stream < -1) throw pyb::value_error("longhaul: all_reduce's stream is a non-negative id (or None)");
    return run(c10d::OpType::ALLREDUCE, {t},
               [g = group_.get(), b, k, spec, stream] { return g->all_reduce_with(b, k, spec, stream); });
  }

  // longhaul.torch.powersgd_hook: one DDP bucket's PowerSGD.
  c10::intrusive_ptr<c10d::Work> powersgd(at::Tensor& grads, int bucket, std::vector<std::vector<int64_t>> shapes,
                                          int rank, const std::string& wire) {
    const Buffer b = buffer_of(grads, "the PowerSGD bucket");
    if (Status s = compress::parse_codec_spec(wire).status(); !s.ok()) raise(s);
    std::vector<Shape> sh(shapes.begin(), shapes.end());
    return run(c10d::OpType::ALLREDUCE, {grads},
               [g = group_.get(), b, bucket, sh, rank, wire] { return g->powersgd(b, bucket, sh, rank, wire); });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    const at::Tensor& in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, "longhaul: allgather takes one output list per process, got ", outputs.size());
    TORCH_CHECK(int(outputs[0].size()) == getSize(), "longhaul: allgather's output list holds ", outputs[0].size(),
                " tensors for a group of ", getSize());
    const Buffer b = buffer_of(in, "allgather's input");
    std::vector<Buffer> outs;
    for (const at::Tensor& o : outputs[0]) {
      outs.push_back(buffer_of(o, "allgather's output"));
      TORCH_CHECK(o.scalar_type() == in.scalar_type() && o.numel() == in.numel(), "longhaul: allgather's output is ",
                  o.scalar_type(), "[", o.numel(), "], its input ", in.scalar_type(), "[", in.numel(), "]");
    }
    return run(c10d::OpType::ALLGATHER, outputs[0], [g = group_.get(), b, outs] { return g->all_gather(b, outs); });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    const Buffer b = buffer_of(input, "_allgather_base's input");
    const Buffer o = buffer_of(output, "_allgather_base's output");
    TORCH_CHECK(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * getSize(),
                "longhaul: _allgather_base's output must hold the group size (", getSize(), ") times the input's ",
                input.numel(), " elements of ", input.scalar_type(), ", got ", output.numel(), " of ",
                output.scalar_type());
    std::vector<Buffer> outs;
    for (int j = 0; j < getSize(); ++j)
      outs.push_back(Buffer{static_cast<char*>(o.data) + j * b.bytes(), b.numel, b.elem});
    return run(c10d::OpType::_ALLGATHER_BASE, {output}, [g = group_.get(), b, outs] { return g->all_gather(b, outs); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, "longhaul: reduce_scatter takes one input list per process, got ", inputs.size());
    TORCH_CHECK(int(inputs[0].size()) == getSize(), "longhaul: reduce_scatter's input list holds ", inputs[0].size(),
                " tensors for a group of ", getSize());
    const Buffer o = buffer_of(out, "reduce_scatter's output");
    std::vector<Buffer> ins;
    for (const at::Tensor& t : inputs[0]) ins.push_back(buffer_of(t, "reduce_scatter's input"));
    const ReduceKind k = kind_of(opts.reduceOp);
    std::vector<at::Tensor> keep = inputs[0];
    keep.push_back(out);
    return run(c10d::OpType::REDUCE_SCATTER, {out},
               [g = group_.get(), ins, o, k, keep] { return g->reduce_scatter(ins, o, k); });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    const Buffer in = buffer_of(input, "_reduce_scatter_base's input");
    const Buffer o = buffer_of(output, "_reduce_scatter_base's output");
    TORCH_CHECK(output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * getSize(),
                "longhaul: _reduce_scatter_base's input must hold the group size (", getSize(), ") times the output's ",
                output.numel(), " elements of ", output.scalar_type(), ", got ", input.numel(), " of ",
                input.scalar_type());
    std::vector<Buffer> ins;
    for (int j = 0; j < getSize(); ++j)
      ins.push_back(Buffer{static_cast<char*>(in.data) + j * o.bytes(), o.numel, o.elem});
    const ReduceKind k = kind_of(opts.reduceOp);
    at::Tensor keep = input;
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, {output},
               [g = group_.get(), ins, o, k, keep] { return g->reduce_scatter(ins, o, k); });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return run(c10d::OpType::BARRIER, {}, [g = group_.get()] { return g->barrier(); });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    const at::Tensor& t = single(tensors, "send");
    const Buffer b = buffer_of(t, "send's tensor");
    auto work = c10::make_intrusive<LonghaulWork>(c10d::OpType::SEND, std::vector<at::Tensor>{t});
    group_->send(b, dst, tag, [work](const Status& s) { work->complete(s); });
    return work;
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    const at::Tensor& t = single(tensors, "recv");
    const Buffer b = buffer_of(t, "recv's tensor");
    auto work = c10::make_intrusive<LonghaulWork>(c10d::OpType::RECV, std::vector<at::Tensor>{t});
    group_->recv(b, src, tag, [work](const Status& s) { work->complete(s); });
    return work;
  }

 private:
  // Queues `op` on the group's thread; the Work holds `outputs` (and the op's lambda whatever else it must keep alive).
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, std::vector<at::Tensor> outputs, std::function<Status()> op) {
    auto work = c10::make_intrusive<LonghaulWork>(type, std::move(outputs));
    group_->submit(std::move(op), [work](const Status& s) { work->complete(s); });
    return work;
  }

  std::shared_ptr<Group> group_;
};

// The tag group of a torch.distributed group: 0 for the default group, else from its name (torch names groups "1",
// "2", … in creation order, the same on every process).
int tag_group_of(const std::string& group_id, bool is_default) {
  if (is_default) return 0;
  char* end = nullptr;
  const unsigned long n = std::strtoul(group_id.c_str(), &end, 10);
  const uint64_t h = (!group_id.empty() && *end == '\0') ? n : std::hash<std::string>{}(group_id);
  return int(h % ProcessGroup::kMaxTagGroup) + 1;
}

c10::intrusive_ptr<LonghaulProcessGroup> create_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                              int group_rank, int group_size, double timeout_s,
                                                              const std::string& group_id,
                                                              std::vector<int64_t> global_ranks) {
  const auto timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
  const bool is_default = global_ranks.empty();
  std::shared_ptr<Plane> plane;
  std::vector<int> members;
  Status s;
  {
    pyb::gil_scoped_release nogil;
    if (is_default) {
      StoreOps ops;
      ops.set = [store](const std::string& k, const std::string& v) {
        store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
      };
      ops.get = [store](const std::string& k) {
        const std::vector<uint8_t> v = store->get(k);
        return std::string(v.begin(), v.end());
      };
      ops.add = [store](const std::string& k, int64_t d) { return store->add(k, d); };
      ops.check = [store](const std::string& k) { return store->check({k}); };
      auto made = Plane::create(ops, group_rank, group_size, timeout);
      if (made.ok())
        plane = std::move(made).value();
      else
        s = made.status();
      for (int r = 0; r < group_size; ++r) members.push_back(r);
    } else {
      plane = Plane::current();
      if (!plane)
        s = invalid_argument("longhaul: group '" + group_id +
                             "' needs the default group to use the longhaul backend "
                             "too (init_process_group(\"longhaul\", ...)): it owns the process's data plane");
      for (int64_t r : global_ranks) members.push_back(int(r));
    }
  }
  if (!s.ok()) raise(s);
  if (int(members.size()) != group_size || group_rank < 0 || group_rank >= group_size ||
      members[group_rank] != plane->rank())
    raise(invalid_argument("longhaul: group '" + group_id + "': rank " + std::to_string(group_rank) + " of " +
                           std::to_string(group_size) + " does not match its ranks on the plane"));
  const std::string name = is_default ? "the default group" : "group '" + group_id + "'";
  auto g = Group::create(plane, members, tag_group_of(group_id, is_default), name, timeout);
  if (!g.ok()) raise(g.status());
  return c10::make_intrusive<LonghaulProcessGroup>(group_rank, group_size, std::move(g).value());
}

std::shared_ptr<Plane> current_plane() {
  std::shared_ptr<Plane> p = Plane::current();
  if (!p) throw std::runtime_error("longhaul: no longhaul process group yet (init_process_group(\"longhaul\", ...))");
  return p;
}

}  // namespace

void bind_torch(pyb::module_& m) {
  pyb::class_<LonghaulProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<LonghaulProcessGroup>>(
      m, "LonghaulProcessGroup", "torch.distributed's \"longhaul\" backend (made by init_process_group / new_group)")
      .def_property_readonly("codec", [](LonghaulProcessGroup& pg) { return pg.group().codec(); })
      .def_property_readonly("p2p_codec", [](LonghaulProcessGroup& pg) { return pg.group().p2p_codec(); })
      .def("_allreduce_coded", &LonghaulProcessGroup::allreduce_coded, pyb::arg("tensor"), pyb::arg("op"),
           pyb::arg("spec"), pyb::arg("stream"))
      .def("_forge_for_tests",
           [](LonghaulProcessGroup& pg, int dst, int64_t tag) {
             if (Status s = pg.group().forge_for_tests(dst, tag); !s.ok()) raise(s);
           })
      .def("_powersgd", &LonghaulProcessGroup::powersgd, pyb::arg("grads"), pyb::arg("bucket"), pyb::arg("shapes"),
           pyb::arg("rank"), pyb::arg("wire"));
  m.def("_create_process_group", &create_process_group, pyb::arg("store"), pyb::arg("group_rank"),
        pyb::arg("group_size"), pyb::arg("timeout_s"), pyb::arg("group_id"), pyb::arg("global_ranks"));
  m.def("_set_codec", [](LonghaulProcessGroup& pg, const std::string& spec) {
    if (Status s = pg.group().set_codec(spec); !s.ok()) raise(s);
  });
  m.def("_set_p2p_codec", [](LonghaulProcessGroup& pg, const std::string& spec) {
    if (Status s = pg.group().set_p2p_codec(spec); !s.ok()) raise(s);
  });
  m.def("_metrics_line", [](int64_t step, std::optional<double> loss, const std::string& codec) {
    const double l = loss.value_or(0);
    return metrics_line(*current_plane(), step, loss ? &l : nullptr, codec);
  });
  m.def("_link_stats", [] { return current_plane()->meter()->to_json().dump(); });
  m.def("_plane_counters", [] {
    std::shared_ptr<Plane> plane = current_plane();
    Plane& p = *plane;
    pyb::dict d;
    d["rank"] = p.rank();
    d["world"] = p.world();
    d["auth_failures"] = p.data().auth_failures();
    d["dropped_packets"] = p.data().dropped_packets();
    d["transports"] = p.data().transports();
    d["link"] = p.link_shape();
    return d;
  });
}

}  // namespace lh::py
