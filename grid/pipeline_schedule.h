// defines: lh::PipelineSchedule — GPipe and 1F1B as per-stage ordered lists of actions (forward,
// backward, send/receive of activations and gradients, optimizer step) for S stages and M
// microbatches, with a validator. Used by StageRunner, the planner, `ctl status` and the simulator.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

enum class ActionKind {
  kForward,        // run this stage's slice forward on microbatch mb
  kBackward,       // run it backward on mb (accumulating weight gradients)
  kSendAct,        // post the non-blocking send of mb's output activation to stage + 1
  kRecvAct,        // wait until mb's input activation from stage − 1 has arrived
  kSendGrad,       // post the non-blocking send of mb's input gradient to stage − 1
  kRecvGrad,       // wait until mb's output gradient from stage + 1 has arrived
  kOptimizerStep,  // once per global batch, after every backward
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = -1;  // −1 for kOptimizerStep
  bool operator==(const Action& o) const { return kind == o.kind && microbatch == o.microbatch; }
  std::string to_string() const;  // "F3", "B3", "SA3", "RA3", "SG3", "RG3", "OPT"
};

inline Action forward(int mb) {
  return {ActionKind::kForward, mb};
}
inline Action backward(int mb) {
  return {ActionKind::kBackward, mb};
}
inline Action send_act(int mb) {
  return {ActionKind::kSendAct, mb};
}
inline Action recv_act(int mb) {
  return {ActionKind::kRecvAct, mb};
}
inline Action send_grad(int mb) {
  return {ActionKind::kSendGrad, mb};
}
inline Action recv_grad(int mb) {
  return {ActionKind::kRecvGrad, mb};
}
inline Action optimizer_step() {
  return {ActionKind::kOptimizerStep, -1};
}

enum class ScheduleKind { kGPipe, k1F1B, kEager, kAsync, kAsyncPredict };
// "gpipe" | "1f1b" | "eager" | "async" | "async:predict"; an unknown name is an error listing them.
inline bool is_async(ScheduleKind k) {
  return k == ScheduleKind::kAsync || k == ScheduleKind::kAsyncPredict;
}
Result<ScheduleKind> parse_schedule_kind(const std::string& text);
const char* schedule_kind_name(ScheduleKind kind);

class PipelineSchedule {
 public:
  // GPipe: every forward, then every backward, in microbatch order; keeps all M activations.
  // 1F1B (PipeDream-flush): stage s runs min(S − s − 1, M) warm-up forwards, then alternates one
  // forward and one backward, then drains; at most S − s microbatches are in flight on stage s.
  // Eager: no fixed order. Each stage runs whatever is ready, the backward of its oldest forwarded microbatch first,
  // else its next forward (simulate_eager in pipeline_sim.h; StageRunner runs the same policy on what has arrived).
  // Over slow links it keeps sending while gradients are on the wire, like GPipe, and starts backwards as soon as
  // their gradients land, like 1F1B; it keeps up to M activations like GPipe. Its lists here are the order under
  // nominal costs (backward twice a forward, free links), for describe() and max_in_flight().
  // Async: eager's policy over two steps at once, PipeDream-2BW style. Step t's forwards start while step t − 1's
  // backwards are still coming back, and step t computes with the weights of update t − 2 (one step staler than the
  // synchronous schedules: g_t = ∇L(W_{t−2}), W_t = AdamW(W_{t−1}, g_t)). Its lists here are eager's for one step.
  // Async:predict computes step t at W_{t−2} + (W_{t−2} − W_{t−3}) instead: the update still in flight guessed as the
  // last one (weight prediction, as SpecTrain does), which takes back much of the staleness's loss.
  static Result<PipelineSchedule> build(ScheduleKind kind, int stages, int microbatches);
  // Hand-made lists (tests, experiments), accepted only if validate() passes.
  static Result<PipelineSchedule> from_lists(ScheduleKind kind, int microbatches,
                                             std::vector<std::vector<Action>> lists);

  ScheduleKind kind() const { return kind_; }
  int stages() const { return static_cast<int>(lists_.size()); }
  int microbatches() const { return microbatches_; }
  const std::vector<Action>& actions(int stage) const;

  // Checks, naming the stage and action that breaks a rule:
  //  - microbatch numbers in 0..M−1; every F and B of every microbatch exactly once per stage;
  //  - RecvAct/SendAct only where there is a previous/next stage, each exactly once per microbatch
  //    there, and absent elsewhere; likewise RecvGrad/SendGrad;
  //  - order within a stage: RecvAct(m) < F(m) < SendAct(m); F(m) < B(m); RecvGrad(m) < B(m) < SendGrad(m);
  //    exactly one OptimizerStep, last;
  //  - stage s sends activations in the order stage s+1 receives them, and gradients likewise.
  // Deadlock freedom across stages is checked by simulate_pipeline (pipeline_sim.h).
  Status validate() const;

  // Most microbatches forwarded but not yet backwarded on a stage at any point of its list: the
  // number of activation sets it must keep alive.
  int max_in_flight(int stage) const;

  // A header line, then one line per stage ("  stage 1: RA0 F0 SA0 …") for logs and `ctl status`.
  std::string describe() const;

 private:
  PipelineSchedule(ScheduleKind kind, int microbatches, std::vector<std::vector<Action>> lists)
      : kind_(kind), microbatches_(microbatches), lists_(std::move(lists)) {}
  ScheduleKind kind_ = ScheduleKind::kGPipe;
  int microbatches_ = 0;
  std::vector<std::vector<Action>> lists_;
};

}  // namespace lh
