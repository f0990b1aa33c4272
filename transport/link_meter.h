// defines: lh::LinkMeter, per-link accounting of messages, raw vs wire bytes, busy time and an EWMA
// bandwidth estimate. Fed by every DataPlane; read by step metrics, the job summary and the compression controller.
#pragma once

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "transport/tag.h"
#include "transport/transfer.h"

namespace lh {

struct LinkStats {
  uint64_t messages = 0;
  uint64_t raw_bytes = 0;   // what the packets would have cost uncompressed in fp32
  uint64_t wire_bytes = 0;  // what actually crossed the link
  double busy_seconds = 0;  // time with at least one transfer of this kind in flight
};

// Thread-safe. One per process, shared by the data plane (which records) and whoever reports.
// Busy time is the union of [start, end] intervals of transfers, computed online: exact when
// transfers on a key complete in the order they started (the FIFO case), an underestimate otherwise.
class LinkMeter {
 public:
  // self_rank names the local end in JSON ("src"/"dst"); alpha is the EWMA weight of a new sample.
  explicit LinkMeter(int self_rank = -1, double ewma_alpha = 0.25);

  void set_self_rank(int rank);
  int self_rank() const;

  // One finished transfer. start/end bound the time the link was busy with it.
  void record(int peer, Role role, Direction dir, uint64_t raw_bytes, uint64_t wire_bytes, Clock::time_point start,
              Clock::time_point end);
  // Convenience for a finished TransferState (uses its peer, tag role, direction, bytes and times).
  void record(const TransferState& t);

  LinkStats stats(int peer, Role role, Direction dir) const;
  // All roles of one link direction together (busy time is the union over roles).
  LinkStats link_stats(int peer, Direction dir) const;
  // EWMA of wire bits per second of service time on the link; 0 before the first sample. A sample is
  // bytes / (end - max(start, end of the previous transfer on the link)), so back-to-back transfers
  // measure the link, not the queue.
  double bandwidth_bps(int peer, Direction dir) const;

  // Peers whose packets go through the job's relay: their links say "relayed": true in to_json().
  void set_relayed(std::set<int> peers);

  // {"rank": r, "links": [{"src","dst","role","dir","messages","raw_bytes","wire_bytes","seconds"[,"relayed"]}...],
  //  "bandwidth": [{"src","dst","dir","bps","busy_seconds"}...]}
  nlohmann::json to_json() const;
  // Zeroes the counters (keeps the bandwidth estimates), e.g. after each step's metrics line.
  void reset_counters();

 private:
  using RoleKey = std::tuple<int, int, int>;  // peer, role, direction
  using LinkKey = std::pair<int, int>;        // peer, direction
  struct RoleEntry {
    LinkStats stats;
    Clock::time_point covered_until{};
  };
  struct LinkEntry {
    LinkStats stats;
    Clock::time_point covered_until{};
    double ewma_bps = 0;
    bool has_sample = false;
  };

  mutable std::mutex mu_;
  int self_rank_;
  double alpha_;
  std::map<RoleKey, RoleEntry> roles_;
  std::map<LinkKey, LinkEntry> links_;
  std::set<int> relayed_;
};

}  // namespace lh
