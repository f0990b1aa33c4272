// LinkShaper: per-link FIFO wire emulation (rate + delay) in front of a real DataPlane. Used by launch --link,
// bench link and tests.
#include "transport/link_shaper.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/log.h"

namespace lh {

std::string LinkShape::to_string() const {
  char buf[96];
  if (rate_bps <= 0)
    std::snprintf(buf, sizeof(buf), "unlimited, %.3g ms", delay.count() / 1000.0);
  else
    std::snprintf(buf, sizeof(buf), "%.4g Mbit/s, %.3g ms", rate_bps / 1e6, delay.count() / 1000.0);
  return buf;
}

namespace {

// Splits "12.5Mbit" into 12.5 and "Mbit"; fails when there is no leading number.
bool split_number(const std::string& s, double& value, std::string& unit) {
  const char* b = s.c_str();
  char* end = nullptr;
  value = std::strtod(b, &end);
  if (end == b || !std::isfinite(value)) return false;
  unit = std::string(end);
  return true;
}

}  // namespace

Result<double> parse_rate_bps(const std::string& text, const std::string& what) {
  double v;
  std::string unit;
  if (!split_number(text, v, unit) || v < 0)
    return invalid_argument(what + " '" + text + "' is not a number of bits per second (e.g. 20M, 1.5G, 800k)");
  double mult = 1;
  if (!unit.empty() && (unit[0] == 'k' || unit[0] == 'K'))
    mult = 1e3, unit.erase(0, 1);
  else if (!unit.empty() && unit[0] == 'M')
    mult = 1e6, unit.erase(0, 1);
  else if (!unit.empty() && (unit[0] == 'G' || unit[0] == 'g'))
    mult = 1e9, unit.erase(0, 1);
  if (!(unit.empty() || unit == "bit" || unit == "bps" || unit == "bit/s" || unit == "b"))
    return invalid_argument(what + " '" + text + "': unknown unit '" + unit + "' (use k, M, G, optionally + bit)");
  return v * mult;
}

Result<double> parse_duration_s(const std::string& text, const std::string& what) {
  double v;
  std::string unit;
  if (!split_number(text, v, unit) || v < 0)
    return invalid_argument(what + " '" + text + "' is not a duration (e.g. 30ms, 0.1s, 500us)");
  if (unit.empty()) {
    if (v == 0) return 0.0;
    return invalid_argument(what + " '" + text + "' has no unit: write " + text + "ms, " + text + "s or " + text + "us");
  }
  if (unit == "ms") return v * 1e-3;
  if (unit == "s") return v;
  if (unit == "us") return v * 1e-6;
  return invalid_argument(what + " '" + text + "': unknown unit '" + unit + "' (use us, ms or s)");
}

Result<LinkShape> parse_link_shape(const std::string& text) {
  LinkShape shape;
  std::string rate = text, delay;
  if (auto comma = text.find(','); comma != std::string::npos) {
    rate = text.substr(0, comma);
    delay = text.substr(comma + 1);
  }
  LH_ASSIGN_OR_RETURN(shape.rate_bps, parse_rate_bps(rate, "link rate"));
  if (!delay.empty()) {
    LH_ASSIGN_OR_RETURN(double s, parse_duration_s(delay, "link delay"));
    if (s > 60) return invalid_argument("link delay '" + delay + "' is over a minute");
    shape.delay = std::chrono::microseconds(int64_t(std::llround(s * 1e6)));
  }
  return shape;
}

LinkShaper::LinkShaper(std::unique_ptr<DataPlane> inner, LinkShape shape) : LinkShaper(*inner, shape) {
  owned_ = std::move(inner);
}

LinkShaper::LinkShaper(DataPlane& inner, LinkShape shape) : inner_(&inner), default_shape_(shape) {
  set_meter(inner_->meter());
  inner_->set_meter(nullptr);
  thread_ = std::thread([this] { run(); });
}

LinkShaper::~LinkShaper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  while (!queue_.empty()) {
    queue_.top().st->complete(unavailable("link shaper closed before the packet left"));
    queue_.pop();
  }
  if (!owned_) inner_->set_meter(meter());
}

void LinkShaper::set_shape(int peer, LinkShape shape) {
  std::lock_guard<std::mutex> lock(mu_);
  shapes_[peer] = shape;
}

void LinkShaper::set_shapes(LinkShape default_shape, const std::map<int, LinkShape>& per_peer) {
  std::lock_guard<std::mutex> lock(mu_);
  default_shape_ = default_shape;
  shapes_ = per_peer;
}

void LinkShaper::start_send(std::shared_ptr<TransferState> st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = shapes_.find(st->peer);
    const LinkShape& shape = it == shapes_.end() ? default_shape_ : it->second;
    Clock::time_point now = Clock::now();
    Clock::time_point& free_at = wire_free_at_[st->peer];
    Clock::time_point tx_start = std::max(now, free_at);
    auto tx = shape.rate_bps > 0 ? std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(double(st->size) * 8.0 / shape.rate_bps))
                                 : Clock::duration::zero();
    free_at = tx_start + tx;
    queue_.push(Pending{free_at + shape.delay, seq_++, std::move(st)});
  }
  cv_.notify_all();
}

void LinkShaper::start_recv(std::shared_ptr<TransferState> st) {
  Transfer in = st->dst ? inner_->recv_into(st->peer, st->tag, st->dst, st->capacity, st->raw_bytes)
                        : inner_->recv(st->peer, st->tag, st->raw_bytes);
  in.state()->on_done([st](TransferState& t) {
    st->owned = std::move(t.owned);
    st->wire_bytes = t.wire_bytes;
    st->t_start = t.t_start;
    st->t_end = t.t_end;
    st->complete(t.status);
  });
}

void LinkShaper::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (queue_.empty()) {
      cv_.wait(lock);
      continue;
    }
    Clock::time_point release = queue_.top().release;
    if (Clock::now() < release) {
      cv_.wait_until(lock, release);
      continue;
    }
    std::shared_ptr<TransferState> st = queue_.top().st;
    queue_.pop();
    lock.unlock();
    Transfer out = inner_->send_view(st->peer, st->tag, st->data, st->size, st->raw_bytes);
    // `st` (and the buffer it owns) lives until the inner send is done.
    out.state()->on_done([st](TransferState& t) { st->complete(t.status); });
    lock.lock();
  }
}

}  // namespace lh
