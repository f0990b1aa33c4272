// Per-link byte and time accounting with an EWMA bandwidth estimate. Used by DataPlane and metrics reporting.
#include "transport/link_meter.h"

#include <algorithm>

namespace lh {
namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Adds the part of [start, end] not yet covered; returns the start of that uncovered part.
Clock::time_point add_busy(double& busy, Clock::time_point& covered_until, Clock::time_point start,
                           Clock::time_point end) {
  Clock::time_point from = std::max(start, covered_until);
  if (end > from) busy += seconds(end - from);
  covered_until = std::max(covered_until, end);
  return from;
}

}  // namespace

double bandwidth_of(const LinkStats& s) {
  return s.serial_seconds > 0 ? double(s.wire_bytes) * 8.0 / s.serial_seconds : 0.0;
}

double LinkMeter::LatencyMin::value() const {
  if (current < 0) return std::max(previous, 0.0);
  return previous < 0 ? current : std::min(current, previous);
}

LinkMeter::LinkMeter(int self_rank, double ewma_alpha) : self_rank_(self_rank), alpha_(ewma_alpha) {
  LH_ASSERT(ewma_alpha > 0 && ewma_alpha <= 1, "EWMA alpha must be in (0, 1]");
}

void LinkMeter::set_self_rank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  self_rank_ = rank;
}

int LinkMeter::self_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return self_rank_;
}

void LinkMeter::record(int peer, Role role, Direction dir, uint64_t raw_bytes, uint64_t wire_bytes,
                       Clock::time_point start, Clock::time_point end) {
  if (end < start) end = start;
  std::lock_guard<std::mutex> lock(mu_);
  RoleEntry& r = roles_[{peer, int(role), int(dir)}];
  r.stats.messages += 1;
  r.stats.raw_bytes += raw_bytes;
  r.stats.wire_bytes += wire_bytes;
  add_busy(r.stats.busy_seconds, r.covered_until, start, end);

  LinkEntry& l = links_[{peer, int(dir)}];
  // The latency first (this message may be the quickest yet), then this message's serial time under it.
  const double took = seconds(end - start);
  if (l.latency.period_start == Clock::time_point{}) l.latency.period_start = start;
  if (start - l.latency.period_start >= kLatencyPeriod) {
    if (l.latency.current >= 0) l.latency.previous = l.latency.current;
    l.latency.current = -1;
    l.latency.period_start = start;
  }
  if (l.latency.current < 0 || took < l.latency.current) l.latency.current = took;
  const auto latency = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(l.latency.value()));
  const Clock::time_point serial_from = std::max(start + latency, l.last_end);
  const double serial = end > serial_from ? seconds(end - serial_from) : 0.0;
  l.last_end = std::max(l.last_end, end);
  r.stats.serial_seconds += serial;
  l.stats.serial_seconds += serial;
  l.stats.messages += 1;
  l.stats.raw_bytes += raw_bytes;
  l.stats.wire_bytes += wire_bytes;
  Clock::time_point from = add_busy(l.stats.busy_seconds, l.covered_until, start, end);
  double service = seconds(end - from);
  // Tiny transfers finish inside one timer tick and say nothing about the link's rate.
  if (service > 20e-6 && wire_bytes > 0) {
    double bps = double(wire_bytes) * 8.0 / service;
    l.ewma_bps = l.has_sample ? (1 - alpha_) * l.ewma_bps + alpha_ * bps : bps;
    l.has_sample = true;
  }
}

void LinkMeter::record(const TransferState& t) {
  record(t.peer, t.tag.role, t.direction, t.raw_bytes, t.wire_bytes, t.t_start, t.t_end);
}

LinkStats LinkMeter::stats(int peer, Role role, Direction dir) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = roles_.find({peer, int(role), int(dir)});
  return it == roles_.end() ? LinkStats{} : it->second.stats;
}

LinkStats LinkMeter::link_stats(int peer, Direction dir) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = links_.find({peer, int(dir)});
  return it == links_.end() ? LinkStats{} : it->second.stats;
}

double LinkMeter::latency_s(int peer, Direction dir) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = links_.find({peer, int(dir)});
  return it == links_.end() ? 0.0 : it->second.latency.value();
}

double LinkMeter::bandwidth_bps(int peer, Direction dir) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = links_.find({peer, int(dir)});
  return it == links_.end() ? 0.0 : it->second.ewma_bps;
}

void LinkMeter::set_relayed(std::set<int> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  relayed_ = std::move(peers);
}

nlohmann::json LinkMeter::to_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json links = nlohmann::json::array(), bw = nlohmann::json::array();
  auto ends = [&](int peer, int dir) {
    return dir == int(Direction::kSend) ? std::make_pair(self_rank_, peer) : std::make_pair(peer, self_rank_);
  };
  for (const auto& [key, e] : roles_) {
    auto [peer, role, dir] = key;
    auto [src, dst] = ends(peer, dir);
    links.push_back({{"src", src},
                     {"dst", dst},
                     {"role", role_name(Role(role))},
                     {"dir", direction_name(Direction(dir))},
                     {"messages", e.stats.messages},
                     {"raw_bytes", e.stats.raw_bytes},
                     {"wire_bytes", e.stats.wire_bytes},
                     {"seconds", e.stats.busy_seconds},
                     {"serial_s", e.stats.serial_seconds}});
    if (auto l = links_.find({peer, dir}); l != links_.end()) links.back()["latency_s"] = l->second.latency.value();
    if (relayed_.count(peer)) links.back()["relayed"] = true;
  }
  for (const auto& [key, e] : links_) {
    auto [src, dst] = ends(key.first, key.second);
    bw.push_back({{"src", src},
                  {"dst", dst},
                  {"dir", direction_name(Direction(key.second))},
                  {"bps", e.ewma_bps},
                  {"busy_seconds", e.stats.busy_seconds},
                  {"wire_bytes", e.stats.wire_bytes}});
  }
  return {{"rank", self_rank_}, {"links", links}, {"bandwidth", bw}};
}

void LinkMeter::reset_counters() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [k, e] : roles_) e.stats = {};
  for (auto& [k, e] : links_) e.stats = {};
}

}  // namespace lh
