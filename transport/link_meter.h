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
  // The link's own time for these messages: per message, what its completion took beyond the link's one-way latency
  // and the message before it (end − max(start + latency, previous end on the link)). On a FIFO link with a fixed
  // delay this is each message's serialization, bytes / rate, whatever the message sizes and however they queue: wire
  // bytes over it is the link's rate (bandwidth_of), where busy_seconds mixes in the latency once per busy spell.
  double serial_seconds = 0;
};
// wire bits per second of serial time (0 when there is none).
double bandwidth_of(const LinkStats& s);

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

  // The link's one-way latency as its quickest messages saw it: the least time from posting a message to its completion
  // (a small message's is the latency alone; the pre-flight's pings give the first), over the last minute or so.
  // 0 before any message.
  double latency_s(int peer, Direction dir) const;

  // Peers whose packets go through the job's relay: their links say "relayed": true in to_json().
  void set_relayed(std::set<int> peers);

  // {"rank": r, "links": [{"src","dst","role","dir","messages","raw_bytes","wire_bytes","seconds","serial_s",
  //                        "latency_s"[,"relayed"]}...],
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
  // The least posted-to-done time of the link's messages in the current and the previous period (a new period
  // every kLatencyPeriod): the latency follows a link that changes, within two periods.
  struct LatencyMin {
    double current = -1, previous = -1;  // −1: no message in that period
    Clock::time_point period_start{};
    double value() const;
  };
  struct LinkEntry {
    LinkStats stats;
    Clock::time_point covered_until{};
    Clock::time_point last_end{};  // the latest completion on the link
    LatencyMin latency;
    double ewma_bps = 0;
    bool has_sample = false;
  };
  static constexpr std::chrono::seconds kLatencyPeriod{30};

  mutable std::mutex mu_;
  int self_rank_;
  double alpha_;
  std::map<RoleKey, RoleEntry> roles_;
  std::map<LinkKey, LinkEntry> links_;
  std::set<int> relayed_;
};

}  // namespace lh
