// defines: lh::probe_peers — the pre-flight of a job: before step 1, every pair of workers that must talk tries
// its data-plane connection and measures it (round trip of small messages, a short send-rate burst each way).
// Used by the pipeline worker (results go to the coordinator in Ready, which prints the reachability matrix, fails
// the job fast on an unreachable pair, and serves it to `ctl status` and `longhaul probe --coordinator`).
#pragma once

#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "grid/topology.h"
#include "transport/data_plane.h"
#include "transport/messages.h"

namespace lh {

// The pairs (low rank, high rank) a job's workers exchange data-plane packets on: every two workers of one model
// replica (pipeline neighbours, tp shards, and the gradient norm's all-pairs exchange) and every two replicas of one
// stage shard (the dp group). In the order every worker probes them (by low rank, then high rank), which keeps
// the pairwise exchanges free of deadlock: the first pair not yet done is the first for both its ends.
std::vector<std::pair<int, int>> talking_pairs(const Topology& topology);

struct ProbeOptions {
  int pings = 3;  // round trips timed per pair and way (the median is kept)
  // The send-rate burst grows 4 KiB, 16 KiB, … up to max_burst_bytes, and stops once one burst took longer than
  // burst_time beyond the round trip (after at least two): the rate is the last two bursts' difference in bytes over
  // their difference in time, which takes the round trip out.
  uint32_t max_burst_bytes = 4u << 20;
  std::chrono::milliseconds burst_time{50};
  // How long one message may take before the pair counts as unreachable.
  std::chrono::milliseconds timeout{10000};
  // reach_peers: how long the direct hellos of every pair may take together (explicit, so a pair that cannot connect
  // is known within seconds, not after the kernel's SYN retries).
  std::chrono::milliseconds connect_timeout{5000};
  // Polled while waiting: true when the worker must give up (its job rolled back or shut down).
  std::function<bool()> cancelled;
};

// The pre-flight's first phase: this rank sends one small hello to every peer it talks to and waits for theirs, all at
// once, for at most options.connect_timeout. One PeerProbe per peer: ok when its hello arrived (the peer reaches this
// rank directly), else the error says what was seen. The coordinator joins both ends' answers (a pair is direct when
// each heard the other) and tells the workers which pairs go through the relay. Uses tag (step 0, slot 0, role other,
// shard 3).
Result<std::vector<PeerProbe>> reach_peers(DataPlane& plane, const Topology& topology, int rank,
                                           const ProbeOptions& options = {});

// Runs this rank's part of the pre-flight over `plane` (connected; a LinkShaper on top shapes it as training would
// be) and returns one PeerProbe per peer it talks to. Stops at the first pair that fails (that entry says why), so
// the coordinator can end the job at once. Uses tag (step 0, slot n, role other, shard 2): step 0 is no training
// step. The bytes it sends are metered like any traffic; the caller resets the meter's counters afterwards.
Result<std::vector<PeerProbe>> probe_peers(DataPlane& plane, const Topology& topology, int rank,
                                           const ProbeOptions& options = {});

}  // namespace lh
