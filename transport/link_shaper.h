// defines: lh::LinkShape (rate in bit/s + one-way delay, parsed from "20M,30ms") and lh::LinkShaper, a DataPlane
// decorator that makes each outgoing link behave like a slow one inside the process. Used by
// `launch --link RATE[,DELAY]`, `bench link` and the transport tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>

#include "transport/data_plane.h"

namespace lh {

struct LinkShape {
  double rate_bps = 0;                 // 0: unlimited
  std::chrono::microseconds delay{0};  // one-way propagation delay
  std::string to_string() const;       // "20 Mbit/s, 30 ms"
};

// "RATE[,DELAY]": RATE and DELAY as parse_rate_bps and parse_duration_s below read them ("20M,30ms", "800k").
Result<LinkShape> parse_link_shape(const std::string& text);

// One grammar for rates and durations: --link, ctl set-link and cluster files (plan/cluster.h) all read theirs here.
// A rate is bits per second: a number with an optional k, M or G (K and g too) and an optional bit, bps, bit/s or b
// ("20M", "1.5Gbit", "800k", "100"). A duration is a number with its unit, us, ms or s ("30ms", "0.1s", "500us"); a
// bare number other than 0 is refused, naming the units to add (it once meant ms in --link and s in cluster files).
// `what` names the value in errors ("link delay '40' has no unit: write 40ms, 40s or 40us").
Result<double> parse_rate_bps(const std::string& text, const std::string& what);
Result<double> parse_duration_s(const std::string& text, const std::string& what);

// Each (this rank → peer) link is a FIFO wire: a packet starts transmitting when the previous one has
// left, takes size·8/rate seconds, and reaches the peer `delay` later, when the inner plane actually
// sends it. The sender's Transfer completes when the inner send does. Receives pass straight through
// (the sending side shapes). The shaper meters with the inner plane's meter (taken over at construction)
// so busy time is the emulated link's.
class LinkShaper final : public DataPlane {
 public:
  LinkShaper(std::unique_ptr<DataPlane> inner, LinkShape shape);
  // Shapes a plane it does not own (a worker's UCX plane, kept across plans while each plan gets its shaper): `inner`
  // outlives the shaper, which hands its meter back when it goes.
  LinkShaper(DataPlane& inner, LinkShape shape);
  ~LinkShaper() override;

  // A different shape for the link to one peer.
  void set_shape(int peer, LinkShape shape);
  // Every link's shape at once: `default_shape`, except the peers in `per_peer` (packets already on the wire keep
  // the times they were given).
  void set_shapes(LinkShape default_shape, const std::map<int, LinkShape>& per_peer);
  DataPlane& inner() { return *inner_; }

  int rank() const override { return inner_->rank(); }
  std::vector<int> peers() const override { return inner_->peers(); }
  void fail_peer(int peer, const std::string& reason) override { inner_->fail_peer(peer, reason); }

 protected:
  void start_send(std::shared_ptr<TransferState> st) override;
  void start_recv(std::shared_ptr<TransferState> st) override;

 private:
  struct Pending {
    Clock::time_point release;
    uint64_t seq;
    std::shared_ptr<TransferState> st;
    bool operator>(const Pending& o) const { return release != o.release ? release > o.release : seq > o.seq; }
  };
  void run();

  std::unique_ptr<DataPlane> owned_;  // null when the shaper borrows inner_
  DataPlane* inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  LinkShape default_shape_;
  std::map<int, LinkShape> shapes_;
  std::map<int, Clock::time_point> wire_free_at_;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> queue_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lh
