// defines: lh::DpReducer — averages one stage shard's weight gradients across its data-parallel replicas:
// one all-reduce per parameter group (bucket), started the moment backward has finished that group so the
// exchange overlaps the rest of backward, compressed with the job's --compress-grad codec (role grad).
// Used by StageRunner when dp > 1.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/gpt.h"
#include "parallel/process_group.h"
#include "parallel/topology.h"

namespace lh {

// Refuses gradient codecs whose decoding needs per-sample memories or a matrix shape (delta, subspace,
// lowrank): buckets are flat vectors and every replica must decode the same bytes to the same values.
Status check_grad_codec_spec(const std::string& spec);

class DpReducer {
 public:
  // The dp group of `rank` (same stage and tensor shard, every replica, in replica order).
  static Result<std::unique_ptr<DpReducer>> create(DataPlane& plane, const Topology& topology, int rank,
                                                   std::string spec, std::chrono::milliseconds timeout);

  // A new step: every bucket of the last one must have been finished.
  Status begin_step(int64_t step);
  // Backward has produced the final gradient of `group` for this step: start averaging it. `bucket` is a
  // stable id for the group (its codec stream states, e.g. error feedback, follow it from step to step).
  Status bucket_ready(ParamGroup& group, int bucket);
  // Lets arrived packets move on (call between pieces of compute); never blocks.
  Status poll() { return group_->poll(); }
  // Waits for every started bucket: afterwards each replica holds the same averaged gradients.
  Status finish();

  const std::string& spec() const { return spec_; }
  ProcessGroup& group() { return *group_; }

 private:
  DpReducer() = default;
  std::unique_ptr<ProcessGroup> group_;
  std::string spec_;
};

}  // namespace lh
