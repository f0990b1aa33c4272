// defines: simulate_pipeline — a discrete-event simulation of every stage executing its
// PipelineSchedule list with blocking receives and non-blocking sends over serialised links; it
// finds deadlocks and predicts step time and bubble fraction. Used by tests, `ctl status` and bench.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "grid/pipeline_schedule.h"

namespace lh {

// Costs in any time unit. A link carries one message at a time per direction: a message waits for
// the wire, occupies it for `transfer`, then arrives `latency` later. Posting a send costs nothing.
// The scalars hold for every stage and link; the per-stage and per-link vectors (when not empty: S entries for
// stages, S − 1 for links, link s joining stage s and s + 1) override them — uneven machines and links.
struct PipelineCosts {
  double forward = 1.0;  // one microbatch through one stage
  double backward = 1.0;
  double transfer = 0.0;  // activation or gradient message on the wire
  double latency = 0.0;   // one-way delay
  double optimizer = 0.0;
  std::vector<double> stage_forward, stage_backward;
  std::vector<double> fwd_transfer, bwd_transfer;  // activation s→s+1; gradient s+1→s
  std::vector<double> fwd_latency, bwd_latency;
  double forward_of(int s) const { return stage_forward.empty() ? forward : stage_forward.at(size_t(s)); }
  double backward_of(int s) const { return stage_backward.empty() ? backward : stage_backward.at(size_t(s)); }
  double fwd_transfer_of(int link) const { return fwd_transfer.empty() ? transfer : fwd_transfer.at(size_t(link)); }
  double bwd_transfer_of(int link) const { return bwd_transfer.empty() ? transfer : bwd_transfer.at(size_t(link)); }
  double fwd_latency_of(int link) const { return fwd_latency.empty() ? latency : fwd_latency.at(size_t(link)); }
  double bwd_latency_of(int link) const { return bwd_latency.empty() ? latency : bwd_latency.at(size_t(link)); }
  // The vectors' sizes against S stages; an error names the field.
  Status check(int stages) const;
};

struct PipelineSimResult {
  double makespan = 0;  // when the last stage finished
  // Per stage: when its list is done and its last send has arrived (a stage runner waits for its sends before it
  // ends the step: their buffers are in use until then).
  std::vector<double> finish;
  std::vector<double> busy;        // per stage: time spent in forward and backward
  std::vector<int> max_in_flight;  // per stage: most microbatches forwarded, not yet backwarded
  double bubble_fraction = 0;      // 1 − Σ busy / (S · makespan)
};

// Runs every stage's list to the end. Receives block until the matching send has been posted and
// the message has crossed the link; sends never block. If no stage can move while some have not
// finished, returns an Internal error naming each stuck stage and the action it waits at.
// An eager schedule (ScheduleKind::kEager) is simulated by its policy, not by its nominal lists: see simulate_eager.
Result<PipelineSimResult> simulate_pipeline(const PipelineSchedule& schedule, const PipelineCosts& costs = {});

struct EagerSimResult {
  PipelineSimResult result;
  std::vector<std::vector<Action>> lists;  // what each stage ran, in order (PipelineSchedule::from_lists accepts them)
};
// The eager policy in time: whenever a stage is idle it runs the backward of its oldest forwarded microbatch if that
// microbatch's gradient has arrived (the last stage: at once), else the forward of its next microbatch if the input
// has arrived (stage 0: at once) and fewer than `max_in_flight` microbatches are forwarded but not backwarded, else it
// waits for whichever comes first. Forwards and backwards each run in microbatch order, so the weight gradients add
// up in the same order as GPipe's and 1F1B's. Sends post when the compute ends.
Result<EagerSimResult> simulate_eager(int stages, int microbatches, int max_in_flight, const PipelineCosts& costs = {});

}  // namespace lh
