// defines: simulate_pipeline — a discrete-event simulation of every stage executing its
// PipelineSchedule list with blocking receives and non-blocking sends over serialised links; it
// finds deadlocks and predicts step time and bubble fraction. Used by tests, `ctl status` and bench.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/pipeline_schedule.h"

namespace lh {

// Costs in any time unit. A link carries one message at a time per direction: a message waits for
// the wire, occupies it for `transfer`, then arrives `latency` later. Posting a send costs nothing.
struct PipelineCosts {
  double forward = 1.0;   // one microbatch through one stage
  double backward = 1.0;
  double transfer = 0.0;  // activation or gradient message on the wire
  double latency = 0.0;   // one-way delay
  double optimizer = 0.0;
};

struct PipelineSimResult {
  double makespan = 0;                // when the last stage finished its list
  std::vector<double> finish;         // per stage
  std::vector<double> busy;           // per stage: time spent in forward and backward
  std::vector<int> max_in_flight;     // per stage: most microbatches forwarded, not yet backwarded
  double bubble_fraction = 0;         // 1 − Σ busy / (S · makespan)
};

// Runs every stage's list to the end. Receives block until the matching send has been posted and
// the message has crossed the link; sends never block. If no stage can move while some have not
// finished, returns an Internal error naming each stuck stage and the action it waits at.
Result<PipelineSimResult> simulate_pipeline(const PipelineSchedule& schedule, const PipelineCosts& costs = {});

}  // namespace lh
