// defines: the planner behind `longhaul plan` — a cost model of one training step of a GPT job on a Cluster
// (compute from FLOPs and each worker's GFLOP/s, pipeline transfers from codec packet sizes and link bandwidth and
// latency through the discrete-event simulator of grid/pipeline_sim.h, tp partial sums, the dp all-reduce, the
// gradient norm's round and the optimizer), evaluate_plan() for one given job, and search_plans() over pp × tp × dp,
// placement, partition, microbatches, schedule and a codec per pipeline link. Used by `longhaul plan`,
// `longhaul bench plan` and the tests.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/trainer.h"
#include "grid/partition.h"
#include "grid/pipeline_schedule.h"
#include "plan/cluster.h"
#include "plan/job_config.h"

namespace lh {

// What one plan puts where, and what the model predicts for it.
struct JobPlan {
  int pp = 1, tp = 1, dp = 1;
  std::vector<int> worker_of_rank;  // cluster worker index of each rank
  std::vector<int> partition;       // blocks per stage
  int microbatches = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  std::vector<std::string> fwd_codec, bwd_codec;  // per pipeline link s → s+1
  std::string grad_codec = "none", tp_codec = "none";

  // Predictions, seconds per training step unless named otherwise.
  double step_s = 0;
  double pipeline_s = 0;    // the simulated forward/backward schedule, transfers included
  double dp_exposed_s = 0;  // the part of the replicas' all-reduce not hidden under the last backward
  double norm_s = 0;        // the gradient norm's exchange among a replica's workers
  double optimizer_s = 0;
  double bubble = 0;  // of the simulated schedule
  double tokens_per_s = 0;
  double wire_bytes = 0;                                  // every worker's sends in one step (pipeline, tp, dp)
  double memory_gb = 0;                                   // the most any worker needs
  std::vector<double> stage_forward_s, stage_backward_s;  // per microbatch, tp collectives included
  std::vector<double> fwd_transfer_s, bwd_transfer_s;     // per microbatch and pipeline link
  std::string bottleneck;  // "stage 2 compute", "link 1-2 fwd", "dp all-reduce of stage 0", …

  // "pp 4 · tp 1 · dp 1, partition 3,3,2,2, 8 microbatches (1f1b), codecs 0-1 none/none 1-2 int8/int8 …"
  std::string describe() const;
};

struct PlanOptions {
  // The codecs a pipeline link may use, least lossy first: each link gets the first whose predicted step time is
  // within `codec_tolerance` of the step with the last (lossiest) one there.
  std::vector<std::string> ladder = {"none", "bf16", "int8", "int4"};
  double codec_tolerance = 0.02;
  std::vector<ScheduleKind> schedules = {ScheduleKind::k1F1B, ScheduleKind::kGPipe, ScheduleKind::kEager};
  int max_pp = 0, max_tp = 0, max_dp = 0;  // 0: no limit beyond the model and the cluster
  std::string grad_codec = "none", tp_codec = "none";
  int top = 5;
  // Microbatches tried per grid: every divisor of the per-replica batch up to this many.
  int max_microbatches = 64;
};

// The step of `job` (its grid, partition — "auto" planned as plan_partition() does —, microbatches, schedule, codecs,
// `--link` rules and `--slowdown` applied on top of the cluster as the emulation does: a rule's rate caps a link, its
// delay adds to the link's latency) with rank r on cluster worker r. "auto" codecs are predicted as auto settles: per
// link, the least lossy of the ladder whose predicted step is within --auto-tolerance of the fastest codec's there.
Result<JobPlan> evaluate_plan(const Cluster& cluster, const JobConfig& job);

// `--partition auto`: the partition of `job` (its own partition ignored) on `cluster`, rank r on worker r, from the
// split in proportion to each stage's slowest worker (its GFLOP/s over any --slowdown), then single blocks moved
// across a boundary while the predicted step — compute, the links with the job's --link rules, codecs, schedule —
// gets shorter. As "3,3,2".
Result<std::string> plan_partition(const Cluster& cluster, const JobConfig& job);

// The `options.top` fastest plans for the model and global batch of `train` on `cluster`, fastest first; an error
// names why nothing fits (too few workers, memory, batch).
Result<std::vector<JobPlan>> search_plans(const Cluster& cluster, const TrainConfig& train, const PlanOptions& options);

// The forward and backward FLOPs each rank of `job` computes per training step, as the model counts them (what
// `longhaul probe` divides by a worker's measured compute seconds to get its GFLOP/s).
Result<std::vector<double>> train_flops_per_step(const JobConfig& job);

// The parameters one worker of `stage` holds (its tp shard's share), as the planner counts them.
Result<double> stage_parameters(const JobConfig& job, int stage);

// The `longhaul launch` command line that runs `plan` with `train`'s model and training flags, and the map of ranks
// to the cluster's workers for a job started by hand (`longhaul worker --rank R` on each machine).
std::string launch_command(const JobPlan& plan, const TrainConfig& train);
std::string placement_table(const JobPlan& plan, const Cluster& cluster);

}  // namespace lh
