// defines: lh::StepTrace — an opt-in timeline of what a worker does in each step (every schedule action, the
// end-of-step waits, the norm exchange, the optimizer, evaluation), written as Chrome trace events (JSON lines) so a
// job's workers can be laid side by side in a trace viewer (scripts/trace_merge.sh). Used by StageRunner when the
// environment sets LH_TRACE=DIR.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/status.h"

namespace lh {

class StepTrace {
 public:
  using Clock = std::chrono::steady_clock;
  // Off unless `dir` is non-empty; then events go to DIR/trace.rank<R>.jsonl (created or truncated). A directory
  // that cannot be written is an error naming it.
  static Result<StepTrace> open(const std::string& dir, int rank);
  // LH_TRACE from the environment ("" when unset).
  static std::string dir_from_env();
  StepTrace() = default;
  StepTrace(StepTrace&& o) noexcept { *this = std::move(o); }
  StepTrace& operator=(StepTrace&& o) noexcept;
  ~StepTrace();

  bool on() const { return file_ != nullptr; }
  // One span [t0, t1) named `name` (an action "F3", or "wait_sends", "norm", …) of `step`.
  void span(const std::string& name, int64_t step, Clock::time_point t0, Clock::time_point t1);
  void flush();

 private:
  std::FILE* file_ = nullptr;
  int rank_ = 0;
};

// Times a scope into a trace (nothing when the trace is off).
class TraceScope {
 public:
  TraceScope(StepTrace& trace, std::string name, int64_t step)
      : trace_(trace), name_(trace.on() ? std::move(name) : std::string()), step_(step) {
    if (trace_.on()) t0_ = StepTrace::Clock::now();
  }
  ~TraceScope() {
    if (trace_.on()) trace_.span(name_, step_, t0_, StepTrace::Clock::now());
  }

 private:
  StepTrace& trace_;
  std::string name_;
  int64_t step_;
  StepTrace::Clock::time_point t0_;
};

}  // namespace lh
