// The pre-flight probe: pairwise, in one global order, over the job's own data plane (see peer_probe.h).
#include "comm/peer_probe.h"

#include <algorithm>
#include <set>
#include <string>
#include <thread>

#include "grid/link_name.h"

namespace lh {

std::vector<std::pair<int, int>> talking_pairs(const Topology& topology) {
  std::set<std::pair<int, int>> pairs;
  const int n = topology.workers();
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      const WorkerCoord ca = topology.coord_of(a), cb = topology.coord_of(b);
      const bool same_replica = ca.dp == cb.dp;
      const bool same_dp_group = ca.stage == cb.stage && ca.tp == cb.tp;
      if (same_replica || same_dp_group) pairs.insert({a, b});
    }
  return {pairs.begin(), pairs.end()};
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint8_t kProbeShard = 2;
// The first byte of what the initiator sends: the responder answers pings and bursts with 8 bytes, and stops at done.
constexpr uint8_t kDone = 0, kPing = 1, kBurst = 2;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One pair's messages, numbered alike at both ends (each message takes the next slot of the tag).
class PairChannel {
 public:
  PairChannel(DataPlane& plane, int peer, const ProbeOptions& o) : plane_(plane), peer_(peer), o_(o) {}

  Status send(Bytes b) {
    Transfer t = plane_.send(peer_, next_tag(), std::move(b));
    return wait(t, "sending to");
  }
  Result<Bytes> recv() {
    Transfer t = plane_.recv(peer_, next_tag());
    LH_RETURN_IF_ERROR(wait(t, "waiting for"));
    return t.take();
  }

 private:
  Tag next_tag() {
    if (slot_ >= 4095) slot_ = 0;  // wraps long before a pair could reuse a slot still in flight
    return make_tag(0, slot_++, Role::kOther, kProbeShard);
  }
  Status wait(Transfer& t, const char* doing) {
    const auto deadline = Clock::now() + o_.timeout;
    for (;;) {
      (void)t.wait(std::chrono::milliseconds(50));
      if (t.done()) {
        if (t.status().ok()) return Status::Ok();
        return unavailable(std::string(doing) + " rank " + std::to_string(peer_) + ": " + t.status().message());
      }
      if (o_.cancelled && o_.cancelled()) return aborted("the pre-flight was cancelled (the job rolled back or ended)");
      if (Clock::now() > deadline)
        return unavailable(std::string(doing) + " rank " + std::to_string(peer_) + ": no answer within " +
                           std::to_string(o_.timeout.count()) + " ms");
    }
  }

  DataPlane& plane_;
  const int peer_;
  const ProbeOptions& o_;
  uint16_t slot_ = 0;
};

// This end measures: round trips, then (when `burst`) its send rate. Fills rtt_ms, send_mbps and probe_bytes.
Status initiate(PairChannel& ch, bool burst, const ProbeOptions& o, PeerProbe& out) {
  std::vector<double> rtts;
  for (int i = 0; i < std::max(1, o.pings); ++i) {
    const auto t0 = Clock::now();
    LH_RETURN_IF_ERROR(ch.send(Bytes(8, kPing)));
    LH_RETURN_IF_ERROR(ch.recv().status());
    rtts.push_back(seconds_since(t0));
  }
  std::sort(rtts.begin(), rtts.end());
  const double rtt = rtts[rtts.size() / 2];
  out.rtt_ms = float(rtt * 1e3);
  if (burst) {
    double prev_bytes = 0, prev_s = 0;
    int bursts = 0;
    for (uint64_t size = 4096;; size *= 4) {
      Bytes b(size, 0);
      b[0] = kBurst;
      const auto t0 = Clock::now();
      LH_RETURN_IF_ERROR(ch.send(std::move(b)));
      LH_RETURN_IF_ERROR(ch.recv().status());
      const double s = seconds_since(t0);
      out.probe_bytes += uint32_t(size);
      ++bursts;
      // Two bursts' difference takes out what both pay (the round trip, per-message costs); a difference lost in
      // timer noise (a fast link) falls back to one burst less its round trip.
      double bps = 0;
      if (bursts >= 2 && s - prev_s > 1e-6)
        bps = (double(size) - prev_bytes) * 8 / (s - prev_s);
      else
        bps = double(size) * 8 / std::max(s - rtt, 1e-6);
      out.send_mbps = float(std::min(bps / 1e6, 1e8));
      prev_bytes = double(size);
      prev_s = s;
      // Stop once a burst's own time (less the round trip) is long enough to time well, or at the size cap.
      if (bursts >= 2 &&
          (s - rtt > std::chrono::duration<double>(o.burst_time).count() || size * 4 > o.max_burst_bytes))
        break;
    }
  }
  return ch.send(Bytes(8, kDone));
}

Status respond(PairChannel& ch) {
  for (;;) {
    LH_ASSIGN_OR_RETURN(Bytes b, ch.recv());
    if (b.empty() || b[0] == kDone) return Status::Ok();
    LH_RETURN_IF_ERROR(ch.send(Bytes(8, 0)));
  }
}

}  // namespace

Result<std::vector<PeerProbe>> reach_peers(DataPlane& plane, const Topology& topology, int rank,
                                           const ProbeOptions& options) {
  constexpr uint8_t kReachShard = 3;
  const Tag tag = make_tag(0, 0, Role::kOther, kReachShard);
  std::vector<int> peers;
  for (const auto& [lo, hi] : talking_pairs(topology))
    if (lo == rank || hi == rank) peers.push_back(lo == rank ? hi : lo);
  std::vector<Transfer> sends, recvs;
  for (int p : peers) {
    recvs.push_back(plane.recv(p, tag));
    sends.push_back(plane.send(p, tag, Bytes(8, uint8_t(rank & 0xff))));
  }
  const auto deadline = Clock::now() + options.connect_timeout;
  for (;;) {
    bool all = true;
    for (const Transfer& t : recvs) all &= t.done();
    if (all || Clock::now() >= deadline) break;
    if (options.cancelled && options.cancelled())
      return aborted("the pre-flight was cancelled (the job rolled back or ended)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<PeerProbe> out;
  for (size_t i = 0; i < peers.size(); ++i) {
    PeerProbe p;
    p.peer = peers[i];
    p.ok = recvs[i].done() && recvs[i].status().ok();
    if (!p.ok) {
      const std::string sent = sends[i].done()
                                   ? (sends[i].status().ok() ? "ours went out" : sends[i].status().message())
                                   : "ours was still waiting to connect";
      p.error = recvs[i].done() ? recvs[i].status().message()
                                : "no hello from rank " + std::to_string(peers[i]) + " within " +
                                      std::to_string(options.connect_timeout.count()) + " ms (" + sent + ")";
    }
    out.push_back(std::move(p));
  }
  return out;
}

Result<std::vector<PeerProbe>> probe_peers(DataPlane& plane, const Topology& topology, int rank,
                                           const ProbeOptions& options) {
  std::vector<PeerProbe> out;
  for (const auto& [lo, hi] : talking_pairs(topology)) {
    if (lo != rank && hi != rank) continue;
    const int peer = lo == rank ? hi : lo;
    // Pairs that only carry the gradient norm's few bytes ("cross": neither pipeline neighbours, nor shards, nor
    // replicas of each other) get their round trip measured, not a burst.
    const bool burst = link_kind(topology, lo, hi) != "cross";
    PeerProbe p;
    p.peer = peer;
    PairChannel ch(plane, peer, options);
    Status s = lo == rank ? initiate(ch, burst, options, p) : respond(ch);
    if (s.ok()) s = lo == rank ? respond(ch) : initiate(ch, burst, options, p);
    if (s.code() == StatusCode::kAborted) return s;
    p.ok = s.ok();
    if (!s.ok()) p.error = s.message();
    out.push_back(std::move(p));
    if (!s.ok()) break;
  }
  return out;
}

}  // namespace lh
