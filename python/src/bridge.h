// defines: the PyTorch bridge's core, free of torch headers: lh::py::Plane (one UCX data plane per process, set up
// through torch.distributed's store with entries authenticated by the job secret) and lh::py::Group (one per
// torch.distributed group: its collectives and point-to-point transfers on that plane, run on the group's own
// thread). torch_backend.cpp wraps them as a c10d::ProcessGroup; docs/torch.md is the user's view.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/powersgd.h"
#include "comm/process_group.h"
#include "compress/codec_chain.h"
#include "core/status.h"
#include "transport/link_meter.h"
#include "transport/link_shaper.h"
#include "transport/ucx_data_plane.h"

namespace lh::py {

// Element types the bridge reduces (broadcast, gathers and point-to-point move bytes of any type).
enum class Elem : uint8_t { f32, f64, f16, bf16, i64, i32, i16, i8, u8, boolean };
size_t elem_size(Elem e);
const char* elem_name(Elem e);

enum class ReduceKind : uint8_t { sum, avg, min, max, product };
const char* reduce_name(ReduceKind k);

// A tensor's memory as the bridge sees it: CPU, contiguous, kept alive by the caller until its op is done.
struct Buffer {
  void* data = nullptr;
  int64_t numel = 0;
  Elem elem = Elem::f32;
  uint64_t bytes() const { return uint64_t(numel) * elem_size(elem); }
};

// torch.distributed's store, as callbacks (the torch side wraps a c10d::Store); they throw on failure or timeout.
struct StoreOps {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;  // waits for the key (the store's timeout)
  std::function<int64_t(const std::string& key, int64_t delta)> add;
  std::function<bool(const std::string& key)> check;  // whether the key is set (never waits)
};

// One per process: made by the default group, shared by every group after it.
class Plane {
 public:
  // The job secret comes from $LH_JOB_KEY (64 hex digits, or a passphrase) or the key file $LH_JOB_KEY_FILE
  // (`longhaul keygen`); without one, creation fails saying so. Every rank publishes its data-plane address and
  // public key in the store, sealed with a key derived from the secret; a peer's entry that does not verify fails
  // creation naming that rank. Returns once every rank's plane is connected. $LH_LINK ("RATE[,DELAY]", as `launch
  // --link`: "20M,50ms") makes every link this process sends on behave like such a link (the in-process shaper).
  static Result<std::shared_ptr<Plane>> create(const StoreOps& store, int rank, int world,
                                               std::chrono::milliseconds timeout);
  ~Plane();

  int rank() const { return rank_; }
  int world() const { return world_; }
  UcxDataPlane& data() { return *ucx_; }
  // What the groups send and receive through: the shaper when $LH_LINK is set, else the UCX plane.
  DataPlane& net() { return shaper_ ? static_cast<DataPlane&>(*shaper_) : *ucx_; }
  // The shape $LH_LINK gave ("" when unshaped).
  std::string link_shape() const { return shaper_ ? shape_.to_string() : ""; }
  const std::shared_ptr<LinkMeter>& meter() const { return meter_; }

  // Tag groups (0..255) in use in this process: a group takes one for its life.
  Status claim_tag_group(int id, const std::string& group_name);
  void release_tag_group(int id);

  // Tests only: sends `bytes` to `peer` under `tag` with a wire header that has no MAC, as a stranger who reached the
  // peer's port could: the peer must drop and count it (UcxDataPlane::auth_failures), and nothing of it may complete
  // a receive.
  Status send_forged_for_tests(int peer, Tag tag, size_t bytes);

  // The plane the default group made, while it lives (sub-groups use it).
  static std::shared_ptr<Plane> current();

 private:
  Plane() = default;
  int rank_ = -1, world_ = 0;
  uint32_t epoch_ = 0;
  std::unique_ptr<UcxDataPlane> ucx_;
  std::unique_ptr<LinkShaper> shaper_;  // over *ucx_, destroyed first
  LinkShape shape_;
  std::shared_ptr<LinkMeter> meter_;
  std::mutex mu_;
  std::map<int, std::string> tag_groups_;
};

// One torch.distributed group. Collectives run one at a time, in the order they were submitted, on the group's
// thread (every member submits them in the same order, as torch.distributed requires); point-to-point transfers
// start at once on the caller's thread and complete on the group's second thread.
class Group {
 public:
  // `members`: the group's ranks on the plane in group order; `tag_group`: the same on every member.
  static Result<std::shared_ptr<Group>> create(std::shared_ptr<Plane> plane, std::vector<int> members, int tag_group,
                                               std::string name, std::chrono::milliseconds timeout);
  ~Group();

  int size() const { return int(members_.size()); }
  int index() const { return index_; }
  const std::string& name() const { return name_; }
  Plane& plane() { return *plane_; }

  // Runs `op` on the group's thread after every op submitted before it, then `done` with its status (there too).
  void submit(std::function<Status()> op, std::function<void(const Status&)> done);

  // The collectives (on the group's thread, through submit). Results are bit-identical on every member.
  // all_reduce: f32 SUM/AVG go through longhaul's collectives with the group's codec (ring or direct, error feedback
  // per tensor); everything else is exact: every member's tensor reaches every member, which reduces them in member
  // order (f16/bf16 in f32, rounded once).
  Status all_reduce(const Buffer& inout, ReduceKind kind);
  // The same with its own codec chain and codec stream (0 ≤ stream < 2^19: the error-feedback state it keeps across
  // calls; −1: the stream of the tensor's memory, as all_reduce does), for callers that compress some reductions and
  // not others (longhaul.torch.all_reduce, DiLoCo's pseudo-gradients).
  Status all_reduce_with(const Buffer& inout, ReduceKind kind, const std::string& spec, int stream);
  Status broadcast(const Buffer& inout, int root);
  Status all_gather(const Buffer& in, const std::vector<Buffer>& outs);
  Status reduce_scatter(const std::vector<Buffer>& ins, const Buffer& out, ReduceKind kind);
  Status barrier();

  // PowerSGD (comm/powersgd.h, the C++ jobs' two-round reducer) on one DDP gradient bucket, in place: `shapes` are
  // its parameters' shapes in bucket order (each tensor of more than two dimensions a matrix of its first dimension
  // by the rest); matrices whose factors are smaller go through P and Q, the rest is averaged as is, all on `wire`.
  // The warm start and error feedback of bucket `bucket` persist across calls. Every rank ends with the same bits.
  Status powersgd(const Buffer& grads, int bucket, const std::vector<Shape>& shapes, int rank, const std::string& wire);

  // Point-to-point, with torch's tag (0 ≤ tag < 2^28): starts now; `done` runs on the group's transfer thread.
  // With a p2p codec other than none (set_p2p_codec), a float32/16 or bfloat16 tensor travels encoded, with one
  // stream state per (peer, tag) and way: compressed activations and gradients for a user's own pipeline.
  void send(const Buffer& data, int dst, int64_t tag, std::function<void(const Status&)> done);
  void recv(const Buffer& data, int src, int64_t tag, std::function<void(const Status&)> done);

  // The codec chain of this group's f32 all-reduces (compress/spec.h grammar; "none" by default). Takes effect for
  // the ops submitted after it; refuses a spec that does not parse, naming what is wrong.
  Status set_codec(const std::string& spec);
  std::string codec() const;
  Status set_p2p_codec(const std::string& spec);
  // Tests only: Plane::send_forged_for_tests to group rank `dst` under the point-to-point tag `tag`.
  Status forge_for_tests(int dst, int64_t tag);
  std::string p2p_codec() const;

 private:
  struct Part {
    int member = 0;  // index in the group
    void* data = nullptr;
    uint64_t bytes = 0;
  };
  Group() = default;
  void run_ops();
  void run_transfers();
  void queue_transfer(Transfer t, std::function<void(const Status&)> done);
  uint32_t next_step();
  Tag tag(uint32_t step, Role role) const;
  std::string op_name(const char* what, uint32_t step) const;
  // Posts every receive and send, then waits for them all (the group's timeout); a receive of another size fails.
  Status transfer_all(const std::string& what, Tag tag, const std::vector<Part>& sends, const std::vector<Part>& recvs);
  Status exchange_reduce(const std::string& what, Tag tag, const std::vector<const void*>& mine, const Buffer& out,
                         ReduceKind kind);
  Status compressed_all_reduce(const Buffer& inout, ReduceKind kind, const std::string& spec, int stream,
                               double raw_scale = 1.0);
  int stream_of(const Buffer& b);
  // Explicit stream s is codec stream kExplicitStreams + s: a caller's below kMaxUserStream, PowerSGD's above.
  static constexpr int kExplicitStreams = 1 << 20, kMaxUserStream = 1 << 19;

  std::shared_ptr<Plane> plane_;
  std::vector<int> members_;
  int index_ = 0;
  int tag_group_ = 0;
  std::string name_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<ProcessGroup> collectives_;
  uint32_t ops_ = 0;                                      // collectives started (group thread only)
  std::map<std::pair<uintptr_t, int64_t>, int> streams_;  // (data, numel) → codec stream (group thread only)

  mutable std::mutex mu_;
  std::string codec_ = "none";
  std::string p2p_spec_ = "none";
  compress::CodecChain p2p_chain_;
  std::map<std::tuple<int, int64_t, int>, compress::StreamState> p2p_states_;  // (peer, tag, way)
  struct PowerSgdState {
    std::unique_ptr<PowerSgdBucket> bucket;
    std::vector<Shape> shapes;
    int rank = 0;
  };
  std::map<int, PowerSgdState> powersgd_;  // by DDP bucket index (group thread only)
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<std::pair<std::function<Status()>, std::function<void(const Status&)>>> queue_;
  std::deque<std::pair<Transfer, std::function<void(const Status&)>>> transfers_;
  std::thread ops_thread_, transfer_thread_;
};

// The plane's link counters as a step-metrics line (metrics/step_metrics.h: what `longhaul report` reads), with this
// rank as the worker and `codec` on its gradient links; the counters restart after it.
std::string metrics_line(Plane& plane, int64_t step, const double* loss, const std::string& codec);

}  // namespace lh::py
