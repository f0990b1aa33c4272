// Adaptive compression of pipeline links: the codec choice per link and direction, and the window of measurements
// it is made from. Used by PipelineCoordinator.
#include "parallel/auto_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/codec_plan.h"

namespace lh {

Result<std::vector<std::string>> parse_auto_ladder(const std::string& text,
                                                   const std::function<Status(const std::string&)>& check,
                                                   const std::string& flag) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string spec = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (spec.empty() || spec == "auto")
      return invalid_argument(flag + " '" + text + "': entry '" + spec + "' is not a codec spec");
    Status s = check ? check(spec) : check_codec_spec(spec);
    if (!s.ok()) return s.prepend(flag + " '" + text + "': entry '" + spec + "'");
    out.push_back(spec);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) return invalid_argument(flag + " is empty");
  return out;
}

namespace {
// A message of role other at most this big on average measures latency, not bandwidth (the norm's are 8-40 bytes).
constexpr uint64_t kSmallMessageBytes = 1024;

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f ms", s * 1e3);
  return b;
}
std::string mbit(double bps) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f Mbit/s", bps / 1e6);
  return b;
}
}  // namespace

AutoChoice choose_auto_codec(const std::vector<uint64_t>& bytes_per_mb, int current, double bandwidth_bps,
                             double compute_s_per_mb, double relax, double fit) {
  const int n = int(bytes_per_mb.size());
  current = std::clamp(current, 0, n - 1);
  auto t = [&](int i) { return double(bytes_per_mb[size_t(i)]) * 8 / bandwidth_bps; };
  const std::string budget = (fit < 1 ? std::to_string(int(std::lround(fit * 100))) + "% of " : std::string()) +
                             "compute " + ms(compute_s_per_mb) + " per microbatch at " + mbit(bandwidth_bps);
  compute_s_per_mb *= fit;
  // Less lossy, with room to spare?
  for (int i = 0; i < current; ++i)
    if (t(i) <= relax * compute_s_per_mb)
      return {i, t(i), "transfer " + ms(t(i)) + " fits in " + std::to_string(int(relax * 100)) + "% of " + budget};
  if (t(current) <= compute_s_per_mb)
    return {current, t(current), "transfer " + ms(t(current)) + " fits under " + budget};
  for (int i = current + 1; i < n; ++i)
    if (t(i) <= compute_s_per_mb) return {i, t(i), "transfer " + ms(t(i)) + " fits under " + budget};
  // Nothing fits: the fastest, or the least lossy within 10% of it (more compression would buy next to nothing).
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (t(i) < t(best)) best = i;
  int pick = best;
  for (int i = 0; i < best; ++i)
    if (t(i) <= 1.1 * t(best)) {
      pick = i;
      break;
    }
  return {pick, t(pick), "no codec's transfer fits under " + budget + "; the fastest: " + ms(t(pick))};
}

AutoChoice choose_step_codec(const std::vector<uint64_t>& bytes_per_op, int current, double bandwidth_bps,
                             int64_t ops_per_step, double step_s, double relax, double tolerance) {
  const int n = int(bytes_per_op.size());
  current = std::clamp(current, 0, n - 1);
  auto t = [&](int i) { return double(ops_per_step) * double(bytes_per_op[size_t(i)]) * 8 / bandwidth_bps; };
  // The step with codec i: the measured one, its transfers swapped for codec i's (never below the transfers).
  auto step = [&](int i) { return std::max(step_s - t(current), 0.0) + t(i); };
  int fastest = 0;
  for (int i = 1; i < n; ++i)
    if (step(i) < step(fastest)) fastest = i;
  const std::string at =
      std::to_string(ops_per_step) + " transfers a step at " + mbit(bandwidth_bps) + ", step " + ms(step_s);
  auto pct = [](double x) { return std::to_string(int(std::lround(x * 100))) + "%"; };
  for (int i = 0; i < n; ++i) {
    const double limit = (i < current ? relax : 1.0) * tolerance;
    if (step(i) <= (1 + limit) * step(fastest))
      return {i, t(i),
              "step " + ms(step(i)) + " within " + pct(limit) + " of the fastest codec's " + ms(step(fastest)) + " (" +
                  at + ")"};
  }
  return {fastest, t(fastest), "the fastest step (" + at + ")"};
}

nlohmann::json auto_decision_to_json(const AutoDecision& d) {
  return {{"step", d.step},
          {"from_step", d.from_step},
          {"link", d.link},
          {"from", d.from},
          {"to", d.to},
          {"bandwidth_bps", d.bandwidth_bps},
          {"transfer_s", d.transfer_s},
          {"compute_s", d.compute_s},
          {"latency_s", d.latency_s},
          {"reason", d.reason}};
}

Result<AutoDecision> auto_decision_from_json(const nlohmann::json& j, const std::string& where) {
  AutoDecision d;
  try {
    if (!j.is_object()) return invalid_argument(where + ": an auto decision is not an object");
    d.step = j.at("step").get<int64_t>();
    d.from_step = j.at("from_step").get<int64_t>();
    d.link = j.at("link").get<std::string>();
    d.from = j.at("from").get<std::string>();
    d.to = j.at("to").get<std::string>();
    d.bandwidth_bps = j.at("bandwidth_bps").get<double>();
    d.transfer_s = j.at("transfer_s").get<double>();
    d.compute_s = j.at("compute_s").get<double>();
    d.latency_s = j.value("latency_s", 0.0);  // absent in records written before it was measured
    d.reason = j.at("reason").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(where + ": auto decision: " + e.what());
  }
  return d;
}

AutoCodec::AutoCodec(AutoCodecConfig config, std::vector<Link> links, int workers, int microbatches)
    : config_(std::move(config)), links_(std::move(links)), workers_(workers), microbatches_(microbatches) {}

std::optional<int64_t> AutoCodec::observe(const WorkerStepMetrics& m) {
  // The first step's times are mostly warm-up (allocation, connection set-up): it only counts as reported.
  for (const LinkTraffic& t : m.step <= 1 ? std::vector<LinkTraffic>() : m.links) {
    if (t.dir != "send" || t.src != m.worker) continue;
    const bool small = t.role == "other" && t.messages > 0 && t.wire_bytes / t.messages <= kSmallMessageBytes;
    auto it = std::find_if(links_.begin(), links_.end(), [&](const Link& l) {
      return l.src == t.src && l.dst == t.dst && (l.role == t.role || small);
    });
    if (it == links_.end()) continue;
    Totals& tot = (small ? small_ : traffic_)[{t.src, t.dst}];
    tot.wire += t.wire_bytes;
    tot.messages += t.messages;
    tot.seconds += t.seconds;
    if (t.serial_s) {
      tot.serial += *t.serial_s;
      tot.serial_wire += t.wire_bytes;
    }
    if (t.latency_s && *t.latency_s > 0 && (tot.latency < 0 || *t.latency_s < tot.latency)) tot.latency = *t.latency_s;
  }
  if (m.compute_s && m.step > 1) {
    compute_s_[m.worker] += *m.compute_s;
    compute_steps_[m.worker] += 1;
  }
  if (m.tokens_per_s && *m.tokens_per_s > 0 && m.step > 1) {
    auto [it, fresh] = slowest_tps_.try_emplace(m.step, *m.tokens_per_s);
    if (!fresh) it->second = std::min(it->second, *m.tokens_per_s);
  }
  if (++reports_[m.step] < workers_) return std::nullopt;
  reports_.erase(m.step);
  if (config_.every < 1 || m.step % config_.every != 0) return std::nullopt;
  return m.step;
}

std::vector<AutoDecision> AutoCodec::decide(int64_t step) {
  std::vector<AutoDecision> out;
  // The pace of the pipeline: the slowest stage's compute per microbatch (forward and backward).
  double pace = 0;
  for (const auto& [rank, s] : compute_s_)
    pace = std::max(pace, s / std::max(1, compute_steps_[rank]) / std::max(1, microbatches_));
  for (Link& l : links_) {
    auto it = traffic_.find({l.src, l.dst});
    if (it == traffic_.end() || it->second.seconds <= 0 || it->second.wire == 0 || pace <= 0) continue;
    double step_s = 0;
    for (const auto& [st, tps] : slowest_tps_) step_s += config_.tokens_per_step / tps;
    if (!slowest_tps_.empty()) step_s /= double(slowest_tps_.size());
    // The link's rate: its wire bytes over their serial time, as the senders' meters measured it (each message's
    // completion beyond the latency and the message before it: right whatever the codec, the sizes and the queueing).
    // Records without it (older workers): the busy time less the latency it holds (from the pair's small messages),
    // once a step on a link busy most of it, else once a message; at most 99% of the busy time.
    double latency = 0, bw = 0;
    bool saturated = false;
    const Totals& tr = it->second;
    if (tr.serial > 0 && tr.serial_wire > 0) {
      bw = double(tr.serial_wire) * 8 / tr.serial;
      latency = std::max(tr.latency, 0.0);
    } else {
      if (auto sm = small_.find({l.src, l.dst}); sm != small_.end() && sm->second.messages > 0)
        latency = sm->second.seconds / double(sm->second.messages);
      const double window_s = step_s * double(slowest_tps_.size());
      saturated = window_s <= 0 || tr.seconds > 0.5 * window_s;
      const double held = saturated ? double(slowest_tps_.size()) : double(tr.messages);
      const double busy = std::max(tr.seconds - latency * held, 0.01 * tr.seconds);
      bw = double(tr.wire) * 8 / busy;
    }
    if (!l.overlaps_compute && step_s <= 0) continue;
    AutoChoice c = l.overlaps_compute
                       ? choose_auto_codec(l.bytes_per_mb, l.current, bw, pace, config_.relax, config_.fit)
                       : choose_step_codec(l.bytes_per_mb, l.current, bw, l.ops_per_step, step_s, config_.relax);
    const double weighed_against = l.overlaps_compute ? pace : step_s;
    bool unchanged = false;
    if (auto was = l.left.find(c.index); was != l.left.end()) {
      const Link::Situation& then = was->second;
      auto near = [&](double now, double before, double floor) {
        return std::abs(now - before) <= config_.changed * std::max(before, floor);
      };
      unchanged = near(bw, then.bps, 1.0) && near(latency, then.latency_s, 1e-3) &&
                  near(weighed_against, then.compute_s, 1e-6);
    }
    if (c.index == l.current || unchanged) {  // settled: back to a codec it left only once something has changed
      l.wanted = -1;
      l.wanted_times = 0;
      continue;
    }
    l.wanted_times = c.index == l.wanted ? l.wanted_times + 1 : 1;
    l.wanted = c.index;
    if (l.moved && l.wanted_times < config_.confirm) continue;
    l.moved = true;
    l.wanted = -1;
    l.wanted_times = 0;
    AutoDecision d;
    d.step = step;
    d.link = l.name;
    d.from = config_.ladder[size_t(l.current)];
    d.to = config_.ladder[size_t(c.index)];
    d.bandwidth_bps = bw;
    d.latency_s = latency;
    d.transfer_s = c.transfer_s;
    d.compute_s = weighed_against;
    d.reason = c.reason;
    if (latency > 0 && tr.serial > 0)
      d.reason += "; rate from the serial time of " + std::to_string(tr.messages) + " messages, one-way latency " +
                  ms(latency);
    else if (latency > 0)
      d.reason += "; one-way latency " + ms(latency) + " taken out of the busy time once a " +
                  (saturated ? "step (the link queues)" : "message");
    l.left[l.current] = {bw, latency, weighed_against};
    l.current = c.index;
    out.push_back(std::move(d));
  }
  reset_window();
  return out;
}

void AutoCodec::reset_window() {
  traffic_.clear();
  small_.clear();
  compute_s_.clear();
  compute_steps_.clear();
  slowest_tps_.clear();
  reports_.clear();
}

}  // namespace lh
