// defines: lh::StageRunner — one pipeline stage of a GPT training job: it holds the stage's blocks
// (plus embedding on the first stage, head and loss on the last), executes its PipelineSchedule
// list each step with codecs on every link and the DataPlane's non-blocking sends and receives,
// and takes the optimizer step with the gradient norm of the whole model. Used by `longhaul worker`.
// Its links live in PipelineBoundary, the norm in GradNormSource; evaluate() is in stage_runner_eval.cpp, the
// optimizer updates (and --sync delayed's) in stage_runner_update.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/dp_reducer.h"
#include "comm/grad_norm.h"
#include "comm/pipeline_boundary.h"
#include "compress/codec_chain.h"
#include "core/gpt.h"
#include "core/trainer.h"
#include "grid/codec_plan.h"
#include "grid/partition.h"
#include "grid/pipeline_schedule.h"
#include "grid/topology.h"
#include "grid/tp_split.h"
#include "metrics/step_metrics.h"
#include "metrics/step_trace.h"
#include "runtime/subspace_boundary.h"
#include "transport/data_plane.h"

namespace lh {

struct StageRunnerOptions {
  int microbatches = 4;  // the global batch (TrainConfig::batch) splits into this many equal parts
  ScheduleKind schedule = ScheduleKind::k1F1B;
  // The weight-gradient codec of the dp all-reduce (dp > 1): --compress-grad.
  std::string compress_grad = "none";
  // How replicas stay together (--sync): every-step gradient averaging, delayed averaging, or DiLoCo.
  SyncConfig sync;
  // The codec of the tp group's partial sums (tp > 1): --compress-tp.
  std::string compress_tp = "none";
  // Heads per tp shard (tp_heads / tp_heads_by_speed); empty: an even split.
  std::vector<int> tp_heads;
  // How long a stage waits for one activation, gradient or norm before giving up with an error
  // naming the peer. A dead peer is normally reported sooner by the control plane (fail_peer).
  std::chrono::milliseconds receive_timeout{std::chrono::minutes(10)};
  // An --elastic job that lost replicas (JobConfig::slices / slice_of): the global batch is cut into
  // `batch_slices` slices and this replica trains on slice `batch_slice`. 0 / −1: dp slices, the replica's own.
  int batch_slices = 0;
  int batch_slice = -1;
  // --dp-split (JobConfig::dp_rows): sequences of the global batch per replica, in replica order, each a
  // multiple of `microbatches`; replica d trains on its own run of them and weights its loss (so its gradients) by
  // rows[d] · dp / batch, so the replicas' average is the whole batch's. Empty: equal slices.
  std::vector<int> dp_rows;
  // --slowdown: forward and backward compute take this many times as long (the runner sleeps the difference after
  // each), as on a slower machine. 1: as fast as it is.
  double slowdown = 1;
};

struct StageStepResult {
  int64_t step = 0;
  std::optional<float> loss;  // last stage only: mean over this replica's slice (the job's: the replicas' mean)
  float grad_norm = 0;        // of the whole model, before clipping
  float lr = 0;
  double seconds = 0;
  int64_t tokens = 0;  // tokens in the global batch
};

class StageRunner {
 public:
  // Builds this rank's model part (the same weights the single-process model has for those groups:
  // every group is initialised from its own seeded stream) and its optimizer. With dp > 1 the rank is
  // replica d of its stage: it trains on sequences [d·batch/dp, (d+1)·batch/dp) of every global batch, in
  // `microbatches` microbatches, and averages its gradients with the other replicas (DpReducer) before
  // the optimizer step. With tp > 1 it holds shard t's heads of every block (options.tp_heads) and sums
  // partial results with its tp group (role tp, a direct all-reduce: every shard ends with the same bits).
  // Refuses a partition that does not match the model or topology, a split that does not fit the heads, and a
  // global batch that dp × microbatches does not divide.
  static Result<std::unique_ptr<StageRunner>> create(const TrainConfig& train, const Topology& topology,
                                                     const Partition& partition, int rank,
                                                     const StageRunnerOptions& options, DataPlane& plane,
                                                     CodecSchedule& codecs);

  // One optimizer step (1-based `step`, consecutive) on a global batch of train.batch sequences of
  // train.model.seq tokens: tokens and targets [batch · seq] as the single-process trainer draws
  // them (every worker draws the same batch from the same seed; each replica takes its slice; stage 0
  // reads the tokens, the last stage the targets, and with a subspace model every stage reads the tokens to rebuild
  // F[tok]). With train.model.subspace_k = K > 0 the links carry K coordinates per token each way instead of d_model
  // values (see SubspaceBoundary); the codecs then compress those. Marks the step begun in the codec schedule, so
  // set-codec changes for it must have been applied before.
  Result<StageStepResult> step(int64_t step, const int32_t* tokens, const int32_t* targets);

  // Validation loss after `step`, forward only, as Trainer::evaluate computes it (each replica takes its
  // slice of every batch; the replicas' means are averaged): the mean over `batches` batches of train.batch sequences
  // (tokens and targets hold batches · batch · seq each, the same on every worker). The last stage returns the loss,
  // the others nullopt. Its traffic is tagged and metered as role "other", with its own codec stream state, so training
  // streams and their stateful codecs are untouched; the forward codec of each link at `step` is used.
  Result<std::optional<float>> evaluate(int64_t step, const int32_t* tokens, const int32_t* targets, int batches);

  // Switches the replicas' gradient codec (--compress-grad grammar) from `from_step` on (ctl set-codec --role
  // grad); refused without a dp reducer, for a step already begun, or for a spec the reducer cannot use.
  Status schedule_grad_codec(const std::string& spec, int64_t from_step);
  // Switches the tp group's codec (any chain) from `from_step` on (ctl set-codec --role tp); refused
  // without tp, for a step already begun, or for a bad spec.
  Status schedule_tp_codec(const std::string& spec, int64_t from_step);

  // This worker's shard of a job checkpoint, between steps: parameters and AdamW moments, every codec stream state
  // (pipeline links, the replicas' reducer, the tp group), the codecs in force and scheduled, and `data_rng` (the
  // caller's sampler position). With --sync delayed it waits for the averages of the steps in flight to finish and
  // saves them (DpReducer::save_state) with the last update the weight prediction extrapolates; the job goes on
  // from a save with the same bits as without one. Portable binary (cereal).
  Result<std::string> save_state(const Rng& data_rng);
  // Restores a save_state of the same rank, grid and stage span into a runner that has not stepped; the next step
  // is the saved step + 1. Returns the data sampler's position. Bad or foreign bytes are an error naming what is
  // wrong, and nothing is changed.
  Result<Rng> load_state(const std::string& bytes);
  // The last step taken (or loaded).
  int64_t last_step() const { return last_.step; }

  // The metrics line of the last step: loss, tokens/s and every link's traffic since the previous
  // call (taken from the data plane's meter, which is reset), each annotated with its codec.
  WorkerStepMetrics take_step_metrics();

  const StageSpan& span() const { return span_; }
  const PipelineSchedule& schedule() const { return schedule_; }
  // The actions the last step ran, in order (for --schedule eager, the order it chose; else the schedule's list).
  const std::vector<Action>& last_actions() const { return executed_; }
  Gpt& model() { return model_; }
  int rank() const { return rank_; }

 private:
  StageRunner() = default;
  // The step's forwards and backwards: the schedule's list, or the eager policy (run_eager).
  Status run_schedule(int64_t step);
  Status run_eager(int64_t step);
  // --schedule async: two steps in flight. run_async runs step `step`'s forwards with the backwards and updates of
  // the steps before (their norms and learning rates go into `r`); finish_backwards keeps a step's gradients and sends
  // its part of the norm; async_update clips them and takes the AdamW step onto the newest weights; use_version puts
  // the weights after update `version` into the model (host copies of the versions still in use).
  Status run_async(int64_t step, StageStepResult* r);
  Status finish_backwards(int64_t step);
  Status async_update(int64_t step, StageStepResult* r);
  Status use_version(int64_t version);
  // The weights step `step` computes with: update step − 2's, or with async:predict that extrapolated one step
  // (kept under the key −step until the step's backwards are done).
  Status use_step_weights(int64_t step);
  Result<std::vector<std::vector<float>>> version_copy(int64_t version);
  // The buffers of microbatch `mb` of `step`: one set per step parity with the async schedule.
  int slot(int64_t step, int mb) const { return async_ ? int(step & 1) * options_.microbatches + mb : mb; }
  Status run_action(const Action& a, int64_t step);
  Status run_compute_action(
      const Action& a,
      int64_t step);  // run_action without --slowdown  // compute and the boundary's sends and receives
  Status backward(int64_t step, int mb);  // with dp, the last one hands each bucket to the reducer
  // Clips the gradients in the groups by the whole model's norm and takes the optimizer step with the learning
  // rate of `step` (the step the gradients are from); returns the norm before clipping.
  Result<float> apply_update(int64_t step);
  double local_grad_sq();  // this worker's part of the squared norm (tp-replicated parameters on shard 0 only)
  Result<float> clip_and_step(int64_t step, double total_sq);
  // Whether compute stops between blocks to let the reducer's averages move (--sync delayed: they run under it).
  bool polls_reducer() const { return reducer_ && options_.sync.delayed(); }
  // --sync delayed: the step's optimizer updates (the averages due, or every one in flight during the warmup and at
  // the last step), and the weight prediction around a step's compute.
  Status apply_delayed_updates(int64_t step, StageStepResult* r);
  Status predict_weights();
  Status restore_weights();
  // The mean over the dp group of a value every replica computed on its slice (the value itself for dp = 1).
  Result<double> replica_mean(double value);
  // The stable id of one of this stage's parameter groups for the reducer's codec streams: embedding 0,
  // block l 1 + l, head 1 + layers.
  int bucket_of(const ParamGroup& group);
  // The tp group's all-reduce of one block's partial result (the model's TpAllReduce).
  Status tp_all_reduce(Tensor& partial, int block, TpSite site);
  int link_width() const;  // values per token on a link: K with a subspace model, else d_model
  Shape wire_shape(int batch) const { return {batch, train_.model.seq, link_width()}; }

  TrainConfig train_;
  Topology topology_ = Topology::pipeline(1).value();
  StageRunnerOptions options_;
  PipelineSchedule schedule_ = PipelineSchedule::build(ScheduleKind::kGPipe, 1, 1).value();
  StageSpan span_;
  int rank_ = 0, stages_ = 1, mb_batch_ = 1;
  int replica_ = 0, replicas_ = 1;  // this rank's dp index, and dp
  int slice_ = 0, slices_ = 1;      // its slice of the global batch, and the slices (see StageRunnerOptions)
  int64_t row_offset_ = 0;          // the first sequence of the global batch this replica trains on
  float loss_weight_ = 1;           // --dp-split: its share × dp / batch
  int backwards_ = 0;               // backward actions run in this step
  DataPlane* plane_ = nullptr;
  CodecSchedule* codecs_ = nullptr;
  PipelineBoundary boundary_;
  std::unique_ptr<GradNormSource> grad_norm_;
  std::unique_ptr<DpReducer> reducer_;           // dp > 1
  std::map<int64_t, std::string> grad_changes_;  // from step → spec, not yet applied
  int shard_ = 0;                                // this rank's tp index
  std::unique_ptr<ProcessGroup> tp_group_;       // tp > 1
  std::string tp_spec_ = "none";
  std::map<int64_t, std::string> tp_changes_;  // from step → spec, not yet applied
  bool evaluating_ = false;                    // tp sums of evaluation use their own codec streams
  // --sync delayed with predict: the weights themselves while the step computes at predicted ones, and the change
  // the last optimizer update made, per parameter group (host copies: two more copies of the stage's weights).
  std::vector<std::vector<float>> real_params_, last_update_;
  bool predicted_ = false;
  Gpt model_;
  double compute_s_ = 0;  // forward and backward compute since the last take_step_metrics
  AdamW opt_;

  // Per microbatch, for the current step.
  std::vector<ActivationCache> caches_;
  std::vector<Tensor> inputs_, outputs_, grads_;
  std::optional<SubspaceBoundary> subspace_;
  std::vector<Tensor> tokens_dev_;  // per microbatch, on the model's device (subspace only)
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  double loss_sum_ = 0;

  std::vector<Action> executed_;  // the last step's actions, in the order run
  // --schedule async.
  bool async_ = false;
  int64_t b_step_ = 0;                                       // the oldest step with backwards left (0: none yet)
  int next_b_ = 0;                                           // its next backward
  std::map<int64_t, std::vector<std::vector<float>>> held_;  // gradients of steps awaiting their update, per group
  std::map<int64_t, double> held_sq_;                        // and this worker's part of their squared norm
  // Weights after update v (key v ≥ 0) while steps use them, and async:predict's for step t (key −t).
  std::map<int64_t, std::vector<std::vector<float>>> versions_;
  int64_t active_version_ = 0, newest_version_ = 0;  // in the model now; the newest
  StepTrace trace_;                                  // LH_TRACE=DIR: a timeline of every step
  StageStepResult last_;
  std::optional<float> last_val_loss_;
  ActivationCache eval_cache_;
};

}  // namespace lh
