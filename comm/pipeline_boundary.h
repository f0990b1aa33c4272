// defines: lh::PipelineBoundary — a stage's two pipeline links: the codec chain in force on each, the stream
// states of the ends this stage holds, receives posted ahead, encode-and-send without waiting, wait-and-decode.
// Knows tensors on the wire only (the subspace conversion is the runner's). Used by StageRunner.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compress/codec_chain.h"
#include "grid/codec_plan.h"
#include "grid/topology.h"
#include "metrics/step_metrics.h"
#include "transport/data_plane.h"

namespace lh {

// With tp > 1 a pipeline link carries each shard's slice of the tokens: shard t sends rows [b_t, b_{t+1}) of the
// [B·T, W] activation (b_t = ⌊B·T·t/tp⌋) to shard t of the neighbouring stage, which relays the packet's bytes to
// the other shards of its stage replica (same role, over the tp pairs); every shard decodes every slice, each with
// that slice's stream state, into the whole tensor. So a pipeline link carries the activation once, not tp times,
// and every shard still holds the same bits.
// The codec stream states of a boundary's link ends (for job checkpoints): what it sends on each way, and one state
// per slice of what it receives.
struct BoundaryStreams {
  compress::StreamState fwd_tx{Role::kActivation}, bwd_tx{Role::kActivationGrad};
  std::vector<compress::StreamState> fwd_rx, bwd_rx;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(fwd_tx, bwd_tx, fwd_rx, bwd_rx);
  }
};

class PipelineBoundary {
 public:
  PipelineBoundary() = default;
  // `stage` of `rank` in `topology`; prev/next are its pipeline neighbours (none at the ends).
  PipelineBoundary(const Topology& topology, int rank, int stage, DataPlane& plane, CodecSchedule& codecs,
                   std::chrono::milliseconds receive_timeout);

  const std::optional<int>& prev() const { return prev_; }
  const std::optional<int>& next() const { return next_; }

  // Posts every receive of `step` (activations from prev, gradients from next, and with tp > 1 the slices the
  // other shards relay) for `microbatches` microbatches of `rows` tokens, so packets land while the stage
  // computes; `raw_bytes` a whole tensor for the meter. The receives of the step before stay posted (the async
  // schedule runs two steps at once); older ones are dropped.
  void post_receives(int64_t step, int microbatches, int64_t rows, uint64_t raw_bytes);
  // Waits for microbatch `mb`'s activation (gradient) of `step` and decodes it, checking the wire shape.
  Result<Tensor> take_activation(int64_t step, int mb, const Shape& wire_shape, Device device);
  Result<Tensor> take_activation_grad(int64_t step, int mb, const Shape& wire_shape, Device device);
  // The posted receive of microbatch `mb`'s activation (gradient), to test or wait on without taking it (the eager
  // schedule's choice of what to run next); an empty Transfer at the pipeline's ends.
  Transfer pending_activation(int64_t step, int mb) const;
  Transfer pending_activation_grad(int64_t step, int mb) const;
  // Encodes `payload` with the link's codec at `step` and sends it without waiting; `raw_bytes` is
  // what the fp32 tensor it stands for would cost (the meter's raw count).
  Status send_activation(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes);
  Status send_activation_grad(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes);
  // Waits for every send posted so far; the first failure names its peer.
  Status wait_sends(int64_t step);
  // Forgets the sends that are done, without waiting for the others; the first failure among them names its peer.
  Status reap_sends();

  // Its stream states, for a checkpoint; check_streams says whether saved ones fit this boundary (one receive
  // state per tp slice), set_streams puts them in place (between steps).
  BoundaryStreams streams() const { return {fwd_tx_, bwd_tx_, fwd_rx_, bwd_rx_}; }
  Status check_streams(const BoundaryStreams& saved) const;
  void set_streams(BoundaryStreams saved);

  // The chain in force on the link this stage sends on in `dir` at `step`.
  const compress::CodecChain& chain_for(LinkDir dir, int64_t step);
  // The codec spec of a metered link at `step` ("" for traffic that is not act/act_grad on a link).
  std::string spec_of(const LinkTraffic& t, int64_t step) const;

 private:
  Result<Tensor> take(Transfer& t, const char* what, int mb, int peer, compress::StreamState& st,
                      const Shape& wire_shape, Device device);
  // tp > 1: this shard's slice from `own` (relayed to the other shards), the others' from `relayed`, decoded with
  // `states` (one per slice) into one [B, T, W] tensor.
  Result<Tensor> take_slices(int64_t step, Transfer& own, std::vector<Transfer>& relayed, Role role, const char* what,
                             int mb, int peer, std::vector<compress::StreamState>& states, const Shape& wire_shape,
                             Device device);
  Status send_slice(int peer, Role role, int64_t step, int mb, LinkDir dir, const Tensor& payload, uint64_t raw_bytes,
                    compress::StreamState& st);
  int64_t bound(int t) const { return rows_ * t / int64_t(tp_peers_.size()); }
  // The meter's raw bytes of slice t, its share of a whole tensor's `whole` (all of it without tp).
  uint64_t slice_raw(uint64_t whole, int t) const {
    return sliced() ? uint64_t(double(whole) * (bound(t + 1) - bound(t)) / rows_) : whole;
  }
  bool sliced() const { return tp_peers_.size() > 1; }

  const Topology* topology_ = nullptr;
  int stage_ = 0;
  std::optional<int> prev_, next_;
  DataPlane* plane_ = nullptr;
  CodecSchedule* codecs_ = nullptr;
  std::chrono::milliseconds receive_timeout_{std::chrono::minutes(10)};

  // One step's posted receives; with tp > 1 also, per microbatch, the slices relayed by each of the other shards.
  struct StepReceives {
    std::vector<Transfer> act, grad;
    std::vector<std::vector<Transfer>> act_relay, grad_relay;
  };
  StepReceives& receives(int64_t step, int mb);  // asserts they were posted
  std::map<int64_t, StepReceives> rx_;
  std::vector<Transfer> sends_;
  // tp > 1: this stage replica's shards (rank per shard index) and this one's index; the token count of the
  // posted receives.
  std::vector<int> tp_peers_;
  int shard_ = 0;
  int64_t rows_ = 0;
  uint64_t raw_ = 0;
  // Stream state of each link end this stage holds, and parsed chains by spec.
  // Receiving ends: one state per slice (a single one without tp).
  compress::StreamState fwd_tx_{Role::kActivation}, bwd_tx_{Role::kActivationGrad};
  std::vector<compress::StreamState> fwd_rx_, bwd_rx_;
  std::map<std::string, compress::CodecChain> chains_;
};

}  // namespace lh
