// JobHistory: bucketed series, bounded events, and the per-link counters and gauges of a running job.
#include "metrics/job_history.h"

#include <algorithm>
#include <chrono>

#include "core/role.h"

namespace lh {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string link_label(const LinkTraffic& l) {
  return !l.link.empty() ? l.link : std::to_string(l.src) + "-" + std::to_string(l.dst);
}

}  // namespace

JobHistory::JobHistory(size_t max_points, size_t max_events)
    : max_points_(std::max<size_t>(max_points, 8)), max_events_(std::max<size_t>(max_events, 1)) {}

void JobHistory::merge(Bucket& into, const Bucket& from) {
  into.loss_sum += from.loss_sum;
  into.loss_n += from.loss_n;
  into.tps_sum += from.tps_sum;
  into.tps_n += from.tps_n;
  if (from.val_loss && from.val_step >= into.val_step) {
    into.val_loss = from.val_loss;
    into.val_step = from.val_step;
  }
  into.raw += from.raw;
  into.wire += from.wire;
}

// Twice as many steps per point: each bucket goes into the one of the new width that holds its steps.
void JobHistory::widen_locked() {
  stride_ *= 2;
  std::map<int64_t, Bucket> wider;
  for (const auto& [key, b] : buckets_) merge(wider[(key + stride_ - 1) / stride_ * stride_], b);
  buckets_ = std::move(wider);
}

void JobHistory::observe(const WorkerStepMetrics& m) {
  std::vector<HistoryEvent> relays;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++records_;
    const int64_t key = (std::max<int64_t>(m.step, 0) + stride_ - 1) / stride_ * stride_;
    Bucket& b = buckets_[key];
    if (m.loss) {
      b.loss_sum += *m.loss;
      ++b.loss_n;
    }
    if (m.tokens_per_s) {
      b.tps_sum += *m.tokens_per_s;
      ++b.tps_n;
    }
    if (m.val_loss && m.step >= b.val_step) {
      b.val_loss = m.val_loss;
      b.val_step = m.step;
    }
    latest_.step = std::max(latest_.step, m.step);
    if (m.loss && m.step >= latest_.loss_step) {
      latest_.loss = m.loss;
      latest_.loss_step = m.step;
    }
    if (m.val_loss && m.step >= latest_.val_step) {
      latest_.val_loss = m.val_loss;
      latest_.val_step = m.step;
    }
    if (m.tokens_per_s && m.step >= latest_.tps_step) {
      latest_.tokens_per_s = m.tokens_per_s;
      latest_.tps_step = m.step;
    }
    if (m.auth_failures) {
      auto& [at, count] = auth_failures_[m.worker];
      if (m.step >= at) {
        at = m.step;
        count = *m.auth_failures;
      }
    }
    for (const LinkTraffic& l : m.links) {
      if (l.dir != "send") continue;  // each byte once: the sender's count, as the summary prefers
      b.raw += l.raw_bytes;
      b.wire += l.wire_bytes;
      LinkCounter& c = counters_[{link_label(l), l.role, l.codec, l.relayed}];
      if (c.link.empty()) c = LinkCounter{link_label(l), l.role, l.codec, l.relayed};
      c.raw_bytes += l.raw_bytes;
      c.wire_bytes += l.wire_bytes;
      c.messages += l.messages;
      c.seconds += l.seconds;
      LinkGauge& g = gauges_[{link_label(l), l.role}];
      if (m.step >= g.step) {
        g.link = link_label(l);
        g.role = l.role;
        g.step = m.step;
        if (l.serial_s && *l.serial_s > 0 && l.wire_bytes > 0) g.bytes_per_s = double(l.wire_bytes) / *l.serial_s;
        if (l.latency_s) g.latency_s = l.latency_s;
      }
      if (l.relayed && !relayed_seen_[{l.src, l.dst}]) {
        relayed_seen_[{l.src, l.dst}] = true;
        relays.push_back({unix_now(), m.step, "relay",
                          link_label(l) + " goes through the job's relay (the pair could not connect directly)"});
      }
    }
    while (buckets_.size() > max_points_) widen_locked();
  }
  for (const HistoryEvent& e : relays) event(e.step, e.kind, e.text, e.t);
}

void JobHistory::event(int64_t step, const std::string& kind, const std::string& text, double t) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({t < 0 ? unix_now() : t, step, kind, text});
  while (events_.size() > max_events_) {
    events_.pop_front();
    ++events_dropped_;
  }
}

void JobHistory::truncate_after(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  buckets_.erase(buckets_.upper_bound(step), buckets_.end());
}

nlohmann::json JobHistory::points_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json a = nlohmann::json::array();
  uint64_t raw = 0, wire = 0;
  for (const auto& [key, b] : buckets_) {
    raw += b.raw;
    wire += b.wire;
    nlohmann::json p = {{"step", key}, {"raw_bytes", raw}, {"wire_bytes", wire}};
    p["loss"] = b.loss_n ? nlohmann::json(b.loss_sum / b.loss_n) : nlohmann::json(nullptr);
    p["val_loss"] = b.val_loss ? nlohmann::json(*b.val_loss) : nlohmann::json(nullptr);
    p["tokens_per_s"] = b.tps_n ? nlohmann::json(b.tps_sum / b.tps_n) : nlohmann::json(nullptr);
    a.push_back(std::move(p));
  }
  return a;
}

nlohmann::json JobHistory::events_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json a = nlohmann::json::array();
  for (const HistoryEvent& e : events_) a.push_back({{"t", e.t}, {"step", e.step}, {"kind", e.kind}, {"text", e.text}});
  return a;
}

std::vector<LinkCounter> JobHistory::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LinkCounter> v;
  for (const auto& [k, c] : counters_) v.push_back(c);
  return v;
}

std::vector<LinkGauge> JobHistory::gauges() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LinkGauge> v;
  for (const auto& [k, g] : gauges_) v.push_back(g);
  return v;
}

JobHistory::Latest JobHistory::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

uint64_t JobHistory::auth_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [w, c] : auth_failures_) n += c.second;
  return n;
}

size_t JobHistory::points() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buckets_.size();
}
int64_t JobHistory::stride() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stride_;
}
uint64_t JobHistory::events_dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_dropped_;
}
uint64_t JobHistory::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

nlohmann::json report_page_data(const std::vector<WorkerStepMetrics>& records, const MetricsSummary& summary,
                                const std::string& title) {
  JobHistory h(512, 1000);
  for (const WorkerStepMetrics& m : records) h.observe(m);
  for (const CodecSwitch& c : summary.codec_switches)
    h.event(
        c.step, "codec",
        std::to_string(c.src) + "→" + std::to_string(c.dst) + " " + role_label(c.role) + ": " + c.from + " → " + c.to,
        0);
  for (const AutoDecision& d : summary.auto_decisions)
    h.event(d.from_step, "auto", d.link + " " + d.from + " → " + d.to + ": " + d.reason, 0);
  nlohmann::json events = h.events_json();
  std::stable_sort(events.begin(), events.end(),
                   [](const nlohmann::json& a, const nlohmann::json& b) { return a["step"] < b["step"]; });
  for (nlohmann::json& e : events) e.erase("t");  // a report has steps, not the times they ran
  nlohmann::json links = nlohmann::json::array();
  for (const LinkTotals& t : folded_links(summary)) {
    const bool fwd = t.role == "act", bwd = t.role == "act_grad";
    std::string name = !t.link.empty() ? t.link : link_label(t);
    if ((fwd || bwd) && name.find(':') != std::string::npos) name = name.substr(0, name.find(':'));
    if (t.pairs > 1 && t.src < 0) name = std::to_string(t.pairs) + " pairs";
    nlohmann::json e = {{"link", name},
                        {"dir", role_dir_label(t.role)},
                        {"spec", t.codecs.empty() ? std::string() : t.codecs.back()},
                        {"raw_bytes", t.raw_bytes},
                        {"wire_bytes", t.wire_bytes}};
    if (t.seconds > 0) e["measured_bps"] = 8.0 * double(t.wire_bytes) / t.seconds;
    links.push_back(std::move(e));
  }
  const JobHistory::Latest latest = h.latest();
  return {{"mode", "report"},
          {"title", title},
          {"step", summary.last_step},
          {"steps", summary.last_step},
          {"grid", nullptr},
          {"links", links},
          {"workers", nlohmann::json::array()},
          {"preflight", nlohmann::json::array()},
          {"points", h.points_json()},
          {"events", events},
          {"counters", {{"workers", summary.workers}, {"auth_failures", h.auth_failures()}}},
          {"latest_loss", latest.loss ? nlohmann::json(*latest.loss) : nlohmann::json(nullptr)}};
}

}  // namespace lh
