// Adaptive compression of pipeline links: the codec choice per link and direction, and the window of measurements
// it is made from. Used by JobCoordinator.
#include "plan/auto_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/sync_config.h"
#include "grid/codec_plan.h"

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

Result<std::vector<std::string>> parse_auto_grad_ladder(const std::string& text) {
  return parse_auto_ladder(
      text, [](const std::string& g) { return check_grad_codec_spec(g); }, "--auto-grad-ladder");
}

Result<std::vector<std::string>> parse_auto_tp_ladder(const std::string& text) {
  return parse_auto_ladder(text, {}, "--auto-tp-ladder");
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
  // One link's choice by the same rule as a pipeline's links together.
  auto jc = choose_jointly({n}, {current}, [&](const std::vector<int>& c) -> Result<double> { return step(c[0]); },
                           relax, tolerance);
  const int i = jc.ok() ? jc->index[0] : fastest;
  const double limit = (i < current ? relax : 1.0) * tolerance;
  return {i, t(i),
          "step " + ms(step(i)) + " within " + pct(limit) + " of the fastest codec's " + ms(step(fastest)) + " (" + at +
              ")"};
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

Result<JointChoice> choose_jointly(const std::vector<int>& sizes, const std::vector<int>& current_in,
                                   const std::function<Result<double>(const std::vector<int>&)>& step, double relax,
                                   double tolerance) {
  const size_t n = sizes.size();
  if (current_in.size() != n) return invalid_argument("choose_jointly: a current entry for each of the links");
  std::vector<int> current(n), lossiest(n);
  for (size_t k = 0; k < n; ++k) {
    if (sizes[k] < 1) return invalid_argument("choose_jointly: link " + std::to_string(k) + " has an empty ladder");
    current[k] = std::clamp(current_in[k], 0, sizes[k] - 1);
    lossiest[k] = sizes[k] - 1;
  }
  // The fastest choice: from the faster of the current codecs and the lossiest ones, each link in turn moved to the
  // entry that shortens the step most, until none does.
  std::vector<int> choice = current;
  LH_ASSIGN_OR_RETURN(double fastest, step(choice));
  LH_ASSIGN_OR_RETURN(double all_lossiest, step(lossiest));
  if (all_lossiest < fastest) {
    choice = lossiest;
    fastest = all_lossiest;
  }
  for (int round = 0; round < 8; ++round) {
    bool moved = false;
    for (size_t k = 0; k < n; ++k)
      for (int i = 0; i < sizes[k]; ++i) {
        if (i == choice[k]) continue;
        std::vector<int> t = choice;
        t[k] = i;
        LH_ASSIGN_OR_RETURN(double s, step(t));
        if (s < fastest * (1 - 1e-9)) {
          fastest = s;
          choice = std::move(t);
          moved = true;
        }
      }
    if (!moved) break;
  }
  // Then each link in turn on the least lossy entry that keeps the whole step within the tolerance of the fastest:
  // the links share the tolerance, so many links each a little slower do not add up to a slow step.
  double now = fastest;
  for (size_t k = 0; k < n; ++k)
    for (int i = 0; i < choice[k]; ++i) {
      std::vector<int> t = choice;
      t[k] = i;
      LH_ASSIGN_OR_RETURN(double s, step(t));
      if (s <= (1 + (i < current[k] ? relax : 1.0) * tolerance) * fastest) {
        choice = std::move(t);
        now = s;
        break;
      }
    }
  return JointChoice{choice, fastest, now};
}

std::vector<AutoDecision> AutoCodec::decide(int64_t step) {
  std::vector<AutoDecision> out;
  // The pace of the pipeline: the slowest stage's compute per microbatch (forward and backward).
  double pace = 0;
  for (const auto& [rank, s] : compute_s_)
    pace = std::max(pace, s / std::max(1, compute_steps_[rank]) / std::max(1, microbatches_));
  double step_s = 0;
  for (const auto& [st, tps] : slowest_tps_) step_s += config_.tokens_per_step / tps;
  if (!slowest_tps_.empty()) step_s /= double(slowest_tps_.size());
  const std::vector<Measured> measured = measure_links(pace, step_s);
  const std::optional<PipelineCosts> costs = pipeline_costs();
  std::map<size_t, AutoChoice> by_step;
  if (costs) by_step = choose_pipeline_links(measured, *costs);
  for (size_t k = 0; k < links_.size(); ++k) {
    if (!measured[k].ok) continue;
    auto joint_choice = by_step.find(k);
    const AutoChoice* joint = joint_choice != by_step.end() ? &joint_choice->second : nullptr;
    if (auto d = decide_link(k, measured[k], joint, pace, step_s, step)) out.push_back(std::move(*d));
  }
  reset_window();
  return out;
}

// What the window says of each link: its rate, latency, and the records it comes from.
std::vector<AutoCodec::Measured> AutoCodec::measure_links(double pace, double step_s) const {
  std::vector<Measured> measured(links_.size());
  for (size_t k = 0; k < links_.size(); ++k) {
    const Link& l = links_[k];
    auto it = traffic_.find({l.src, l.dst});
    if (it == traffic_.end() || it->second.seconds <= 0 || it->second.wire == 0 || pace <= 0) continue;
    Measured& m = measured[k];
    m.tr = &it->second;
    const Totals& tr = it->second;
    // The link's rate: its wire bytes over their serial time, as the senders' meters measured it (each message's
    // completion beyond the latency and the message before it: right whatever the codec, the sizes and the queueing).
    // Records without it (older workers): the busy time less the latency it holds (from the pair's small messages),
    // once a step on a link busy most of it, else once a message; at most 99% of the busy time.
    if (tr.serial > 0 && tr.serial_wire > 0) {
      m.bw = double(tr.serial_wire) * 8 / tr.serial;
      m.latency = std::max(tr.latency, 0.0);
    } else {
      if (auto sm = small_.find({l.src, l.dst}); sm != small_.end() && sm->second.messages > 0)
        m.latency = sm->second.seconds / double(sm->second.messages);
      const double window_s = step_s * double(slowest_tps_.size());
      m.saturated = window_s <= 0 || tr.seconds > 0.5 * window_s;
      const double held = m.saturated ? double(slowest_tps_.size()) : double(tr.messages);
      const double busy = std::max(tr.seconds - m.latency * held, 0.01 * tr.seconds);
      m.bw = double(tr.wire) * 8 / busy;
    }
    m.ok = !(!l.overlaps_compute && step_s <= 0);
  }
  return measured;
}

// The step as it runs now, for the pipeline simulator: each stage's compute per microbatch (its slowest rank's,
// backward twice forward, as the planner takes it); the auto links' transfers and latencies are filled in later.
// None without a pipeline of two stages or more, or when a rank's stage is unknown.
std::optional<PipelineCosts> AutoCodec::pipeline_costs() const {
  std::optional<PipelineCosts> costs;
  const AutoCodecConfig::Pipeline* pipe = config_.pipeline ? &*config_.pipeline : nullptr;
  if (pipe && pipe->stages >= 2) {
    PipelineCosts c;
    c.transfer = 0;
    c.latency = 0;
    c.stage_forward.assign(size_t(pipe->stages), 0);
    c.stage_backward.assign(size_t(pipe->stages), 0);
    c.fwd_transfer.assign(size_t(pipe->stages - 1), 0);
    c.bwd_transfer.assign(size_t(pipe->stages - 1), 0);
    c.fwd_latency.assign(size_t(pipe->stages - 1), 0);
    c.bwd_latency.assign(size_t(pipe->stages - 1), 0);
    bool known = true;
    for (const auto& [rank, total] : compute_s_) {
      auto st = pipe->stage_of.find(rank);
      if (st == pipe->stage_of.end() || st->second < 0 || st->second >= pipe->stages) {
        known = false;
        continue;
      }
      const double per_mb = total / std::max(1, compute_steps_.at(rank)) / std::max(1, microbatches_);
      c.stage_forward[size_t(st->second)] = std::max(c.stage_forward[size_t(st->second)], per_mb / 3);
      c.stage_backward[size_t(st->second)] = std::max(c.stage_backward[size_t(st->second)], 2 * per_mb / 3);
    }
    if (known) costs = c;
  }
  return costs;
}

// The pipeline's auto links (between adjacent stages) are chosen together, by the step the simulator predicts with
// every one of them at its measured rate and latency. Keyed by index into links_.
std::map<size_t, AutoChoice> AutoCodec::choose_pipeline_links(const std::vector<Measured>& measured,
                                                              PipelineCosts costs) const {
  std::map<size_t, AutoChoice> by_step;
  const AutoCodecConfig::Pipeline* pipe = &*config_.pipeline;
  std::vector<size_t> joint;                // into links_
  std::vector<std::pair<size_t, bool>> at;  // its pipeline link and direction (forward)
  for (size_t k = 0; k < links_.size(); ++k) {
    const Link& l = links_[k];
    if (!measured[k].ok || !l.overlaps_compute) continue;
    const int a = pipe->stage_of.count(l.src) ? pipe->stage_of.at(l.src) : -1;
    const int b = pipe->stage_of.count(l.dst) ? pipe->stage_of.at(l.dst) : -1;
    if (a < 0 || b < 0 || std::abs(a - b) != 1) continue;
    joint.push_back(k);
    at.emplace_back(size_t(std::min(a, b)), a < b);
    (a < b ? costs.fwd_latency : costs.bwd_latency)[size_t(std::min(a, b))] = measured[k].latency;
  }
  auto schedule = PipelineSchedule::build(pipe->kind, pipe->stages, microbatches_);
  if (!joint.empty() && schedule.ok()) {
    auto transfer = [&](size_t j, int i) {
      return double(links_[joint[j]].bytes_per_mb[size_t(i)]) * 8 / measured[joint[j]].bw;
    };
    auto step_of = [&](const std::vector<int>& choice) -> Result<double> {
      PipelineCosts c = costs;
      for (size_t j = 0; j < joint.size(); ++j)
        (at[j].second ? c.fwd_transfer : c.bwd_transfer)[at[j].first] = transfer(j, choice[j]);
      LH_ASSIGN_OR_RETURN(PipelineSimResult sim, simulate_pipeline(*schedule, c));
      return sim.makespan;
    };
    std::vector<int> sizes, current;
    for (size_t k : joint) {
      sizes.push_back(int(links_[k].bytes_per_mb.size()));
      current.push_back(links_[k].current);
    }
    auto jc = choose_jointly(sizes, current, step_of, config_.relax, config_.step_tolerance);
    if (jc.ok()) {
      const std::string model = std::string("the pipeline simulator's step (") + schedule_kind_name(pipe->kind) + ", " +
                                std::to_string(pipe->stages) + " stages, " + std::to_string(microbatches_) +
                                " microbatches, every auto link at its measured rate and latency)";
      const std::string pct = std::to_string(int(std::lround(config_.step_tolerance * 100))) + "%";
      for (size_t j = 0; j < joint.size(); ++j)
        by_step[joint[j]] =
            AutoChoice{jc->index[j], transfer(j, jc->index[j]),
                       "step " + ms(jc->step_s) + " within " + pct + " of the fastest codecs' " + ms(jc->fastest_s) +
                           " (" + model + "; this link at " + mbit(measured[joint[j]].bw) + ")"};
    }
  }
  return by_step;
}

// Link k's decision for this window, if it changes codec: `joint` is its choice with the pipeline's other auto links
// (else it is chosen on its own, against the pace or the step); a codec it left is taken again only once the
// measurements have changed, and a second move waits for `confirm` windows that want it.
std::optional<AutoDecision> AutoCodec::decide_link(size_t k, const Measured& m, const AutoChoice* joint, double pace,
                                                   double step_s, int64_t step) {
  Link& l = links_[k];
  const double bw = m.bw, latency = m.latency;
  const Totals& tr = *m.tr;
  AutoChoice c = joint ? *joint
                 : l.overlaps_compute
                     ? choose_auto_codec(l.bytes_per_mb, l.current, bw, pace, config_.relax, config_.fit)
                     : choose_step_codec(l.bytes_per_mb, l.current, bw, l.ops_per_step, step_s, config_.relax);
  const double weighed_against = l.overlaps_compute ? pace : step_s;
  bool unchanged = false;
  if (auto was = l.left.find(c.index); was != l.left.end()) {
    const Link::Situation& then = was->second;
    auto near = [&](double now, double before, double floor) {
      return std::abs(now - before) <= config_.changed * std::max(before, floor);
    };
    unchanged =
        near(bw, then.bps, 1.0) && near(latency, then.latency_s, 1e-3) && near(weighed_against, then.compute_s, 1e-6);
  }
  if (c.index == l.current || unchanged) {  // settled: back to a codec it left only once something has changed
    l.wanted = -1;
    l.wanted_times = 0;
    return std::nullopt;
  }
  l.wanted_times = c.index == l.wanted ? l.wanted_times + 1 : 1;
  l.wanted = c.index;
  if (l.moved && l.wanted_times < config_.confirm) return std::nullopt;
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
    d.reason +=
        "; rate from the serial time of " + std::to_string(tr.messages) + " messages, one-way latency " + ms(latency);
  else if (latency > 0)
    d.reason += "; one-way latency " + ms(latency) + " taken out of the busy time once a " +
                (m.saturated ? "step (the link queues)" : "message");
  l.left[l.current] = {bw, latency, weighed_against};
  l.current = c.index;
  return d;
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
