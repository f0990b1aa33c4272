// Gathering workers' step metrics on the coordinator: validation, the job's metrics file, summary.
// Used by the coordinator (launch / `longhaul coordinator`).
#include "metrics/metrics_collector.h"

#include <algorithm>
#include <fstream>

#include "core/checkpoint.h"

namespace lh {

Result<std::unique_ptr<MetricsCollector>> MetricsCollector::open(const std::string& path) {
  std::unique_ptr<MetricsCollector> c(new MetricsCollector());
  c->path_ = path;
  if (!path.empty()) {
    LH_ASSIGN_OR_RETURN(StepMetricsWriter w, StepMetricsWriter::open(path));
    c->writer_.emplace(std::move(w));
  }
  return c;
}

Result<std::unique_ptr<MetricsCollector>> MetricsCollector::open_resumed(const std::string& path, int64_t step,
                                                                         std::vector<std::string>* warnings) {
  if (path.empty()) return open(path);
  std::unique_ptr<MetricsCollector> c(new MetricsCollector());
  c->path_ = path;
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    auto m = parse_step_metrics_line(line, n, path);
    if (!m.ok()) {
      if (warnings)
        warnings->push_back("metrics file: dropping line " + std::to_string(n) + " (" + m.status().message() + ")");
      continue;
    }
    if (m->step > step || c->seen_.count({m->worker, m->step})) continue;
    m->source_line = static_cast<int>(c->records_.size()) + 1;
    c->seen_.insert({m->worker, m->step});
    c->kept_bytes_[m->worker] += line.size();
    c->newest_ = std::max(c->newest_, m->step);
    c->records_.push_back(std::move(*m));
    c->lines_.push_back(line);
  }
  LH_RETURN_IF_ERROR(c->truncate_after(step));
  return c;
}

Status MetricsCollector::truncate_after(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerStepMetrics> records;
  std::vector<std::string> lines;
  std::string text;
  seen_.clear();
  kept_bytes_.clear();
  newest_ = -1;
  for (size_t i = 0; i < records_.size(); ++i) {
    if (records_[i].step > step) continue;
    records.push_back(records_[i]);
    records.back().source_line = static_cast<int>(records.size());
    lines.push_back(lines_[i]);
    text += lines_[i] + "\n";
    seen_.insert({records_[i].worker, records_[i].step});
    kept_bytes_[records_[i].worker] += lines_[i].size();
    newest_ = std::max(newest_, records_[i].step);
  }
  records_ = std::move(records);
  lines_ = std::move(lines);
  if (writer_ || !path_.empty()) {
    const std::string path = writer_ ? writer_->path() : path_;
    writer_.reset();
    LH_RETURN_IF_ERROR(write_file_atomically(path, text, 0644));  // as the writer made it (fopen, the umask's)
    LH_ASSIGN_OR_RETURN(StepMetricsWriter w, StepMetricsWriter::open(path, /*append=*/true));
    writer_.emplace(std::move(w));
  }
  return Status::Ok();
}

Status MetricsCollector::add(int rank, int64_t step, const std::string& json_line) {
  const std::string source = "metrics from rank " + std::to_string(rank) + " for step " + std::to_string(step);
  if (json_line.find('\n') != std::string::npos) return invalid_argument(source + ": more than one line");
  std::lock_guard<std::mutex> lock(mu_);
  LH_ASSIGN_OR_RETURN(WorkerStepMetrics m, parse_step_metrics_line(json_line, 1, source));
  if (m.worker != rank) return invalid_argument(source + ": the line says worker " + std::to_string(m.worker));
  if (m.step != step) return invalid_argument(source + ": the line says step " + std::to_string(m.step));
  if (seen_.count({rank, step})) return invalid_argument(source + ": already reported");
  size_t& kept = kept_bytes_[rank];
  if (kept + json_line.size() > kept_limit_)
    return invalid_argument(source + ": refused: the coordinator keeps at most " + std::to_string(kept_limit_) +
                            " bytes of one worker's metrics, and rank " + std::to_string(rank) +
                            "'s lines so far take " + std::to_string(kept));
  if (writer_) LH_RETURN_IF_ERROR(writer_->write_line(json_line));
  kept += json_line.size();
  m.source_line = static_cast<int>(records_.size()) + 1;  // its line in the job's file
  records_.push_back(std::move(m));
  lines_.push_back(json_line);
  seen_.insert({rank, step});
  newest_ = std::max(newest_, step);
  if (observer_) observer_(records_.back());
  return Status::Ok();
}

bool MetricsCollector::has(int rank, int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_.count({rank, step}) > 0;
}

int64_t MetricsCollector::newest_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_;
}

std::vector<WorkerStepMetrics> MetricsCollector::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
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
