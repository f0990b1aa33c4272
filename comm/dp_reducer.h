// defines: lh::DpReducer — averages one stage shard's weight gradients across its data-parallel replicas:
// one all-reduce per parameter group (bucket), started the moment backward has finished that group so the
// exchange overlaps the rest of backward, compressed with the job's --compress-grad codec (role grad).
// Used by StageRunner when dp > 1.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/powersgd.h"
#include "comm/process_group.h"
#include "comm/sync_config.h"
#include "core/gpt.h"
#include "grid/topology.h"

namespace lh {

// DiLoCo's outer step on one flat float32 vector of n parameters, in float32 as DpReducer::outer_step takes it:
// m := μ·m + Δ; θ_sync := θ_sync − lr·(Δ + μ·m) (Nesterov), with `avg_delta` the replicas' average of
// Δ = θ_sync − θ. The one definition of that update: the C++ jobs and longhaul.torch.DiLoCo both call it.
void diloco_outer_update(float* sync, float* momentum, const float* avg_delta, int64_t n, double lr, double mu);

class DpReducer {
 public:
  // The dp group of `rank` (same stage and tensor shard, every replica, in replica order).
  static Result<std::unique_ptr<DpReducer>> create(DataPlane& plane, const Topology& topology, int rank,
                                                   std::string spec, std::chrono::milliseconds timeout);

  // A new step: every bucket of the last one must have been finished (with --sync delayed, the last D steps'
  // may still be in flight).
  Status begin_step(int64_t step);
  // Backward has produced the final gradient of `group` for this step: start averaging it. `bucket` is a
  // stable id for the group (its codec stream states, e.g. error feedback, follow it from step to step).
  Status bucket_ready(ParamGroup& group, int bucket);
  // Lets arrived packets move on (call between pieces of compute); never blocks.
  Status poll() { return group_->poll(); }
  // Waits for every started bucket: afterwards each replica holds the same averaged gradients.
  Status finish();

  // --sync delayed (call before the first step): bucket_ready copies the gradients and averages the copy in the
  // background, a mesh all-reduce (bytes per pair link 2/dp of a bucket: the latency is hidden, bytes decide);
  // finish_step puts a finished step's averages back. Refuses PowerSGD, whose warm start and error feedback chain
  // each step on the one before.
  Status start_delayed(const SyncConfig& sync);
  // The steps whose gradients are being averaged, oldest first.
  std::vector<int64_t> steps_in_flight() const;
  // Waits for the oldest step in flight (it must be `step`) and writes its averaged gradients into the groups'
  // gradients, which the caller then hands to the optimizer.
  Status finish_step(int64_t step);

  // DiLoCo's outer step (call it after the inner optimizer step of every H-th step): averages the
  // pseudo-gradients Δ = θ_sync − θ of every group over the replicas (--compress-grad, one stream per
  // bucket), then m := μ·m + Δ; θ_sync := θ_sync − lr·(Δ + μ·m); θ := θ_sync on every replica.
  // `buckets[i]` is the stable id of groups[i]. The first call snapshots θ_sync lazily, so call
  // start_diloco() before the first inner step.
  Status start_diloco(const std::vector<ParamGroup*>& groups, const SyncConfig& sync);
  Status outer_step(const std::vector<ParamGroup*>& groups, const std::vector<int>& buckets);

  const std::string& spec() const { return spec_; }

  // Everything the reducer carries from step to step — the codec in force, every codec stream state (error
  // feedback residuals), PowerSGD's Q and error per bucket, DiLoCo's θ_sync and outer momentum, and with --sync
  // delayed the averages of the steps in flight — as bytes for a checkpoint (cereal, portable binary), and back.
  //
  // The steps in flight are drained, not applied: save_state waits until their all-reduces have finished (every
  // replica saves at the same step, so every one is waiting too) and saves the averages, which finish_step then
  // applies at the same later steps as before, on this reducer or on one that loaded the bytes. Waiting early
  // changes no result (an all-reduce's bits do not depend on when its packets arrive, and ops on one codec stream
  // run in order), so the job goes on after a save exactly as it would have without one. The alternative, saving
  // each replica's own gradients and starting their all-reduces again after a load, would need every codec
  // stream state rolled back to before those steps; the averages are what every replica holds alike.
  //
  // load_state goes before the first step of the resumed job. `buckets` maps each stable bucket id to this stage's
  // parameter group and `last_step` is the step the state was saved after: a step in flight must be one of the last
  // D steps up to it and hold an average for every bucket, each the size of its group. Bad bytes are an error
  // naming what is wrong, and leave the reducer as it was.
  Result<std::string> save_state();
  // `keep_streams` false: the collectives' codec streams (error-feedback residuals of the old group's chunks) start
  // afresh — an --elastic job whose group lost members.
  Status load_state(const std::string& bytes, const std::map<int, ParamGroup*>& buckets = {}, int64_t last_step = 0,
                    bool keep_streams = true);
  // Switches the codec (a --compress-grad spec) for the buckets started from now on; between steps only.
  Status set_spec(const std::string& spec);
  ProcessGroup& group() { return *group_; }

 private:
  DpReducer() = default;
  std::unique_ptr<ProcessGroup> group_;
  std::string spec_;
  SyncConfig sync_;
  // PowerSGD (--compress-grad powersgd:…): its state per bucket, and the buckets of this step in flight.
  struct PowerSgdStep {
    ParamGroup* group = nullptr;
    int bucket = 0;
    std::vector<float> grads;  // host copy of the group's gradient, written back at the end
    Tensor p, q, rest;
    int p_op = -1;
  };
  std::optional<PowerSgdConfig> powersgd_;
  std::map<int, std::unique_ptr<PowerSgdBucket>> powersgd_state_;
  std::vector<PowerSgdStep> powersgd_step_;
  std::map<int, std::pair<std::vector<float>, std::vector<float>>> powersgd_restore_;  // loaded, applied on first use
  Status powersgd_ready(ParamGroup& group, int bucket);
  // The options of one of a bucket's PowerSGD all-reduces: P (0), Q (1) or the uncompressed rest (2).
  CollectiveOptions powersgd_options(const PowerSgdBucket& state, int bucket, int part) const;
  Status powersgd_finish();
  std::vector<std::vector<float>> anchor_, momentum_;  // DiLoCo: θ_sync and the outer momentum, per group
  // --sync delayed: per step in flight, each bucket's copy of the gradients being averaged.
  struct InFlight {
    int64_t step = 0;
    struct Bucket {
      ParamGroup* group = nullptr;
      int bucket = 0;  // its stable id (bucket_ready's)
      Tensor grads;    // host copy, averaged in place
      int op = -1;     // -1 once the average is in `grads` (drained by save_state, or loaded)
    };
    std::vector<Bucket> buckets;
  };
  std::vector<InFlight> in_flight_;
};

}  // namespace lh
