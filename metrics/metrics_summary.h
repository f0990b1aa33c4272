// defines: lh::MetricsSummary — step metrics of a whole job gathered per link and role (raw MB,
// wire MB, ratio, busy seconds, codec changes) and per step (loss, tokens/s, raw and wire bytes), with
// the aligned text tables printed at the end of a job and by `longhaul report`. Used by the coordinator and report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/status.h"
#include "metrics/auto_decision.h"
#include "metrics/step_metrics.h"

namespace lh {

using LinkKey = std::tuple<int, int, std::string>;  // src, dst, role

// One row of the link table: everything one (src, dst, role) carried over the job, or, in a folded
// row (see folded_links), everything `pairs` pairs carried in one role.
struct LinkTotals {
  int src = 0;  // -1 in a folded row of several pairs
  int dst = 0;
  std::string role;
  std::string counted_by = "send";  // the end whose counts these are (the sender's when reported);
                                    // "send+recv" in a folded row whose pairs were counted by both
  int pairs = 1;                    // (src, dst) pairs summed into this row
  std::vector<LinkKey> members;     // in rows of folded_links: the links summed into the row
  uint64_t messages = 0;
  uint64_t raw_bytes = 0;
  uint64_t wire_bytes = 0;
  double seconds = 0;
  std::vector<std::string> codecs;  // specs in the order they were used
  std::string link;                 // the pair's name when the workers reported one (grid/link_name.h)
  bool relayed = false;             // some of its traffic went through the job's relay
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
  int count = 1;  // how many workers' values the point combines
};

struct MetricsSummary {
  size_t records = 0;
  int workers = 0;  // distinct worker ids
  int64_t first_step = 0, last_step = 0;
  std::vector<LinkTotals> links;  // every link and role, ordered by role (act, act_grad, grad, tp, other), src, dst
  LinkTotals total;               // sums over links (role "total")
  std::vector<CodecSwitch> codec_switches;
  std::vector<AutoDecision> auto_decisions;  // adaptive compression's choices with their reasons, by step
  std::vector<StepPoint> loss;               // per step: mean over the workers that reported one
  std::vector<StepPoint> val_loss;
  std::vector<StepPoint> tokens_per_s;  // per step: the slowest reporting worker
  // For plots: per link, the bytes of each step it carried, from the same end as its LinkTotals.
  std::map<LinkKey, std::vector<StepPoint>> raw_bytes_per_step;
  std::map<LinkKey, std::vector<StepPoint>> wire_bytes_per_step;
};

// Gathers records (from read_step_metrics or a live job). Refuses two records of the same worker
// and step, and two counts of the same link, role and end within one step, naming both lines.
Result<MetricsSummary> summarize_step_metrics(const std::vector<WorkerStepMetrics>& records);

// "act (fwd)" for act, "act_grad (bwd)" for act_grad, the role name otherwise.
std::string role_label(const std::string& role);

// True for the roles that folded_links sums over pairs: `other` (every step each worker sends every
// other worker a tiny grad-norm message, so a 4-worker job has 12 such pairs that carry next to nothing).
bool folded_role(const std::string& role);

// The rows a person reads, in `links` order: one per link and role for act, act_grad, grad and tp,
// and for a pair of a folded role whose messages average 1 KiB or more (evaluation activations);
// the other pairs of a folded role summed into one row (src = dst = -1, pairs = their number, codecs the
// distinct ones in order of first use) after that role's own rows. A folded role that only one
// pair carried keeps that pair's own row. Used by the link table and the bytes plot.
std::vector<LinkTotals> folded_links(const MetricsSummary& s);

// "0→1" for a link, "12 pairs" for a folded row.
std::string link_label(const LinkTotals& t);

// The link table: the rows of folded_links, then the total of all links, e.g.
//   link      role        messages   raw MB  wire MB  ratio  saved  busy s  codec
//   0→1       act (fwd)         80   167.77    41.94  4.00x  75.0%    3.21  int8
//   …
//   12 pairs  other            480     0.00     0.00  1.00x   0.0%    0.04
//   total                      640   335.54    83.89  4.00x  75.0%    6.45
// MB are 10^6 bytes; busy s of a folded row is the sum over its pairs. "no link traffic recorded"
// when there is none.
std::string format_link_table(const MetricsSummary& s);
// Steps, loss at up to `rows` evenly spaced steps (first and last included), min loss, last
// validation loss, mean tokens/s, and the codec switches.
std::string format_step_summary(const MetricsSummary& s, int rows = 10);

}  // namespace lh
