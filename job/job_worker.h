// defines: run_job_worker — one worker process of a pipeline job: join the coordinator, take the
// Plan (rank, peers, codecs, job config), connect the UCX data plane (optionally behind a LinkShaper),
// train its stage step by step, apply live codec changes at step boundaries, send metrics, and stop
// with a clear error when a peer is lost. Used by `longhaul worker` and `longhaul launch`.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "core/status.h"
#include "transport/link_shaper.h"
#include "transport/ucx_data_plane.h"
#include "transport/zmq_loop.h"

namespace lh {

struct JobWorkerOptions {
  std::string coordinator;  // "tcp://HOST:PORT"
  std::string token;
  std::optional<ZmqLoop::Curve> curve;  // the control plane's encryption (JobSecret::client_curve)
  std::string hostname;                 // empty: gethostname()
  std::string site;                     // --site: where it is (the coordinator keeps each site's ranks together)
  double compute_speed = 0;             // measured GFLOP/s for `--partition speed`; 0: unknown
  UcxOptions ucx;
  std::optional<LinkShape> link;  // in-process shaper on every outgoing link
  std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds receive_timeout{std::chrono::minutes(10)};
  // How long a worker whose coordinator went silent waits for one to answer again at the same address (a coordinator
  // restarted with --resume), rejoining as the same rank; 0: the job ends for this worker.
  std::chrono::milliseconds coordinator_timeout{0};
  // Called once the coordinator's plan has given this worker its rank (the app names the process).
  std::function<void(int rank)> on_rank;
  // The rank this worker asks for (its place in the grid, e.g. next to its pipeline neighbours' site); −1: any. A
  // rank another worker already holds is not given: the worker then takes a free one.
  int rank = -1;
  // How long the pre-flight's direct hellos may take before a pair counts as unable to connect directly (and goes
  // through the relay, or ends the job with --no-relay).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
  // As root with nftables: only the job's members (their interfaces' addresses, from the plan) and the loopback may
  // reach this worker's data ports (transport/allow_list.h); until the plan comes, only the loopback. Renewed every
  // epoch. Off (--no-allow-list), or without root or nft: any address may (logged once).
  bool allow_list = true;
  // Polled while the worker trains: non-empty once this process was told to stop (SIGTERM from its scheduler; the
  // text says so). The worker asks the coordinator to preempt the job: every worker saves a checkpoint after the step
  // the coordinator names and stops there (the job then resumes from it with --resume).
  std::function<std::string()> stop_requested;
  // Called with true when the worker's training loop begins (its plan, data plane and pre-flight done) and with false
  // when it ends: a stop requested outside it has nothing to save.
  std::function<void(bool)> on_training;
};

// The caller names the process in logs (set_log_role) once it knows; this function never does,
// so several workers can share a process in tests.
// Returns OK when the job's steps are done (or the coordinator shut the job down cleanly after
// them); an error naming the lost worker when a peer dies; any setup error (bad plan, data) as is.
Status run_job_worker(const JobWorkerOptions& options);

}  // namespace lh
