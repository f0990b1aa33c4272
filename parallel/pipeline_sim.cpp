// Discrete-event simulation of a PipelineSchedule: deadlock detection, step time, bubble fraction.
// Used by tests, `ctl status` and bench.
#include "parallel/pipeline_sim.h"

#include <algorithm>

namespace lh {

Status PipelineCosts::check(int stages) const {
  auto size_is = [](const std::vector<double>& v, int n, const char* name) -> Status {
    if (!v.empty() && int(v.size()) != n)
      return invalid_argument(std::string("pipeline costs: ") + name + " has " + std::to_string(v.size()) +
                              " entries, want " + std::to_string(n));
    for (double x : v)
      if (!(x >= 0)) return invalid_argument(std::string("pipeline costs: ") + name + " has a negative or NaN entry");
    return Status::Ok();
  };
  LH_RETURN_IF_ERROR(size_is(stage_forward, stages, "stage_forward"));
  LH_RETURN_IF_ERROR(size_is(stage_backward, stages, "stage_backward"));
  LH_RETURN_IF_ERROR(size_is(fwd_transfer, stages - 1, "fwd_transfer"));
  LH_RETURN_IF_ERROR(size_is(bwd_transfer, stages - 1, "bwd_transfer"));
  LH_RETURN_IF_ERROR(size_is(fwd_latency, stages - 1, "fwd_latency"));
  LH_RETURN_IF_ERROR(size_is(bwd_latency, stages - 1, "bwd_latency"));
  return Status::Ok();
}

Result<PipelineSimResult> simulate_pipeline(const PipelineSchedule& schedule, const PipelineCosts& costs) {
  const int S = schedule.stages(), M = schedule.microbatches();
  constexpr double kNever = -1;  // message not sent yet
  // act_arrival[s][mb]: when mb's activation reaches stage s; grad_arrival[s][mb]: its gradient.
  std::vector<std::vector<double>> act_arrival(S, std::vector<double>(M, kNever));
  std::vector<std::vector<double>> grad_arrival(S, std::vector<double>(M, kNever));
  // Wire free times of link s→s+1 forward and s+1→s backward.
  std::vector<double> fwd_wire_free(S, 0), bwd_wire_free(S, 0);
  std::vector<double> clock(S, 0), sends_done(S, 0);
  std::vector<size_t> pc(S, 0);
  PipelineSimResult r;
  r.finish.assign(S, 0);
  r.busy.assign(S, 0);
  r.max_in_flight.assign(S, 0);
  std::vector<int> live(S, 0);

  LH_RETURN_IF_ERROR(costs.check(S));
  auto send = [&](double now, double& wire_free, double transfer, double latency) {
    const double start = std::max(now, wire_free);
    wire_free = start + transfer;
    return wire_free + latency;
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
          act_arrival[s + 1][a.microbatch] =
              send(t, fwd_wire_free[s], costs.fwd_transfer_of(s), costs.fwd_latency_of(s));
          sends_done[s] = std::max(sends_done[s], act_arrival[s + 1][a.microbatch]);
        } else if (a.kind == ActionKind::kSendGrad) {
          grad_arrival[s - 1][a.microbatch] =
              send(t, bwd_wire_free[s - 1], costs.bwd_transfer_of(s - 1), costs.bwd_latency_of(s - 1));
          sends_done[s] = std::max(sends_done[s], grad_arrival[s - 1][a.microbatch]);
        } else if (a.kind == ActionKind::kForward) {
          t += costs.forward_of(s);
          r.busy[s] += costs.forward_of(s);
          r.max_in_flight[s] = std::max(r.max_in_flight[s], ++live[s]);
        } else if (a.kind == ActionKind::kBackward) {
          t += costs.backward_of(s);
          r.busy[s] += costs.backward_of(s);
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
    r.finish[s] = std::max(clock[s], sends_done[s]);
    r.makespan = std::max(r.makespan, r.finish[s]);
    total_busy += r.busy[s];
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - total_busy / (S * r.makespan) : 0.0;
  return r;
}

}  // namespace lh
