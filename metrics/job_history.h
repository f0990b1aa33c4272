// defines: lh::JobHistory — what a watcher of a running job needs, kept bounded however long the job runs: the
// per-step series (loss, validation loss, tokens/s, bytes raw and on the wire), downsampled by doubling a bucket's
// width whenever the points outgrow their cap; the last events (codec switches and auto's reasons, set-link, joins,
// losses, rollbacks, relays); and the counters and gauges /metrics exposes (bytes per link, role, codec and path,
// never taken back; each link's latest measured rate and latency). Fed by the coordinator with every accepted
// metrics record, and by `report --html` from a metrics file. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "metrics/metrics_summary.h"
#include "metrics/step_metrics.h"

namespace lh {

// Bytes one (link, role, codec, path) carried, counted by the sender, since the coordinator started.
struct LinkCounter {
  std::string link;  // the pair's name ("s0-s1:fwd", "0-1"), as the worker reported it, else "SRC-DST"
  std::string role;  // act, act_grad, grad, tp, other
  std::string codec;
  bool relayed = false;
  uint64_t raw_bytes = 0, wire_bytes = 0, messages = 0;
  double seconds = 0;
};

// A link's latest measurement: its rate (wire bytes over serial time) and one-way latency.
struct LinkGauge {
  std::string link, role;
  std::optional<double> bytes_per_s, latency_s;
  int64_t step = 0;
};

struct HistoryEvent {
  double t = 0;  // unix seconds
  int64_t step = 0;
  std::string kind;  // codec, auto, set-link, join, lost, rollback, relay, info
  std::string text;
};

class JobHistory {
 public:
  explicit JobHistory(size_t max_points = 512, size_t max_events = 500);

  // One accepted record. `t` is unix seconds (its events' time).
  void observe(const WorkerStepMetrics& m);
  void event(int64_t step, const std::string& kind, const std::string& text, double t = -1);  // t < 0: now
  // A rollback to `step`: the series forget later steps (they run again); the counters keep every byte that crossed.
  void truncate_after(int64_t step);

  // [{"step","loss","val_loss","tokens_per_s","raw_bytes","wire_bytes"}], raw/wire cumulative; a point stands for
  // the steps since the previous one (its loss and tokens/s their mean, its validation loss the last).
  nlohmann::json points_json() const;
  nlohmann::json events_json() const;  // oldest first
  std::vector<LinkCounter> counters() const;
  std::vector<LinkGauge> gauges() const;
  // The newest values reported: loss and tokens/s of the newest step that had them, the newest validation loss.
  struct Latest {
    int64_t step = -1;
    std::optional<double> loss, val_loss, tokens_per_s;
    int64_t loss_step = -1, val_step = -1, tps_step = -1;
  };
  Latest latest() const;
  // Packets the workers' data planes refused (authentication), each worker's newest count summed.
  uint64_t auth_failures() const;
  size_t points() const;
  int64_t stride() const;  // steps per point now
  uint64_t events_dropped() const;
  uint64_t records() const;

 private:
  struct Bucket {
    double loss_sum = 0, tps_sum = 0;
    int loss_n = 0, tps_n = 0;
    std::optional<double> val_loss;
    int64_t val_step = -1;
    uint64_t raw = 0, wire = 0;
  };
  static void merge(Bucket& into, const Bucket& from);
  void widen_locked();

  mutable std::mutex mu_;
  size_t max_points_, max_events_;
  int64_t stride_ = 1;
  std::map<int64_t, Bucket> buckets_;  // keyed by the bucket's last step (a multiple of stride_)
  std::deque<HistoryEvent> events_;
  uint64_t events_dropped_ = 0, records_ = 0;
  std::map<std::tuple<std::string, std::string, std::string, bool>, LinkCounter> counters_;
  std::map<std::pair<std::string, std::string>, LinkGauge> gauges_;
  std::map<std::pair<int, int>, bool> relayed_seen_;
  Latest latest_;
  std::map<int, std::pair<int64_t, uint64_t>> auth_failures_;  // worker → (step, count)
};

// The page's data (web/page.html) for a finished job, from its metrics file: the link rows of `summary` (pipeline
// links by name and direction, then the groups' roles), its series, and its codec switches and auto's decisions as
// events. Used by `report --html`.
nlohmann::json report_page_data(const std::vector<WorkerStepMetrics>& records, const MetricsSummary& summary,
                                const std::string& title);

}  // namespace lh
