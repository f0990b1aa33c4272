// defines: lh::MetricsCollector — the coordinator's end of step metrics: it validates each worker's
// JSON line, appends it to the job's metrics file, tracks the newest step, and summarises the job.
// Used by the coordinator (launch / `longhaul coordinator`).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "metrics/metrics_summary.h"
#include "metrics/step_metrics.h"

namespace lh {

class MetricsCollector {
 public:
  // `path` empty: keep the records in memory only.
  static Result<std::unique_ptr<MetricsCollector>> open(const std::string& path);
  // A resumed job's file: the records of steps up to `step` are kept (read back, so the summary covers the whole
  // run), later ones and lines torn by a crash are dropped (each torn line is a warning), and new records append.
  static Result<std::unique_ptr<MetricsCollector>> open_resumed(const std::string& path, int64_t step,
                                                                std::vector<std::string>* warnings);
  // A rollback to `step`: records of later steps are dropped, from memory and from the file (rewritten atomically),
  // so the steps run again are not reported twice.
  Status truncate_after(int64_t step);

  // One line from worker `rank` for `step` (as the WorkerStepMetrics control message carries them). A line
  // that does not parse, or whose worker or step differ from the message's, is refused with the
  // reason and not written; so is a second line for the same worker and step. Thread-safe.
  // A worker's lines are kept in memory for the summary: at most kMaxKeptBytesPerRank of one rank's, and a line past
  // that is refused naming the cap.
  Status add(int rank, int64_t step, const std::string& json_line);
  static constexpr size_t kMaxKeptBytesPerRank = size_t(256) << 20;
  void set_kept_bytes_per_rank(size_t bytes) { kept_limit_ = bytes; }  // kMaxKeptBytesPerRank unless set
  // Called with every record add() takes (under the collector's lock: it must not call back into the collector).
  void set_observer(std::function<void(const WorkerStepMetrics&)> fn) { observer_ = std::move(fn); }
  // Whether worker `rank`'s line for `step` was taken (a checkpoint shard follows its step's metrics).
  bool has(int rank, int64_t step) const;

  int64_t newest_step() const;  // −1 before the first record
  size_t records() const;
  std::vector<WorkerStepMetrics> snapshot() const;  // a copy of every record so far
  Result<MetricsSummary> summary() const;

 private:
  MetricsCollector() = default;
  mutable std::mutex mu_;
  std::string path_;
  std::optional<StepMetricsWriter> writer_;
  std::vector<WorkerStepMetrics> records_;
  std::vector<std::string> lines_;          // records_' lines as written
  std::set<std::pair<int, int64_t>> seen_;  // (worker, step)
  std::map<int, size_t> kept_bytes_;        // worker → bytes of its lines in lines_
  size_t kept_limit_ = kMaxKeptBytesPerRank;
  int64_t newest_ = -1;
  std::function<void(const WorkerStepMetrics&)> observer_;
};

}  // namespace lh
