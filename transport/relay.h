// defines: lh::Relay — the job's data-plane relay: a ZeroMQ ROUTER (on the coordinator's host by default) that
// forwards packets between two workers that cannot connect to each other directly (one or both behind NAT or a
// firewall), over connections both opened outbound. It never decodes a packet: a sealed one (--data-protection)
// stays sealed end to end. The wire protocol, also spoken by UcxDataPlane's relay client (ucx_data_plane.h):
//   client → relay  ["hello", rank:u32, token]          bind this connection to `rank` (a newer hello replaces it);
//                                                        token: relay_rank_token(rank key, rank), which the
//                                                        coordinator hands each rank in its Plan (or the job's
//                                                        join proof, for a relay without a rank key)
//   relay → client  ["welcome"] | ["refused", reason]
//   client → relay  ["data", dst:u32, tag:u64, packet]  forwarded to dst's connection as …
//   relay → client  ["data", src:u32, tag:u64, packet]  … with the sender's rank, as bound by its hello
//   "frag" instead of "data": a part of a packet whose last part comes as "data" (same tag, next on the connection).
//   Clients cut packets into parts of kRelayFragmentBytes, so the relay forwards a large packet while the rest of it
//   is still arriving (store-and-forward of whole packets would halve a link's rate), and holds one part at a time.
// Integers are little-endian. A data message from a connection without a hello, to a rank not connected, or with bad
// frames is dropped and counted (logged at a bounded rate). Used by Coordinator (started beside its control socket).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "core/status.h"
#include "transport/zmq_loop.h"

namespace lh {

struct RelayOptions {
  std::string listen = "tcp://127.0.0.1:*";  // '*' port: any free one (see endpoint())
  std::string token;                         // hellos must carry it (compared in constant time); empty: any
  // When set (kRelayRankKeyBytes): a hello for rank r must carry relay_rank_token(rank_key, r) instead of `token`, so
  // a member of the job (which holds the job secret, and so the join proof) cannot bind another member's rank.
  std::string rank_key;
  std::optional<ZmqLoop::Curve> curve;       // as the control socket's (the job's keys), or unset: plain ZMTP
  // The largest message forwarded (a larger one drops its connection: ZMQ_MAXMSGSIZE). Clients send parts of
  // kRelayFragmentBytes.
  uint64_t max_message_bytes = uint64_t(1) << 20;
};

// Frame helpers shared with the client.
inline constexpr const char* kRelayHello = "hello";
inline constexpr const char* kRelayWelcome = "welcome";
inline constexpr const char* kRelayRefused = "refused";
inline constexpr const char* kRelayData = "data";
inline constexpr const char* kRelayFragment = "frag";
inline constexpr uint64_t kRelayFragmentBytes = uint64_t(256) << 10;
inline constexpr size_t kRelayRankKeyBytes = 32;
// InvalidArgument unless `rank_key` is empty or kRelayRankKeyBytes long (the relay's and the coordinator's check).
Status check_relay_rank_key(const std::string& rank_key);
// The token a hello for `rank` carries under `rank_key` (64 hex digits: a keyed BLAKE2b of the rank).
std::string relay_rank_token(const std::string& rank_key, int rank);
std::vector<uint8_t> relay_u32(uint32_t v);
std::vector<uint8_t> relay_u64(uint64_t v);
// The integer in `f`, or nothing when it has the wrong size.
std::optional<uint32_t> relay_read_u32(const std::vector<uint8_t>& f);
std::optional<uint64_t> relay_read_u64(const std::vector<uint8_t>& f);
bool relay_frame_is(const std::vector<uint8_t>& f, const char* word);

class Relay {
 public:
  static Result<std::unique_ptr<Relay>> start(const RelayOptions& options);
  ~Relay();

  // The bound endpoint with its real port.
  const std::string& endpoint() const { return loop_->endpoint(); }
  uint16_t port() const;

  struct PairCount {
    uint64_t packets = 0, bytes = 0;
  };
  // Packets and bytes forwarded per (src, dst) so far.
  std::map<std::pair<int, int>, PairCount> forwarded() const;
  // Messages dropped so far (no hello, unknown destination, bad frames, refused hellos).
  uint64_t dropped() const;
  // Ranks with a connection bound by a hello.
  int connected() const;

 private:
  Relay() = default;
  void on_message(Frames&& f);
  void drop(const std::string& why);

  RelayOptions options_;
  std::unique_ptr<ZmqLoop> loop_;
  mutable std::mutex mu_;
  std::map<std::string, int> rank_of_;      // connection identity → rank
  std::map<int, std::string> identity_of_;  // rank → its newest connection
  std::map<std::pair<int, int>, PairCount> forwarded_;
  uint64_t dropped_ = 0, drops_logged_ = 0;
  std::chrono::steady_clock::time_point next_drop_log_{};
};

}  // namespace lh
