// defines: lh::ProcessGroup — the collectives layer over the DataPlane (docs/grid.md §3): all-reduce of f32
// tensors among a group of ranks, ring (reduce-scatter + all-gather) or direct (all-gather of compressed
// contributions), each hop through a codec chain with per-stream state, progressed on the caller's
// thread; plus a small f64 all-reduce (losses, norms). Used by the dp reducer (and tp, issue 11).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/collective_algo.h"
#include "compress/codec_chain.h"
#include "core/tensor.h"
#include "transport/data_plane.h"

namespace lh {

struct CollectiveOptions {
  Role role = Role::kWeightGrad;  // the tag's role: what the meter counts the bytes as
  bool average = false;           // divide the sum by the group size
  CollectiveAlgo algo = CollectiveAlgo::kAuto;
  // Which codec stream states the op uses: ops on the same stream (e.g. one gradient bucket, step
  // after step) share their error-feedback residuals. Any non-negative id the caller keeps stable.
  int stream = 0;
  std::string spec = "none";  // codec chain of every hop (compress/spec.h grammar)
  // The meter's raw bytes are this × the fp32 bytes of what is sent, for tensors that stand for more than
  // themselves (PowerSGD's factors stand for whole matrices).
  double raw_scale = 1.0;
};

// One per group and member. Every member issues the same ops in the same order within a step; an op is
// named on the wire by (step, the group's sequence number within the step, packet index), so members
// that disagree show up as a timeout naming the op and the peer rather than as mixed-up data.
//
// Results are bit-identical on every member: in a ring, a chunk's owner encodes the reduced chunk once and
// decodes its own packet, and the same bytes travel on; in direct mode every member decodes the same
// packets (its own included) and sums them in member order.
class ProcessGroup {
 public:
  // `members`: ranks in group order, each once, including plane.rank(). `name` is for errors ("dp group
  // of stage 1"). A receive that waits longer than `timeout` fails the op, naming the peer.
  static Result<std::unique_ptr<ProcessGroup>> create(DataPlane& plane, std::vector<int> members, std::string name,
                                                      std::chrono::milliseconds timeout);
  ~ProcessGroup();

  int size() const { return static_cast<int>(members_.size()); }
  int index() const { return index_; }
  const std::vector<int>& members() const { return members_; }
  const std::string& name() const { return name_; }
  // For planes that several groups share with the same members (the PyTorch bridge's one plane per process): the
  // tags of this group's packets carry `group` (0..255) in the step field's top 8 bits and the step's low 16 bits
  // below it, so two groups' ops never match each other's packets. Members must agree on it; set before the first op.
  static constexpr int kMaxTagGroup = 255;
  Status set_tag_group(int group);

  // Starts a step: the op sequence restarts at 0. Every op of earlier steps must be finished, unless
  // `keep_running`: then they go on beside this step's (each op's packets carry the step it was started in).
  // Ops that share a codec stream are advanced in the order they were started, so stream states see them in order.
  Status begin_step(int64_t step, bool keep_running = false);

  // Starts an all-reduce (sum, or mean with options.average) of `inout` in place: f32, contiguous, on
  // any device (a CUDA tensor is reduced through a host copy). `inout` must stay alive and untouched
  // until the op is finished. Returns the op's id for wait().
  Result<int> start_all_reduce(Tensor inout, const CollectiveOptions& options);
  // Advances every started op whose packets have arrived (decode → add → encode, forward); never blocks.
  Status poll();
  // Blocks until op `id` is finished (progressing the others too); its error if it failed.
  Status wait(int id);
  // Blocks until every started op is finished, including their sends.
  Status wait_all();

  // A blocking, uncompressed all-reduce of a few doubles, summed in member order on every member
  // (bit-identical everywhere). Shares the op sequence with the tensor ops.
  Result<std::vector<double>> all_reduce_f64(const std::vector<double>& values, Role role = Role::kOther);

  // Codec stream states, keyed by (stream, chunk, phase, end): for checkpoints and tests.
  using StreamKey = std::tuple<int, int, int, int>;
  const std::map<StreamKey, compress::StreamState>& stream_states() const { return states_; }
  // Replaces them (a checkpoint's); between steps only.
  void set_stream_states(std::map<StreamKey, compress::StreamState> states) { states_ = std::move(states); }

 private:
  struct Op;
  ProcessGroup() = default;
  Status advance(Op& op);  // processes every arrived packet of op
  Status on_packet(Op& op, Bytes packet);
  Status finish(Op& op);
  Status reduce_own_chunk(Op& op);
  // Decodes a packet of `op` that must hold `shape`, with the op's receive state for (chunk, phase); an error names
  // the group, the op and `what` (e.g. "from rank 3").
  Status decode(Op& op, const Bytes& packet, const Shape& shape, int chunk, int phase, Tensor* out,
                const std::string& what);  // mesh: the owner sums its chunk's contributions and sends the result to all
  // The receive that `op` (or an earlier op on its stream, which it waits behind) needs next; invalid if none.
  Transfer pending_transfer(const Op& op) const;
  compress::StreamState& state(const CollectiveOptions& opt, int chunk, int phase, int end);
  // The parsed chain of `spec`, parsed once per spec and kept (map entries stay put, so ops hold the pointer).
  Result<const compress::CodecChain*> chain(const std::string& spec);
  Tag tag(const Op& op, int packet) const;
  std::string op_name(const Op& op) const;

  DataPlane* plane_ = nullptr;
  std::vector<int> members_;
  int index_ = 0;
  std::string name_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
  int64_t step_ = 0;
  int tag_group_ = -1;  // set_tag_group's; −1: the whole step goes in the tag
  int sequence_ = 0;
  int next_id_ = 0;
  std::vector<std::unique_ptr<Op>> ops_;  // started this step, in order
  std::map<StreamKey, compress::StreamState> states_;
  std::map<std::string, compress::CodecChain> chains_;
};

}  // namespace lh
