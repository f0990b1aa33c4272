// Chrome trace events of a worker's steps, one JSON object per line. Used by runtime/stage_runner.cpp.
#include "metrics/step_trace.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace lh {

Result<StepTrace> StepTrace::open(const std::string& dir, int rank) {
  StepTrace t;
  if (dir.empty()) return t;
  const std::string path = dir + "/trace.rank" + std::to_string(rank) + ".jsonl";
  t.file_ = std::fopen(path.c_str(), "w");
  if (t.file_ == nullptr) return invalid_argument("LH_TRACE: cannot write " + path + ": " + std::strerror(errno));
  t.rank_ = rank;
  return t;
}

std::string StepTrace::dir_from_env() {
  const char* env = std::getenv("LH_TRACE");
  return env == nullptr ? std::string() : std::string(env);
}

StepTrace& StepTrace::operator=(StepTrace&& o) noexcept {
  if (this != &o) {
    if (file_ != nullptr) std::fclose(file_);
    file_ = o.file_;
    rank_ = o.rank_;
    o.file_ = nullptr;
  }
  return *this;
}

StepTrace::~StepTrace() {
  if (file_ != nullptr) std::fclose(file_);
}

void StepTrace::span(const std::string& name, int64_t step, Clock::time_point t0, Clock::time_point t1) {
  if (file_ == nullptr) return;
  using us = std::chrono::microseconds;
  const long long ts = std::chrono::duration_cast<us>(t0.time_since_epoch()).count();
  const long long dur = std::chrono::duration_cast<us>(t1 - t0).count();
  // The steady clock is one clock for every process of a host, so one machine's ranks line up.
  std::fprintf(
      file_, "{\"name\":\"%s\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,\"pid\":%d,\"tid\":0,\"args\":{\"step\":%lld}}\n",
      name.c_str(), ts, dur, rank_, static_cast<long long>(step));
}

void StepTrace::flush() {
  if (file_ != nullptr) std::fflush(file_);
}

}  // namespace lh
