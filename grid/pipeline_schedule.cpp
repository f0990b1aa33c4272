// GPipe and 1F1B action lists per stage and their validation.
// Used by StageRunner, the planner, `ctl status` and the pipeline simulator.
#include "grid/pipeline_schedule.h"

#include <algorithm>

#include "grid/pipeline_sim.h"

namespace lh {

std::string Action::to_string() const {
  const char* tag = "?";
  switch (kind) {
    case ActionKind::kForward:
      tag = "F";
      break;
    case ActionKind::kBackward:
      tag = "B";
      break;
    case ActionKind::kSendAct:
      tag = "SA";
      break;
    case ActionKind::kRecvAct:
      tag = "RA";
      break;
    case ActionKind::kSendGrad:
      tag = "SG";
      break;
    case ActionKind::kRecvGrad:
      tag = "RG";
      break;
    case ActionKind::kOptimizerStep:
      return "OPT";
  }
  return tag + std::to_string(microbatch);
}

Result<ScheduleKind> parse_schedule_kind(const std::string& text) {
  if (text == "gpipe") return ScheduleKind::kGPipe;
  if (text == "1f1b") return ScheduleKind::k1F1B;
  if (text == "eager") return ScheduleKind::kEager;
  if (text == "async") return ScheduleKind::kAsync;
  if (text == "async:predict") return ScheduleKind::kAsyncPredict;
  return invalid_argument("schedule '" + text + "' is unknown; choose gpipe, 1f1b, eager, async or async:predict");
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kEager:
      return "eager";
    case ScheduleKind::kAsync:
      return "async";
    case ScheduleKind::kAsyncPredict:
      return "async:predict";
  }
  return "?";
}

namespace {

// The receive, compute and send of one microbatch's forward on stage s of S.
void append_forward(std::vector<Action>& list, int s, int S, int mb) {
  if (s > 0) list.push_back(recv_act(mb));
  list.push_back(forward(mb));
  if (s < S - 1) list.push_back(send_act(mb));
}

void append_backward(std::vector<Action>& list, int s, int S, int mb) {
  if (s < S - 1) list.push_back(recv_grad(mb));
  list.push_back(backward(mb));
  if (s > 0) list.push_back(send_grad(mb));
}

}  // namespace

Result<PipelineSchedule> PipelineSchedule::build(ScheduleKind kind, int stages, int microbatches) {
  if (stages < 1)
    return invalid_argument("pipeline schedule: stages must be at least 1, got " + std::to_string(stages));
  if (microbatches < 1)
    return invalid_argument("pipeline schedule: --microbatches must be at least 1, got " +
                            std::to_string(microbatches));
  if (kind == ScheduleKind::kEager || is_async(kind)) {
    PipelineCosts nominal;
    nominal.backward = 2;
    LH_ASSIGN_OR_RETURN(EagerSimResult eager, simulate_eager(stages, microbatches, microbatches, nominal));
    PipelineSchedule sched(kind, microbatches, std::move(eager.lists));
    LH_RETURN_IF_ERROR(sched.validate());
    return sched;
  }
  std::vector<std::vector<Action>> lists(stages);
  for (int s = 0; s < stages; ++s) {
    auto& list = lists[s];
    if (kind == ScheduleKind::kGPipe) {
      for (int mb = 0; mb < microbatches; ++mb) append_forward(list, s, stages, mb);
      for (int mb = 0; mb < microbatches; ++mb) append_backward(list, s, stages, mb);
    } else {
      const int warmup = std::min(stages - s - 1, microbatches);
      int next_f = 0, next_b = 0;
      for (; next_f < warmup; ++next_f) append_forward(list, s, stages, next_f);
      while (next_f < microbatches) {  // steady state: one forward, one backward
        append_forward(list, s, stages, next_f++);
        append_backward(list, s, stages, next_b++);
      }
      while (next_b < microbatches) append_backward(list, s, stages, next_b++);
    }
    list.push_back(optimizer_step());
  }
  PipelineSchedule sched(kind, microbatches, std::move(lists));
  LH_RETURN_IF_ERROR(sched.validate());  // a failure here is a bug in the builder, reported not hidden
  return sched;
}

Result<PipelineSchedule> PipelineSchedule::from_lists(ScheduleKind kind, int microbatches,
                                                      std::vector<std::vector<Action>> lists) {
  if (lists.empty()) return invalid_argument("pipeline schedule: no stages");
  if (microbatches < 1)
    return invalid_argument("pipeline schedule: microbatches must be at least 1, got " + std::to_string(microbatches));
  PipelineSchedule sched(kind, microbatches, std::move(lists));
  LH_RETURN_IF_ERROR(sched.validate());
  return sched;
}

const std::vector<Action>& PipelineSchedule::actions(int stage) const {
  LH_ASSERT(stage >= 0 && stage < stages(), "stage " + std::to_string(stage) + " outside the schedule");
  return lists_[stage];
}

Status PipelineSchedule::validate() const {
  const int S = stages(), M = microbatches_;
  constexpr int kKinds = 7;
  // For each stage: the sequence of microbatches sent/received per channel, to match neighbours.
  std::vector<std::vector<int>> act_sent(S), act_recv(S), grad_sent(S), grad_recv(S);
  for (int s = 0; s < S; ++s) {
    const auto& list = lists_[s];
    auto where = [&](size_t i) {
      return "pipeline schedule: stage " + std::to_string(s) + ", action " + std::to_string(i) + " (" +
             list[i].to_string() + ")";
    };
    // pos[kind][mb] = index in the list, or −1.
    std::vector<std::vector<long>> pos(kKinds, std::vector<long>(M, -1));
    long opt_pos = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.kind == ActionKind::kOptimizerStep) {
        if (opt_pos >= 0) return invalid_argument(where(i) + ": a second optimizer step");
        opt_pos = static_cast<long>(i);
        continue;
      }
      if (a.microbatch < 0 || a.microbatch >= M)
        return invalid_argument(where(i) + ": microbatch outside 0.." + std::to_string(M - 1));
      const bool needs_prev = a.kind == ActionKind::kRecvAct || a.kind == ActionKind::kSendGrad;
      const bool needs_next = a.kind == ActionKind::kSendAct || a.kind == ActionKind::kRecvGrad;
      if (needs_prev && s == 0) return invalid_argument(where(i) + ": the first stage has no previous stage");
      if (needs_next && s == S - 1) return invalid_argument(where(i) + ": the last stage has no next stage");
      long& p = pos[static_cast<int>(a.kind)][a.microbatch];
      if (p >= 0) return invalid_argument(where(i) + ": appears twice (first at action " + std::to_string(p) + ")");
      p = static_cast<long>(i);
      switch (a.kind) {
        case ActionKind::kSendAct:
          act_sent[s].push_back(a.microbatch);
          break;
        case ActionKind::kRecvAct:
          act_recv[s].push_back(a.microbatch);
          break;
        case ActionKind::kSendGrad:
          grad_sent[s].push_back(a.microbatch);
          break;
        case ActionKind::kRecvGrad:
          grad_recv[s].push_back(a.microbatch);
          break;
        default:
          break;
      }
    }
    const std::string stage_name = "pipeline schedule: stage " + std::to_string(s);
    if (opt_pos < 0) return invalid_argument(stage_name + ": no optimizer step");
    if (opt_pos != static_cast<long>(list.size()) - 1)
      return invalid_argument(stage_name + ": the optimizer step must be the last action");
    auto at = [&](ActionKind k, int mb) { return pos[static_cast<int>(k)][mb]; };
    for (int mb = 0; mb < M; ++mb) {
      const std::string m = std::to_string(mb);
      auto missing = [&](const char* what) {
        return invalid_argument(stage_name + ": no " + what + " of microbatch " + m);
      };
      auto order = [&](const char* a, const char* b) {
        return invalid_argument(stage_name + ": " + a + m + " must come before " + b + m);
      };
      const long f = at(ActionKind::kForward, mb), b = at(ActionKind::kBackward, mb);
      if (f < 0) return missing("forward");
      if (b < 0) return missing("backward");
      if (b < f) return order("F", "B");
      if (s > 0) {
        const long ra = at(ActionKind::kRecvAct, mb), sg = at(ActionKind::kSendGrad, mb);
        if (ra < 0) return missing("activation receive");
        if (sg < 0) return missing("gradient send");
        if (f < ra) return order("RA", "F");
        if (sg < b) return order("B", "SG");
      }
      if (s < S - 1) {
        const long sa = at(ActionKind::kSendAct, mb), rg = at(ActionKind::kRecvGrad, mb);
        if (sa < 0) return missing("activation send");
        if (rg < 0) return missing("gradient receive");
        if (sa < f) return order("F", "SA");
        if (b < rg) return order("RG", "B");
      }
    }
  }
  for (int s = 0; s + 1 < S; ++s) {
    const std::string pair = "stages " + std::to_string(s) + " and " + std::to_string(s + 1);
    if (act_sent[s] != act_recv[s + 1])
      return invalid_argument("pipeline schedule: " + pair + " disagree on the order of activations");
    if (grad_sent[s + 1] != grad_recv[s])
      return invalid_argument("pipeline schedule: " + pair + " disagree on the order of gradients");
  }
  return Status::Ok();
}

int PipelineSchedule::max_in_flight(int stage) const {
  int live = 0, most = 0;
  for (const Action& a : actions(stage)) {
    if (a.kind == ActionKind::kForward) most = std::max(most, ++live);
    if (a.kind == ActionKind::kBackward) --live;
  }
  return most;
}

std::string PipelineSchedule::describe() const {
  std::string out = std::string(schedule_kind_name(kind_)) + ", " + std::to_string(stages()) + " stages, " +
                    std::to_string(microbatches_) + " microbatches\n";
  for (int s = 0; s < stages(); ++s) {
    out += "  stage " + std::to_string(s) + ":";
    for (const Action& a : lists_[s]) out += " " + a.to_string();
    out += "\n";
  }
  return out;
}

}  // namespace lh
