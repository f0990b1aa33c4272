// defines: lh::WorkerStepMetrics — one worker's record of one training step (loss, tokens/s, and per link
// and role: raw bytes, wire bytes, messages, seconds) — and its JSON-lines form, written and read
// with validation. Used by workers, the coordinator (which gathers them), `train` and `report`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/role.h"
#include "core/status.h"

namespace lh {

// Role names in metrics are core/role.h's role_names(): act, act_grad, grad, tp, other.

// Traffic of one link, role and counting end during one step. Each byte is counted by the sender
// ("send") and may also be counted by the receiver ("recv"); summaries prefer the sender's count.
struct LinkTraffic {
  int src = 0;
  int dst = 0;
  std::string role = "act";
  std::string dir = "send";  // which end counted it: send | recv
  std::string codec;         // spec in force this step; empty when not reported
  std::string link;          // the pair's name (grid/link_name.h, e.g. "s0d0-s0d1:fwd"); empty when not reported
  uint64_t raw_bytes = 0;    // what the tensors would cost uncompressed in fp32
  uint64_t wire_bytes = 0;   // what crossed the link
  uint64_t messages = 0;
  double seconds = 0;  // time the link was busy with this traffic
  // The link's serial time for this traffic and its one-way latency (transport/link_meter.h LinkStats::serial_seconds,
  // LinkMeter::latency_s): wire bytes over serial_s is the link's rate whatever the codec. Absent in older records.
  std::optional<double> serial_s, latency_s;
  bool relayed = false;  // it went through the job's relay (the pair could not connect directly)
};

struct WorkerStepMetrics {
  int64_t step = 0;
  int worker = 0;
  int stage = 0;
  std::optional<double> loss;      // the last stage only
  std::optional<double> val_loss;  // when evaluated
  std::optional<double> lr;
  std::optional<double> tokens_per_s;
  // Packets this worker's data plane refused since its epoch began because they failed authentication (a tag that
  // did not verify, a replay, another epoch's packet); absent when the plane does not authenticate.
  std::optional<uint64_t> auth_failures;
  // Seconds this worker spent in forward and backward compute this step (with --slowdown's share): what adaptive
  // compression measures the pipeline's pace by.
  std::optional<double> compute_s;
  // Adaptive-compression decisions the coordinator made for this worker's outgoing links since its previous record
  // (metrics/auto_decision.h AutoDecision as JSON; the coordinator adds them to the line before writing it).
  std::vector<nlohmann::json> auto_decisions;
  std::vector<LinkTraffic> links;
  int source_line = 0;  // line number when read from a file (1-based), 0 otherwise; not written
};

// {"step":3,"worker":1,"stage":1,"loss":4.2,"tokens_per_s":812.5,"links":[{"src":1,"dst":2,
//  "role":"act","dir":"send","codec":"int8","raw_bytes":…,"wire_bytes":…,"messages":4,"seconds":0.12}]}
// Optional fields are omitted when absent.
nlohmann::json step_metrics_to_json(const WorkerStepMetrics& m);
std::string step_metrics_to_line(const WorkerStepMetrics& m);  // one line, no newline

// A line longer than this is refused (a worker's line is a few KB: its links and the coordinator's auto decisions).
inline constexpr size_t kMaxMetricsLineBytes = size_t(1) << 20;

// Parses one line (at most kMaxMetricsLineBytes, nested at most kMaxJsonDepth). Required: step (integer ≥ 0). Optional:
// worker, stage (integers ≥ 0, default 0), loss, val_loss, lr (numbers or null), tokens_per_s (number ≥ 0), links
// (array of objects with src, dst (integers ≥ 0, different), role (a metrics role), dir (send|recv, default send),
// codec (string), raw_bytes, wire_bytes, messages (integers ≥ 0, default 0), seconds (number ≥ 0)). Other fields are
// ignored, so newer writers stay readable. Errors say "<source> line N: field F: …".
Result<WorkerStepMetrics> parse_step_metrics_line(const std::string& line, int line_number, const std::string& source);

// The "links" array of a metrics line or of LinkMeter::to_json(), validated like a line's links.
Result<std::vector<LinkTraffic>> link_traffic_from_json(const nlohmann::json& links, const std::string& source);

// Reads every non-blank line; the first bad line is the error. An empty input gives no records.
Result<std::vector<WorkerStepMetrics>> read_step_metrics(std::istream& in, const std::string& source);
Result<std::vector<WorkerStepMetrics>> read_step_metrics_file(const std::string& path);

// Appends lines to a file, flushing each so a crash loses at most the line being written.
class StepMetricsWriter {
 public:
  static Result<StepMetricsWriter> open(const std::string& path, bool append = false);
  StepMetricsWriter(StepMetricsWriter&&) noexcept;
  StepMetricsWriter& operator=(StepMetricsWriter&&) noexcept;
  ~StepMetricsWriter();
  Status write(const WorkerStepMetrics& m);
  Status write_line(const std::string& json_line);  // a line received from a worker, already validated
  const std::string& path() const { return path_; }

 private:
  StepMetricsWriter() = default;
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lh
