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
#include "parallel/codec_plan.h"
#include "parallel/step_metrics.h"
#include "parallel/topology.h"
#include "transport/data_plane.h"

namespace lh {

class PipelineBoundary {
 public:
  PipelineBoundary() = default;
  // `stage` of `rank` in `topology`; prev/next are its pipeline neighbours (none at the ends).
  PipelineBoundary(const Topology& topology, int rank, int stage, DataPlane& plane, CodecSchedule& codecs,
                   std::chrono::milliseconds receive_timeout);

  const std::optional<int>& prev() const { return prev_; }
  const std::optional<int>& next() const { return next_; }

  // Posts every receive of `step` (activations from prev, gradients from next) for `microbatches`
  // microbatches, so packets land while the stage computes; `raw_bytes` each for the meter.
  void post_receives(int64_t step, int microbatches, uint64_t raw_bytes);
  // Waits for microbatch `mb`'s activation (gradient) and decodes it, checking the wire shape.
  Result<Tensor> take_activation(int mb, const Shape& wire_shape, Device device);
  Result<Tensor> take_activation_grad(int mb, const Shape& wire_shape, Device device);
  // Encodes `payload` with the link's codec at `step` and sends it without waiting; `raw_bytes` is
  // what the fp32 tensor it stands for would cost (the meter's raw count).
  Status send_activation(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes);
  Status send_activation_grad(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes);
  // Waits for every send of the step; the first failure names its peer.
  Status wait_sends(int64_t step);

  // The chain in force on the link this stage sends on in `dir` at `step`.
  const compress::CodecChain& chain_for(LinkDir dir, int64_t step);
  // The codec spec of a metered link at `step` ("" for traffic that is not act/act_grad on a link).
  std::string spec_of(const LinkTraffic& t, int64_t step) const;

 private:
  Result<Tensor> take(Transfer& t, const char* what, int mb, int peer, compress::StreamState& st,
                      const Shape& wire_shape, Device device);

  const Topology* topology_ = nullptr;
  int stage_ = 0;
  std::optional<int> prev_, next_;
  DataPlane* plane_ = nullptr;
  CodecSchedule* codecs_ = nullptr;
  std::chrono::milliseconds receive_timeout_{std::chrono::minutes(10)};

  std::vector<Transfer> act_rx_, grad_rx_, sends_;
  // Stream state of each link end this stage holds, and parsed chains by spec.
  compress::StreamState fwd_tx_{compress::Role::activation}, fwd_rx_{compress::Role::activation};
  compress::StreamState bwd_tx_{compress::Role::activation_grad}, bwd_rx_{compress::Role::activation_grad};
  std::map<std::string, compress::CodecChain> chains_;
};

}  // namespace lh
