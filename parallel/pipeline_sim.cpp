// Discrete-event simulation of a PipelineSchedule: deadlock detection, step time, bubble fraction.
// Used by tests, `ctl status` and bench.
#include "parallel/pipeline_sim.h"

#include <algorithm>

namespace lh {

Result<PipelineSimResult> simulate_pipeline(const PipelineSchedule& schedule, const PipelineCosts& costs) {
  const int S = schedule.stages(), M = schedule.microbatches();
  constexpr double kNever = -1;  // message not sent yet
  // act_arrival[s][mb]: when mb's activation reaches stage s; grad_arrival[s][mb]: its gradient.
  std::vector<std::vector<double>> act_arrival(S, std::vector<double>(M, kNever));
  std::vector<std::vector<double>> grad_arrival(S, std::vector<double>(M, kNever));
  // Wire free times of link s→s+1 forward and s+1→s backward.
  std::vector<double> fwd_wire_free(S, 0), bwd_wire_free(S, 0);
  std::vector<double> clock(S, 0);
  std::vector<size_t> pc(S, 0);
  PipelineSimResult r;
  r.finish.assign(S, 0);
  r.busy.assign(S, 0);
  r.max_in_flight.assign(S, 0);
  std::vector<int> live(S, 0);

  auto send = [&](double now, double& wire_free) {
    const double start = std::max(now, wire_free);
    wire_free = start + costs.transfer;
    return wire_free + costs.latency;
  };

  // Each stage runs until it blocks; sweeping until nothing moves is enough because a stage's
  // times depend only on messages already posted, never on the order stages are visited.
  bool moved = true;
  while (moved) {
    moved = false;
    for (int s = 0; s < S; ++s) {
      const auto& list = schedule.actions(s);
      while (pc[s] < list.size()) {
        const Action& a = list[pc[s]];
        double& t = clock[s];
        if (a.kind == ActionKind::kRecvAct) {
          if (act_arrival[s][a.microbatch] == kNever) break;
          t = std::max(t, act_arrival[s][a.microbatch]);
        } else if (a.kind == ActionKind::kRecvGrad) {
          if (grad_arrival[s][a.microbatch] == kNever) break;
          t = std::max(t, grad_arrival[s][a.microbatch]);
        } else if (a.kind == ActionKind::kSendAct) {
          act_arrival[s + 1][a.microbatch] = send(t, fwd_wire_free[s]);
        } else if (a.kind == ActionKind::kSendGrad) {
          grad_arrival[s - 1][a.microbatch] = send(t, bwd_wire_free[s - 1]);
        } else if (a.kind == ActionKind::kForward) {
          t += costs.forward;
          r.busy[s] += costs.forward;
          r.max_in_flight[s] = std::max(r.max_in_flight[s], ++live[s]);
        } else if (a.kind == ActionKind::kBackward) {
          t += costs.backward;
          r.busy[s] += costs.backward;
          --live[s];
        } else {
          t += costs.optimizer;
        }
        ++pc[s];
        moved = true;
      }
    }
  }

  std::string stuck;
  for (int s = 0; s < S; ++s)
    if (pc[s] < schedule.actions(s).size())
      stuck += (stuck.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) + " waits at " +
               schedule.actions(s)[pc[s]].to_string() + " (action " + std::to_string(pc[s]) + ")";
  if (!stuck.empty())
    return internal_error(std::string("pipeline schedule ") + schedule_kind_name(schedule.kind()) + " deadlocks: " + stuck);

  double total_busy = 0;
  for (int s = 0; s < S; ++s) {
    r.finish[s] = clock[s];
    r.makespan = std::max(r.makespan, clock[s]);
    total_busy += r.busy[s];
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - total_busy / (S * r.makespan) : 0.0;
  return r;
}

}  // namespace lh
