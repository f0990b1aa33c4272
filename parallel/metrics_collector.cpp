// Gathering workers' step metrics on the coordinator: validation, the job's metrics file, summary.
// Used by the coordinator (launch / `longhaul coordinator`).
#include "parallel/metrics_collector.h"

#include <algorithm>

namespace lh {

Result<std::unique_ptr<MetricsCollector>> MetricsCollector::open(const std::string& path) {
  std::unique_ptr<MetricsCollector> c(new MetricsCollector());
  if (!path.empty()) {
    LH_ASSIGN_OR_RETURN(StepMetricsWriter w, StepMetricsWriter::open(path));
    c->writer_.emplace(std::move(w));
  }
  return c;
}

Status MetricsCollector::add(int rank, int64_t step, const std::string& json_line) {
  const std::string source = "metrics from rank " + std::to_string(rank) + " for step " + std::to_string(step);
  if (json_line.find('\n') != std::string::npos) return invalid_argument(source + ": more than one line");
  std::lock_guard<std::mutex> lock(mu_);
  LH_ASSIGN_OR_RETURN(WorkerStepMetrics m, parse_step_metrics_line(json_line, 1, source));
  if (m.worker != rank)
    return invalid_argument(source + ": the line says worker " + std::to_string(m.worker));
  if (m.step != step) return invalid_argument(source + ": the line says step " + std::to_string(m.step));
  if (seen_.count({rank, step})) return invalid_argument(source + ": already reported");
  if (writer_) LH_RETURN_IF_ERROR(writer_->write_line(json_line));
  m.source_line = static_cast<int>(records_.size()) + 1;  // its line in the job's file
  records_.push_back(std::move(m));
  seen_.insert({rank, step});
  newest_ = std::max(newest_, step);
  return Status::Ok();
}

int64_t MetricsCollector::newest_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_;
}

size_t MetricsCollector::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_.size();
}

Result<MetricsSummary> MetricsCollector::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return summarize_step_metrics(records_);
}

}  // namespace lh
