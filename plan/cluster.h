// defines: lh::Cluster — a description of the machines a job could run on (each worker's measured compute speed and
// memory, and a matrix of link bandwidth and latency between them), read from JSON or YAML with every bad field
// named, and written back as JSON. Used by `longhaul plan` (plan/planner.h) and `longhaul probe`.
//
//   {"workers": [{"name": "a0", "gflops": 40, "memory_gb": 16, "site": "a"},
//                {"count": 3, "name": "b", "gflops": 20, "site": "b"}],          // b0, b1, b2
//    "links": {"default": {"bandwidth": "1G", "latency": "0.2ms"},
//              "matrix": {"bandwidth": [[…]], "latency": [[…]]},               // optional, row = sender
//              "rules": [{"within": "a", "bandwidth": "10G", "latency": "50us"},
//                        {"between": ["a", "b"], "bandwidth": "100M", "latency": "40ms"},
//                        {"from": "a0", "to": "b1", "bandwidth": "5M"}]}}
//
// Bandwidth: bits per second, a number or "100M" (k/M/G); latency: one-way seconds, a number or "40ms" (us/ms/s).
// The links start from `default` (required unless `matrix` is given), then `matrix`, then each rule in order, a later
// one winning. A rule names workers by name or site: `within` (every ordered pair inside), `between` (both
// directions), `from`/`to` (one direction); a rule may set bandwidth, latency or both.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

struct ClusterWorker {
  std::string name;
  std::string site;
  double gflops = 0;     // sustained training GFLOP/s (what `longhaul probe` measures)
  double memory_gb = 0;  // 0: unknown (not checked)
};

class Cluster {
 public:
  static Result<Cluster> from_json(const nlohmann::json& j, const std::string& source = "cluster");
  // JSON, or YAML when `yaml` (the same fields).
  static Result<Cluster> parse(const std::string& text, bool yaml, const std::string& source);
  // By extension: .yaml/.yml as YAML, anything else as JSON.
  static Result<Cluster> load(const std::string& path);
  // `n` identical workers on links of one shape (tests, benchmarks).
  static Cluster uniform(int n, double gflops, double bandwidth_bps, double latency_s);

  int size() const { return int(workers_.size()); }
  const std::vector<ClusterWorker>& workers() const { return workers_; }
  const ClusterWorker& worker(int i) const { return workers_.at(size_t(i)); }
  double bandwidth(int from, int to) const { return bandwidth_[size_t(from) * workers_.size() + size_t(to)]; }
  double latency(int from, int to) const { return latency_[size_t(from) * workers_.size() + size_t(to)]; }
  void set_link(int from, int to, double bandwidth_bps, double latency_s);
  void set_gflops(int worker, double gflops) { workers_.at(size_t(worker)).gflops = gflops; }

  // Workers and the full matrix (what `probe` writes; from_json reads it back to the same cluster).
  nlohmann::json to_json() const;

 private:
  std::vector<ClusterWorker> workers_;
  std::vector<double> bandwidth_, latency_;  // W×W, row = sender
};

// "100M", "1.5G", 2e8 (bits/s) and "40ms", "50us" (seconds), as the cluster file reads them, in the grammar of --link
// (transport/link_shaper.h parse_rate_bps, parse_duration_s). A latency that is a plain number is seconds only where
// `plain_seconds` (links.matrix, which probe writes); elsewhere a number other than 0 is refused naming the units.
Result<double> parse_bandwidth(const nlohmann::json& v, const std::string& field);
Result<double> parse_latency(const nlohmann::json& v, const std::string& field, bool plain_seconds);

}  // namespace lh
