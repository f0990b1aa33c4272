// defines: lh::GradNormSource — where a stage gets the whole model's squared gradient norm from its own part —
// and AllPairsGradNorm, today's exchange among the pipeline's stages. Used by StageRunner; the seam the
// all-reduce of docs/grid.md §4 (and issue 16's pipeline-carried norm) will plug into.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "core/status.h"
#include "grid/topology.h"
#include "transport/data_plane.h"

namespace lh {

class GradNormSource {
 public:
  virtual ~GradNormSource() = default;
  // The sum of squares over the whole model at `step`, given this worker's part. Every worker of the
  // model gets the same bits (the sum is taken in one order everywhere).
  virtual Result<double> total_sq(int64_t step, double local_sq) = 0;
  // The same in two halves, for a worker that computes while the parts travel (the async schedule): post() sends
  // this worker's part of `step`; pending() is a receive still in flight (an empty Transfer once every part is in);
  // collect() waits for the rest and sums. Steps are collected in the order they were posted.
  virtual Status post(int64_t step, double local_sq) = 0;
  virtual Transfer pending(int64_t step) const = 0;
  virtual Result<double> collect(int64_t step) = 0;
};

// Every worker sends its part to every other worker of its own model replica — all stages and tp shards of
// replica d — (role other, the step's norm slot) and sums all parts in rank order. With dp > 1 it runs after the
// dp reducer, when the replicas' gradients are equal, so every replica gets the same norm. With tp > 1 each
// shard's part counts its replicated parameters only on shard 0 (the caller's job), so they count once.
class AllPairsGradNorm : public GradNormSource {
 public:
  AllPairsGradNorm(const Topology& topology, int rank, DataPlane& plane, std::chrono::milliseconds receive_timeout);
  Result<double> total_sq(int64_t step, double local_sq) override;
  Status post(int64_t step, double local_sq) override;
  Transfer pending(int64_t step) const override;
  Result<double> collect(int64_t step) override;

  // Tag slot of the norm messages: above every microbatch and evaluation batch index.
  static constexpr uint16_t kSlot = 4095;

 private:
  std::vector<int> stage_ranks_;  // every rank of the replica, stage-major
  // The last call's sends: checked at the next call, so a worker does not wait for its part to land before it
  // updates (the peers wait for it; it does not).
  std::vector<Transfer> sent_;
  int64_t sent_step_ = 0;
  struct Posted {
    double local_sq = 0;
    std::vector<Transfer> in;  // per entry of stage_ranks_ (empty for this rank)
  };
  std::map<int64_t, Posted> posted_;
  int rank_ = 0;
  DataPlane* plane_ = nullptr;
  std::chrono::milliseconds receive_timeout_;
};

}  // namespace lh
