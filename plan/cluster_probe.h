// defines: lh::cluster_from_measurements — a cluster description for `longhaul plan` from what a job measured:
// each worker's GFLOP/s from its compute seconds, each link's bandwidth and latency from the pre-flight probe
// (comm/peer_probe.h) or, without one, from the bulk traffic in the step metrics. Used by `longhaul probe`
// (--from-metrics: a finished job's file; --coordinator: a running job, through `ctl cluster`).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "metrics/step_metrics.h"
#include "plan/cluster.h"
#include "plan/job_config.h"

namespace lh {

// Workers: the FLOPs of their slice per step over their median compute seconds (steps after the first; a worker
// without such a record is an error naming it). Links: `preflight` entries ({"src","dst","ok","rtt_ms","mbps"}, as
// Coordinator::preflight_json) give bandwidth src → dst and latency = round trip / 2; links they do not cover take
// the senders' wire bytes of messages of at least 16 KiB over their serial seconds (over their busy seconds in records
// without serial_s) and the median of the senders' one-way latency_s; links with neither the median of the measured
// ones (latency 0 without a probe or latency_s). `source` names the records in errors.
Result<Cluster> cluster_from_measurements(const JobConfig& job, const std::vector<WorkerStepMetrics>& records,
                                          const nlohmann::json& preflight, const std::string& source);

}  // namespace lh
