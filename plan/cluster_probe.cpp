// Cluster descriptions from a job's measurements (see cluster_probe.h).
#include "plan/cluster_probe.h"

#include <algorithm>
#include <map>

#include "plan/planner.h"

namespace lh {
namespace {

constexpr uint64_t kBulkMessageBytes = 16 * 1024;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<Cluster> cluster_from_measurements(const JobConfig& job, const std::vector<WorkerStepMetrics>& records,
                                          const nlohmann::json& preflight, const std::string& source) {
  LH_ASSIGN_OR_RETURN(std::vector<double> flops, train_flops_per_step(job));
  std::map<int, std::vector<double>> compute;
  // (src, dst) → wire bytes and busy seconds; wire bytes and serial seconds (where the records carry them); one-way
  // latencies the senders' meters measured.
  struct Traffic {
    double wire = 0, seconds = 0, serial_wire = 0, serial = 0;
  };
  std::map<std::pair<int, int>, Traffic> traffic;
  std::map<std::pair<int, int>, std::vector<double>> latencies;
  for (const auto& m : records) {
    if (m.worker < 0 || m.worker >= job.workers)
      return invalid_argument(source + (m.source_line > 0 ? " line " + std::to_string(m.source_line) : "") +
                              ": worker " + std::to_string(m.worker) + " is outside the job's " +
                              std::to_string(job.workers) + " workers (give the job's flags)");
    if (m.step < 2) continue;
    if (m.compute_s && *m.compute_s > 0) compute[m.worker].push_back(*m.compute_s);
    for (const auto& l : m.links) {
      if (l.dir != "send" || l.src < 0 || l.dst < 0 || l.src >= job.workers || l.dst >= job.workers) continue;
      if (l.latency_s && *l.latency_s > 0) latencies[{l.src, l.dst}].push_back(*l.latency_s);
      // Only bulk transfers tell a link's bandwidth: a small message's busy time is mostly latency (the gradient
      // norm's 8 bytes would read as a few kbit/s). Their serial time (transport/link_meter.h) is the link's rate
      // whatever the delay; the busy time, in older records, holds the latency too.
      if (l.seconds <= 0 || l.messages == 0 || l.wire_bytes / l.messages < kBulkMessageBytes) continue;
      Traffic& t = traffic[{l.src, l.dst}];
      t.wire += double(l.wire_bytes);
      t.seconds += l.seconds;
      if (l.serial_s && *l.serial_s > 0) {
        t.serial_wire += double(l.wire_bytes);
        t.serial += *l.serial_s;
      }
    }
  }
  std::map<std::pair<int, int>, double> bw, rtt;
  for (const auto& [pair, t] : traffic) bw[pair] = t.serial > 0 ? t.serial_wire * 8 / t.serial : t.wire * 8 / t.seconds;
  for (const auto& [pair, v] : latencies) rtt[pair] = 2 * median(v);  // both ways' latency, as the probe's round trip
  for (const auto& e : preflight) {
    if (!e.is_object() || !e.value("ok", false)) continue;
    const int a = e.value("src", -1), b = e.value("dst", -1);
    if (a < 0 || b < 0 || a >= job.workers || b >= job.workers || a == b) continue;
    const double mbps = e.value("mbps", 0.0), rtt_ms = e.value("rtt_ms", 0.0);
    if (mbps > 0) bw[{a, b}] = mbps * 1e6;
    if (rtt_ms > 0) rtt[{a, b}] = rtt[{b, a}] = rtt_ms / 1e3;  // a round trip is both ways' latency
  }
  std::vector<double> bws, lats;
  for (const auto& [pair, v] : bw) bws.push_back(v);
  for (const auto& [pair, v] : rtt) lats.push_back(v / 2);
  const double default_bw = bws.empty() ? 1e10 : median(bws);
  const double default_lat = lats.empty() ? 0 : median(lats);
  Cluster c = Cluster::uniform(job.workers, 1, default_bw, default_lat);
  for (int r = 0; r < job.workers; ++r) {
    auto it = compute.find(r);
    if (it == compute.end())
      return invalid_argument(source + ": worker " + std::to_string(r) +
                              " reported no compute_s after step 1 (run more steps)");
    c.set_gflops(r, flops[size_t(r)] / median(it->second) / 1e9);
  }
  for (int a = 0; a < job.workers; ++a)
    for (int b = 0; b < job.workers; ++b) {
      if (a == b) continue;
      auto bi = bw.find({a, b});
      auto ri = rtt.find({a, b});
      if (bi == bw.end() && ri == rtt.end()) continue;
      c.set_link(a, b, bi != bw.end() ? bi->second : default_bw, ri != rtt.end() ? ri->second / 2 : default_lat);
    }
  return c;
}

}  // namespace lh
