// Aggregation of step metrics into per-link totals and per-step series, and their text tables.
// Used by the coordinator's end-of-job summary and `longhaul report`.
#include "metrics/metrics_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace lh {
namespace {

int role_order(const std::string& role) {
  const auto& names = role_names();
  return static_cast<int>(std::find(names.begin(), names.end(), role) - names.begin());
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Display width in columns: UTF-8 code points, so "→" takes one column.
size_t width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Text cells laid out in columns; a column whose `align` letter is 'l' is left-aligned, others right.
std::string layout(const std::vector<std::vector<std::string>>& rows, const std::string& align) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (w.size() <= c) w.push_back(0);
      w[c] = std::max(w[c], width(r[c]));
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(w[c] - width(r[c]), ' ');
      if (c) line += "  ";
      line += c < align.size() && align[c] == 'l' ? r[c] + pad : pad + r[c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// Per link key and counting end ("send" or "recv"): totals, and per step the codec and bytes.
struct LinkSide {
  LinkTotals totals;
  std::map<int64_t, std::string> codec_by_step;
  std::map<int64_t, uint64_t> raw_by_step;
  std::map<int64_t, uint64_t> wire_by_step;
  std::map<int64_t, const WorkerStepMetrics*> reported_by;
};

// Each link's totals (the sender's count where there is one), its codec switches and per-step bytes, and the sum.
void add_link_totals(std::map<LinkKey, std::map<std::string, LinkSide>>& sides, MetricsSummary& s) {
  s.total.role = "total";
  for (auto& [key, by_dir] : sides) {
    // The sender's count when there is one: a receiver cannot see bytes lost on the way.
    const std::string dir = by_dir.count("send") ? "send" : "recv";
    LinkSide& side = by_dir[dir];
    LinkTotals t = side.totals;
    std::tie(t.src, t.dst, t.role) = key;
    t.counted_by = dir;
    std::string last;
    for (const auto& [step, codec] : side.codec_by_step) {
      if (!last.empty() && codec != last) s.codec_switches.push_back({t.src, t.dst, t.role, last, codec, step});
      if (codec != last) t.codecs.push_back(codec);
      last = codec;
    }
    for (const auto& [step, bytes] : side.raw_by_step) s.raw_bytes_per_step[key].push_back({step, double(bytes)});
    for (const auto& [step, bytes] : side.wire_by_step) s.wire_bytes_per_step[key].push_back({step, double(bytes)});
    s.total.messages += t.messages;
    s.total.raw_bytes += t.raw_bytes;
    s.total.wire_bytes += t.wire_bytes;
    s.total.seconds += t.seconds;
    s.links.push_back(std::move(t));
  }
}

}  // namespace

std::string role_label(const std::string& role) {
  if (role == "act") return "act (fwd)";
  if (role == "act_grad") return "act_grad (bwd)";
  return role;
}

Result<MetricsSummary> summarize_step_metrics(const std::vector<WorkerStepMetrics>& records) {
  MetricsSummary s;
  s.records = records.size();
  auto line_of = [](const WorkerStepMetrics& m) {
    return m.source_line > 0 ? "line " + std::to_string(m.source_line) : std::string("a record");
  };
  std::map<std::pair<int64_t, int>, const WorkerStepMetrics*> seen;  // (step, worker)
  std::set<int> workers;
  std::map<LinkKey, std::map<std::string, LinkSide>> sides;
  std::map<int64_t, std::vector<double>> loss, val;
  std::map<int64_t, double> tps;

  for (const WorkerStepMetrics& m : records) {
    auto [it, fresh] = seen.emplace(std::make_pair(m.step, m.worker), &m);
    if (!fresh)
      return invalid_argument("metrics: " + line_of(m) + " repeats step " + std::to_string(m.step) + " of worker " +
                              std::to_string(m.worker) + " (first at " + line_of(*it->second) + ")");
    workers.insert(m.worker);
    for (const nlohmann::json& d : m.auto_decisions) {
      auto decision = auto_decision_from_json(d, "metrics: " + line_of(m));
      if (!decision.ok()) return decision.status();
      s.auto_decisions.push_back(std::move(decision).value());
    }
    if (m.loss) loss[m.step].push_back(*m.loss);
    if (m.val_loss) val[m.step].push_back(*m.val_loss);
    if (m.tokens_per_s) {
      auto t = tps.find(m.step);
      tps[m.step] = t == tps.end() ? *m.tokens_per_s : std::min(t->second, *m.tokens_per_s);
    }
    for (const LinkTraffic& l : m.links) {
      LinkSide& side = sides[LinkKey{l.src, l.dst, l.role}][l.dir];
      auto [rep, first] = side.reported_by.emplace(m.step, &m);
      if (!first)
        return invalid_argument("metrics: " + line_of(m) + " counts link " + std::to_string(l.src) + "→" +
                                std::to_string(l.dst) + " " + l.role + " (" + l.dir + ") at step " +
                                std::to_string(m.step) + " again (already at " + line_of(*rep->second) + ")");
      LinkTotals& t = side.totals;
      t.messages += l.messages;
      t.raw_bytes += l.raw_bytes;
      t.wire_bytes += l.wire_bytes;
      t.seconds += l.seconds;
      side.raw_by_step[m.step] += l.raw_bytes;
      side.wire_by_step[m.step] += l.wire_bytes;
      if (!l.codec.empty()) side.codec_by_step[m.step] = l.codec;
      if (!l.link.empty()) t.link = l.link;
      t.relayed |= l.relayed;
    }
  }
  s.workers = static_cast<int>(workers.size());
  if (!seen.empty()) {
    s.first_step = seen.begin()->first.first;
    s.last_step = seen.rbegin()->first.first;
  }

  add_link_totals(sides, s);
  std::sort(s.links.begin(), s.links.end(), [](const LinkTotals& a, const LinkTotals& b) {
    return std::make_tuple(role_order(a.role), a.src, a.dst) < std::make_tuple(role_order(b.role), b.src, b.dst);
  });
  std::stable_sort(s.auto_decisions.begin(), s.auto_decisions.end(),
                   [](const AutoDecision& a, const AutoDecision& b) { return a.step < b.step; });
  std::sort(s.codec_switches.begin(), s.codec_switches.end(), [](const CodecSwitch& a, const CodecSwitch& b) {
    return std::make_tuple(a.step, a.src, a.dst, role_order(a.role)) <
           std::make_tuple(b.step, b.src, b.dst, role_order(b.role));
  });
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / double(v.size());
  };
  for (const auto& [step, v] : loss) s.loss.push_back({step, mean(v), int(v.size())});
  for (const auto& [step, v] : val) s.val_loss.push_back({step, mean(v)});
  for (const auto& [step, v] : tps) s.tokens_per_s.push_back({step, v});
  return s;
}

bool folded_role(const std::string& role) {
  return role == "other";
}

std::vector<LinkTotals> folded_links(const MetricsSummary& s) {
  std::vector<LinkTotals> rows, folded;  // folded: one per folded role, after that role's own rows
  // A pair whose messages are tensors (evaluation activations between pipeline neighbours, at least
  // 1 KiB a message on average) keeps its row; the few-byte grad-norm chatter among all pairs folds.
  auto carries_tensors = [](const LinkTotals& t) { return t.messages > 0 && t.raw_bytes >= 1024 * t.messages; };
  auto flush = [&] {
    rows.insert(rows.end(), folded.begin(), folded.end());
    folded.clear();
  };
  for (const LinkTotals& link : s.links) {
    LinkTotals t = link;
    t.members = {LinkKey{t.src, t.dst, t.role}};
    if (!folded.empty() && folded.back().role != t.role) flush();
    if (!folded_role(t.role) || carries_tensors(t)) {
      rows.push_back(std::move(t));
      continue;
    }
    if (folded.empty()) {
      folded.push_back(std::move(t));
      continue;
    }
    LinkTotals& f = folded.back();
    f.members.push_back(t.members.front());
    f.src = f.dst = -1;
    ++f.pairs;
    if (f.counted_by != t.counted_by) f.counted_by = "send+recv";
    f.messages += t.messages;
    f.raw_bytes += t.raw_bytes;
    f.wire_bytes += t.wire_bytes;
    f.seconds += t.seconds;
    for (const std::string& c : t.codecs)
      if (std::find(f.codecs.begin(), f.codecs.end(), c) == f.codecs.end()) f.codecs.push_back(c);
  }
  flush();
  return rows;
}

std::string link_label(const LinkTotals& t) {
  if (t.pairs > 1) return std::to_string(t.pairs) + " pairs";
  return std::to_string(t.src) + "→" + std::to_string(t.dst);
}

std::string format_link_table(const MetricsSummary& s) {
  if (s.links.empty()) return "no link traffic recorded\n";
  std::vector<std::vector<std::string>> rows;
  // Jobs whose workers name their links get a column with the name (the one --link, --compress-link and ctl take).
  bool named = false;
  for (const LinkTotals& t : s.links) named |= !t.link.empty();
  rows.push_back({"link", "role", "messages", "raw MB", "wire MB", "ratio", "saved", "busy s", "codec"});
  if (named) rows.back().insert(rows.back().begin() + 1, "name");
  auto cells = [](const LinkTotals& t, const std::string& link, const std::string& role, const std::string& codec) {
    const bool any = t.wire_bytes > 0;
    return std::vector<std::string>{
        link,
        role,
        std::to_string(t.messages),
        fmt("%.2f", t.raw_bytes / 1e6),
        fmt("%.2f", t.wire_bytes / 1e6),
        any ? fmt("%.2fx", t.ratio()) : "-",
        any && t.raw_bytes ? fmt("%.1f%%", 100.0 * (1.0 - double(t.wire_bytes) / double(t.raw_bytes))) : "-",
        fmt("%.2f", t.seconds),
        codec};
  };
  bool any_recv = false, folded_recv = false, any_relayed = false;
  std::string folded_notes;
  for (const LinkTotals& t : folded_links(s)) {
    // A folded row lists its codecs (usually none) as a set: its pairs may have used them in any order.
    std::string codec;
    for (size_t i = 0; i < t.codecs.size(); ++i) codec += (i ? (t.pairs > 1 ? ", " : "→") : "") + t.codecs[i];
    std::string link = link_label(t);
    if (t.relayed && t.pairs == 1) {  // a folded row's pairs may differ
      link += " relayed";
      any_relayed = true;
    }
    if (t.counted_by != "send") {
      link += "*";
      if (t.pairs > 1)
        folded_recv = true;
      else
        any_recv = true;
    }
    if (t.pairs > 1)
      folded_notes += t.role + " = " + std::to_string(t.pairs) +
                      " worker pairs of small messages (grad-norm exchanges), summed into one row\n";
    rows.push_back(cells(t, link, role_label(t.role), codec));
    if (named) rows.back().insert(rows.back().begin() + 1, t.pairs > 1 || t.link.empty() ? "-" : t.link);
  }
  rows.push_back(cells(s.total, "total", "", ""));
  if (named) rows.back().insert(rows.back().begin() + 1, "");
  std::string out = layout(rows, named ? "lllrrrrrrl" : "llrrrrrrl");
  out += "MB = 10^6 bytes; raw = the same tensors sent uncompressed in fp32; busy s = seconds the link was busy\n";
  out += folded_notes;
  if (any_relayed)
    out += "relayed = through the job's relay on the coordinator's host (the pair could not connect directly)\n";
  if (any_recv || folded_recv)
    out += std::string("* counted by the receiver (the sender reported nothing for this link") +
           (folded_recv ? ", or for some of these pairs)\n" : ")\n");
  return out;
}

std::string format_step_summary(const MetricsSummary& s, int rows) {
  std::string out;
  if (s.records == 0) return "no step metrics recorded\n";
  out += "steps " + std::to_string(s.first_step) + ".." + std::to_string(s.last_step) + ", " +
         std::to_string(s.records) + " records from " + std::to_string(s.workers) +
         (s.workers == 1 ? " worker\n" : " workers\n");
  if (!s.loss.empty()) {
    std::vector<std::vector<std::string>> table{{"step", "loss"}};
    const size_t n = s.loss.size(), k = std::min<size_t>(n, std::max(rows, 2));
    size_t prev = n;
    for (size_t i = 0; i < k; ++i) {
      size_t idx = k == 1 ? 0 : (i * (n - 1) + (k - 1) / 2) / (k - 1);  // evenly spaced, ends included
      if (idx == prev) continue;
      prev = idx;
      table.push_back({std::to_string(s.loss[idx].step), fmt("%.4f", s.loss[idx].value)});
    }
    out += layout(table, "rr");
    auto best = std::min_element(s.loss.begin(), s.loss.end(),
                                 [](const StepPoint& a, const StepPoint& b) { return a.value < b.value; });
    out += "loss: first " + fmt("%.4f", s.loss.front().value) + ", last " + fmt("%.4f", s.loss.back().value) +
           ", min " + fmt("%.4f", best->value) + " at step " + std::to_string(best->step) + "\n";
  } else {
    out += "no loss recorded\n";
  }
  if (!s.val_loss.empty())
    out += "validation loss: last " + fmt("%.4f", s.val_loss.back().value) + " at step " +
           std::to_string(s.val_loss.back().step) + "\n";
  if (!s.tokens_per_s.empty()) {
    double sum = 0;
    for (const StepPoint& p : s.tokens_per_s) sum += p.value;
    out += "tokens/s: mean " + fmt("%.1f", sum / double(s.tokens_per_s.size())) + " over " +
           std::to_string(s.tokens_per_s.size()) + " steps (the slowest worker of each step)\n";
  }
  for (const CodecSwitch& c : s.codec_switches)
    out += "codec change: " + std::to_string(c.src) + "→" + std::to_string(c.dst) + " " + role_label(c.role) + " " +
           c.from + " → " + c.to + " from step " + std::to_string(c.step) + "\n";
  for (const AutoDecision& d : s.auto_decisions)
    out += "auto, after step " + std::to_string(d.step) + ": " + d.link + " " + d.from + " → " + d.to + " from step " +
           std::to_string(d.from_step) + " (" + d.reason + ")\n";
  return out;
}

}  // namespace lh
