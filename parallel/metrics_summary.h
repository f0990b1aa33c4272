// defines: lh::MetricsSummary — step metrics of a whole job gathered per link and role (raw MB,
// wire MB, ratio, busy seconds, codec changes) and per step (loss, tokens/s), with the aligned text
// tables printed at the end of a job and by `longhaul report`. Used by the coordinator and report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/status.h"
#include "parallel/step_metrics.h"

namespace lh {

// One row of the link table: everything one (src, dst, role) carried over the job.
struct LinkTotals {
  int src = 0;
  int dst = 0;
  std::string role;
  std::string counted_by = "send";  // the end whose counts these are (the sender's when reported)
  uint64_t messages = 0;
  uint64_t raw_bytes = 0;
  uint64_t wire_bytes = 0;
  double seconds = 0;
  std::vector<std::string> codecs;  // specs in the order they were used
  double ratio() const { return wire_bytes ? double(raw_bytes) / double(wire_bytes) : 0.0; }
};

// The codec on (src, dst, role) went from `from` to `to` at `step` (its first step with `to`).
struct CodecSwitch {
  int src = 0;
  int dst = 0;
  std::string role;
  std::string from, to;
  int64_t step = 0;
};

struct StepPoint {
  int64_t step = 0;
  double value = 0;
};

using LinkKey = std::tuple<int, int, std::string>;  // src, dst, role

struct MetricsSummary {
  size_t records = 0;
  int workers = 0;  // distinct worker ids
  int64_t first_step = 0, last_step = 0;
  std::vector<LinkTotals> links;  // ordered by role (act, act_grad, grad, tp, other), then src, dst
  LinkTotals total;               // sums over links (role "total")
  std::vector<CodecSwitch> codec_switches;
  std::vector<StepPoint> loss;          // per step: mean over the workers that reported one
  std::vector<StepPoint> val_loss;
  std::vector<StepPoint> tokens_per_s;  // per step: the slowest reporting worker
  std::map<LinkKey, std::vector<StepPoint>> wire_bytes_per_step;  // for plots
};

// Gathers records (from read_step_metrics or a live job). Refuses two records of the same worker
// and step, and two counts of the same link, role and end within one step, naming both lines.
Result<MetricsSummary> summarize_step_metrics(const std::vector<WorkerStepMetrics>& records);

// "fwd" for act, "bwd" for act_grad, the role name otherwise.
std::string role_label(const std::string& role);

// The link table, e.g.
//   link  role        messages   raw MB  wire MB  ratio  saved  busy s  codec
//   0→1   act (fwd)         80   167.77    41.94  4.00x  75.0%    3.21  int8
//   …
//   total                  160   335.54    83.89  4.00x  75.0%    6.40
// MB are 10^6 bytes. "no link traffic recorded" when there is none.
std::string format_link_table(const MetricsSummary& s);
// Steps, loss at up to `rows` evenly spaced steps (first and last included), min loss, last
// validation loss, mean tokens/s, and the codec switches.
std::string format_step_summary(const MetricsSummary& s, int rows = 10);

}  // namespace lh
