// Discrete-event simulation of a PipelineSchedule: deadlock detection, step time, bubble fraction.
// Used by tests, `ctl status` and bench.
#include "grid/pipeline_sim.h"

#include <algorithm>
#include <set>
#include <string>

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

namespace {

// The makespan (the last stage's finish) and the share of it the stages sat idle, from each stage's finish and busy
// time.
void set_makespan(PipelineSimResult& r) {
  const int S = static_cast<int>(r.finish.size());
  double total_busy = 0;
  for (int s = 0; s < S; ++s) {
    r.makespan = std::max(r.makespan, r.finish[s]);
    total_busy += r.busy[s];
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - total_busy / (S * r.makespan) : 0.0;
}

}  // namespace

Result<PipelineSimResult> simulate_pipeline(const PipelineSchedule& schedule, const PipelineCosts& costs) {
  const int S = schedule.stages(), M = schedule.microbatches();
  if (schedule.kind() == ScheduleKind::kEager || is_async(schedule.kind())) {  // one step of either
    LH_ASSIGN_OR_RETURN(EagerSimResult eager, simulate_eager(S, M, M, costs));
    return eager.result;
  }
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
    return internal_error(std::string("pipeline schedule ") + schedule_kind_name(schedule.kind()) +
                          " deadlocks: " + stuck);

  for (int s = 0; s < S; ++s) r.finish[s] = std::max(clock[s], sends_done[s]);
  set_makespan(r);
  return r;
}

Result<EagerSimResult> simulate_eager(int stages, int microbatches, int max_in_flight, const PipelineCosts& costs) {
  const int S = stages, M = microbatches;
  if (S < 1 || M < 1 || max_in_flight < 1)
    return invalid_argument("eager simulation: stages, microbatches and the in-flight limit must be at least 1");
  LH_RETURN_IF_ERROR(costs.check(S));
  constexpr double kNever = -1, kIdle = -1;
  std::vector<std::vector<double>> act_arrival(S, std::vector<double>(M, kNever));
  std::vector<std::vector<double>> grad_arrival(S, std::vector<double>(M, kNever));
  std::vector<double> fwd_wire_free(S, 0), bwd_wire_free(S, 0), sends_done(S, 0), busy_until(S, kIdle);
  std::vector<int> next_f(S, 0), next_b(S, 0);
  std::vector<bool> running_backward(S, false);
  std::multiset<double> events{0.0};
  EagerSimResult out;
  out.lists.assign(S, {});
  PipelineSimResult& r = out.result;
  r.finish.assign(S, 0);
  r.busy.assign(S, 0);
  r.max_in_flight.assign(S, 0);
  auto send = [&](double now, double& wire_free, double transfer, double latency) {
    const double start = std::max(now, wire_free);
    wire_free = start + transfer;
    return wire_free + latency;
  };
  auto arrived = [](double at, double now) { return at != kNever && at <= now; };
  int finished = 0;
  double now = 0;
  while (finished < S) {
    // Compute that ends now posts its send.
    for (int s = 0; s < S; ++s) {
      if (busy_until[s] == kIdle || busy_until[s] > now) continue;
      busy_until[s] = kIdle;
      auto& list = out.lists[s];
      if (!running_backward[s]) {
        const int mb = next_f[s]++;
        if (s < S - 1) {
          list.push_back(send_act(mb));
          act_arrival[s + 1][mb] = send(now, fwd_wire_free[s], costs.fwd_transfer_of(s), costs.fwd_latency_of(s));
          sends_done[s] = std::max(sends_done[s], act_arrival[s + 1][mb]);
          events.insert(act_arrival[s + 1][mb]);
        }
      } else {
        const int mb = next_b[s]++;
        if (s > 0) {
          list.push_back(send_grad(mb));
          grad_arrival[s - 1][mb] =
              send(now, bwd_wire_free[s - 1], costs.bwd_transfer_of(s - 1), costs.bwd_latency_of(s - 1));
          sends_done[s] = std::max(sends_done[s], grad_arrival[s - 1][mb]);
          events.insert(grad_arrival[s - 1][mb]);
        }
        if (next_b[s] == M) {
          list.push_back(optimizer_step());
          r.finish[s] = std::max(now, sends_done[s]);
          ++finished;
        }
      }
    }
    // Idle stages start what is ready, a backward first.
    for (int s = 0; s < S; ++s) {
      if (busy_until[s] != kIdle || next_b[s] == M) continue;
      auto& list = out.lists[s];
      const bool b_ready = next_b[s] < next_f[s] && (s == S - 1 || arrived(grad_arrival[s][next_b[s]], now));
      const bool f_ready =
          next_f[s] < M && next_f[s] - next_b[s] < max_in_flight && (s == 0 || arrived(act_arrival[s][next_f[s]], now));
      if (b_ready) {
        if (s < S - 1) list.push_back(recv_grad(next_b[s]));
        list.push_back(backward(next_b[s]));
        running_backward[s] = true;
        busy_until[s] = now + costs.backward_of(s);
        r.busy[s] += costs.backward_of(s);
      } else if (f_ready) {
        if (s > 0) list.push_back(recv_act(next_f[s]));
        list.push_back(forward(next_f[s]));
        running_backward[s] = false;
        busy_until[s] = now + costs.forward_of(s);
        r.busy[s] += costs.forward_of(s);
        r.max_in_flight[s] = std::max(r.max_in_flight[s], next_f[s] + 1 - next_b[s]);
      } else {
        continue;
      }
      events.insert(busy_until[s]);
    }
    if (finished == S) break;
    while (!events.empty() && *events.begin() <= now) events.erase(events.begin());
    if (events.empty()) {
      std::string stuck;
      for (int s = 0; s < S; ++s)
        if (next_b[s] < M)
          stuck += (stuck.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) + " at F" +
                   std::to_string(next_f[s]) + "/B" + std::to_string(next_b[s]);
      return internal_error("eager pipeline deadlocks: " + stuck);
    }
    now = *events.begin();
  }
  set_makespan(r);
  return out;
}

}  // namespace lh
