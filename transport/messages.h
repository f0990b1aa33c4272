// defines: the control-plane messages (Join, Plan, Ready, Barrier, Heartbeat, SetCodec, StepMetrics, Shutdown,
// Reject, PeerLost, CtlRequest, CtlReply) and their framing: "LHCP" magic, protocol version, type tag, cereal
// body. Used by Coordinator, ControlClient, `longhaul ctl` and the transport tests.
#pragma once

#include <cereal/cereal.hpp>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"

namespace lh {

constexpr uint32_t kControlMagic = 0x50434c48;  // "LHCP" little-endian
constexpr uint16_t kProtocolVersion =
    9;  // 9: Join::site, Preempt; 8: Join/PeerInfo interfaces (allow-lists); 7: Plan::relay_token, shard parts
// magic u32, version u16, type u16, sequence u32. The sequence numbers one sender's messages to one receiver so
// that a receiver notices messages lost when a connection was reset: see ControlHeader::seq.
constexpr size_t kControlHeaderBytes = 12;
constexpr size_t kMaxControlMessage = 64 << 20;
// A checkpoint shard travels down in one message (the Plan that resumes a worker) with room for the rest, which
// bounds a shard; up, in parts of kShardPartBytes (ShardSaved), paced by the coordinator's ShardAck so heartbeats
// never wait behind it.
constexpr size_t kMaxShardMessageBytes = kMaxControlMessage - (1 << 20);
constexpr size_t kShardPartBytes = size_t(64) << 10;

// A vector whose element count is checked against `max` before anything is allocated (every count in a message
// has its own bound; see messages.cpp). Same bytes as a plain vector.
template <class T>
struct BoundedVector {
  std::vector<T>& v;
  size_t max;
  const char* what;
};
template <class T>
BoundedVector<T> bounded(std::vector<T>& v, size_t max, const char* what) {
  return {v, max, what};
}
template <class A, class T>
void save(A& ar, const BoundedVector<T>& b) {
  ar(cereal::make_size_tag(static_cast<cereal::size_type>(b.v.size())));
  for (const T& e : b.v) ar(e);
}
template <class A, class T>
void load(A& ar, BoundedVector<T>& b) {
  cereal::size_type n = 0;
  ar(cereal::make_size_tag(n));
  if (n > b.max)
    throw cereal::Exception(std::string(b.what) + ": " + std::to_string(n) + " entries (max " + std::to_string(b.max) +
                            ")");
  b.v.resize(static_cast<size_t>(n));
  for (T& e : b.v) ar(e);
}

enum class MsgType : uint16_t {
  kJoin = 1,
  kPlan = 2,
  kReady = 3,
  kBarrier = 4,
  kHeartbeat = 5,
  kSetCodec = 6,
  kStepMetrics = 7,
  kShutdown = 8,
  kReject = 9,
  kPeerLost = 10,
  kCtlRequest = 11,
  kCtlReply = 12,
  kShardSaved = 13,
  kRollback = 14,
  kCodecApplied = 15,
  kSetLink = 16,
  kPreflight = 17,
  kRelays = 18,
  kShardAck = 19,
  kResumeFailed = 20,
  kPreempt = 21,
};
const char* msg_type_name(MsgType t);

// worker → coordinator: the first message of a worker.
struct Join {
  std::string token;  // must equal the coordinator's join token
  std::string hostname;
  std::string device;                // "cpu", "cuda:0 (NVIDIA H200)" …
  double compute_speed = 0;          // measured GFLOP/s (the partitioner balances stages with it)
  std::vector<uint8_t> ucx_address;  // UcxDataPlane::address()
  // −1 for a new worker; a worker coming back after a Rollback (or to a restarted coordinator) names the rank it
  // held, and gets it again.
  int32_t rank = -1;
  // Which of this worker's joins it is (1, 2, …; 0: unnumbered). A Join lost with a reset connection is sent again
  // with the same number, and the coordinator takes a repeated number as the same join, not a new one.
  uint32_t attempt = 0;
  // The worker's data-plane public key (UcxDataPlane::data_public_key, 32 bytes; empty: none) and the ciphers its
  // CPU runs fast (packet_auth.h local_ciphers): the Plan hands them to its peers, which derive their pair keys.
  std::vector<uint8_t> data_key;
  uint32_t data_ciphers = 0;
  // The IP addresses its UCX worker address carries ("10.1.0.5, 192.168.1.7"), for people: the messages naming a
  // pair that cannot connect say where it was tried.
  std::string data_addresses;
  // The IP addresses of its interfaces (also when it advertises another): its peers let these reach their data ports
  // (their allow-lists, transport/allow_list.h).
  std::string interfaces;
  // The site it says it is at (worker --site; empty: none). When workers name sites, the coordinator gives each
  // site's new workers consecutive ranks (transport/coordinator.h), so pipeline neighbours share a site.
  std::string site;
  template <class A>
  void serialize(A& ar) {
    ar(token, hostname, device, compute_speed, ucx_address, rank, attempt, data_key, data_ciphers, data_addresses,
       interfaces, site);
  }
};

struct PeerInfo {
  int32_t rank = -1;
  std::string hostname;
  std::string device;
  std::vector<uint8_t> ucx_address;
  std::vector<uint8_t> data_key;  // from its Join
  uint32_t data_ciphers = 0;
  std::string interfaces;  // from its Join: the addresses its packets come from (allow-lists)
  template <class A>
  void serialize(A& ar) {
    ar(rank, hostname, device, ucx_address, data_key, data_ciphers, interfaces);
  }
};

// The codec for one directed link and traffic direction ("fwd", "bwd", "grad", "tp": core/role.h's role_dir_label).
struct LinkCodec {
  int32_t src = -1, dst = -1;
  std::string dir;
  std::string spec;  // a codec spec as parse_codec_spec reads it ("int8", "lowrank:rank=8+int8" …)
  template <class A>
  void serialize(A& ar) {
    ar(src, dst, dir, spec);
  }
};

// coordinator → workers (or ctl → coordinator): change a link's codec at a step boundary.
struct SetCodec {
  int32_t src = -1, dst = -1;  // both −1 with dir "grad" (or "tp"): every link of that role
  std::string dir;             // fwd, bwd (a LinkDir's name), grad or tp (a role's): core/role.h's role_dir_label
  std::string spec;
  int64_t apply_at_step = -1;  // -1: the next step boundary the worker reaches
  // Non-zero: every worker acknowledges it (CodecApplied with this id) once it has scheduled it, so `ctl set-codec`
  // can say where it applies, or that it could not.
  uint64_t id = 0;
  // A change of every link of a role (grad or tp), not of one pipeline link.
  bool role_wide() const { return dir == "grad" || dir == "tp"; }
  template <class A>
  void serialize(A& ar) {
    ar(src, dst, dir, spec, apply_at_step, id);
  }
};

// worker → coordinator: what became of SetCodec `id`: scheduled from `from_step` (−1: not this worker's link), or
// refused (ok false, with the reason).
struct CodecApplied {
  int32_t rank = -1;
  uint64_t id = 0;
  int64_t from_step = -1;
  bool ok = false;
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(rank, id, from_step, ok, reason);
  }
};

constexpr size_t kMaxPlanCodecs = 65536;

// coordinator → worker: who the worker is in the job and whom it talks to.
struct Plan {
  int32_t rank = -1, world_size = 0;
  int32_t stage = 0, tp_index = 0, dp_index = 0;  // this worker's place in the grid
  int32_t pp = 1, tp = 1, dp = 1;                 // the grid
  std::vector<PeerInfo> peers;                    // every rank of the job, this one included
  std::vector<LinkCodec> codecs;
  std::string config;  // the job configuration (JSON text: model, data, steps, schedule …), app-defined
  int32_t heartbeat_interval_ms = 500, heartbeat_timeout_ms = 5000;
  // The plan's epoch: 1 for the job's first plan, one more after each rollback.
  int64_t epoch = 1;
  // Where the worker starts: after step resume_step (0: from the beginning), with `shard` its saved state then
  // (StageRunner::save_state bytes; empty when resume_step is 0).
  int64_t resume_step = 0;
  std::vector<uint8_t> shard;
  // Every live codec change of the job so far (set-codec), to apply on top of `codecs` before the first step.
  std::vector<SetCodec> changes;
  // What this rank's hello to the job's relay carries (transport/relay.h relay_rank_token): it binds this rank only.
  // Empty: the join token (a relay without a rank key).
  std::string relay_token;
  template <class A>
  void serialize(A& ar) {
    ar(rank, world_size, stage, tp_index, dp_index, pp, tp, dp, bounded(peers, 4096, "plan peers"),
       bounded(codecs, kMaxPlanCodecs, "plan codecs"), config, heartbeat_interval_ms, heartbeat_timeout_ms, epoch,
       resume_step, shard, bounded(changes, kMaxPlanCodecs, "plan codec changes"), relay_token);
  }
};

// What a worker's pre-flight measured on the data plane towards one peer it must talk to (comm/peer_probe.h):
// reachable or not (and why), the round trip of small messages, and its send rate to that peer from a short burst.
struct PeerProbe {
  int32_t peer = -1;
  bool ok = false;
  std::string error;         // why the peer could not be reached (ok = false)
  float rtt_ms = 0;          // median round trip of 8-byte messages
  float send_mbps = 0;       // this worker → peer, Mbit/s (0: measured by the peer's own entry only)
  uint32_t probe_bytes = 0;  // bytes the burst sent to measure it
  bool relayed = false;      // measured through the job's relay (the pair could not connect directly)
  template <class A>
  void serialize(A& ar) {
    ar(peer, ok, error, rtt_ms, send_mbps, probe_bytes, relayed);
  }
};

// worker → coordinator once its data plane is connected to the plan's peers.
struct Ready {
  int32_t rank = -1;
  template <class A>
  void serialize(A& ar) {
    ar(rank);
  }
};

// worker → coordinator after the start barrier (every plane connected), twice. Phase kReach: which peers it talks to
// reached it directly (each entry's ok; the coordinator answers with Relays). Phase kMeasure: its measurements, one
// entry per peer, relayed or direct; the worker then waits at kPreflightBarrier, so step 1 begins once every pair was
// measured.
struct Preflight {
  int32_t rank = -1;
  std::vector<PeerProbe> probes;
  static constexpr uint8_t kReach = 0, kMeasure = 1;
  uint8_t phase = kMeasure;
  template <class A>
  void serialize(A& ar) {
    ar(rank, bounded(probes, 4096, "pre-flight probes"), phase);
  }
};

// coordinator → workers once every worker reported phase kReach: the pairs (lo[i], hi[i]) that could not connect
// directly, whose packets go through the job's relay from now on, and where the relay listens: `port` on `host`
// (empty host: the coordinator's host as the worker reaches it). Empty lists: every pair is direct.
struct Relays {
  std::vector<int32_t> lo, hi;
  std::string host;
  uint32_t port = 0;
  template <class A>
  void serialize(A& ar) {
    ar(bounded(lo, 1 << 20, "relayed pairs"), bounded(hi, 1 << 20, "relayed pairs"), host, port);
  }
};
inline constexpr uint64_t kPreflightBarrier = uint64_t(1) << 40;
// Between the phases: every worker has connected to the relay it was told to use (Relays), so relayed packets find
// their receiver's connection.
inline constexpr uint64_t kRelayBarrier = kPreflightBarrier + 1;

// worker → coordinator: "I reached barrier id"; coordinator → all: "everyone did". Barrier 0 is the
// job start, released once every worker is Ready.
struct Barrier {
  uint64_t id = 0;
  template <class A>
  void serialize(A& ar) {
    ar(id);
  }
};

// A transfer a worker's data plane has been waiting on: the oldest pending receive from `peer` (send = false) or
// send to it (send = true).
struct PendingLink {
  int32_t peer = -1;
  bool send = false;
  uint32_t pending_ms = 0;         // how long the oldest such transfer has been pending
  uint32_t since_progress_ms = 0;  // since any transfer with `peer` last finished (either way)
  template <class A>
  void serialize(A& ar) {
    ar(peer, send, pending_ms, since_progress_ms);
  }
};

struct Heartbeat {  // both ways
  uint64_t seq = 0;
  // worker → coordinator: its progress, so the coordinator can name a stalled data-plane link. step: the last step
  // it finished (−1: none yet); pending: what its data plane waits on (each peer and way at most once).
  int64_t step = -1;
  std::vector<PendingLink> pending;
  // The sender's newest join attempt (worker → coordinator) / the newest Join attempt the coordinator has handled
  // from this worker (coordinator → worker): a worker whose Join went missing sees it and sends it again.
  uint32_t join_attempt = 0;
  // worker → coordinator: how long its training thread has been blocked waiting on the data plane (0: it is not;
  // Transfer::blocked_for). Ranks blocked on each other are stuck; a rank that computes is not.
  uint32_t blocked_ms = 0;
  template <class A>
  void serialize(A& ar);
};

struct StepMetrics {  // worker → coordinator, one per step
  int32_t rank = -1;
  int64_t step = 0;
  std::string json;  // the metrics line (loss, tokens/s, LinkMeter::to_json() …)
  template <class A>
  void serialize(A& ar) {
    ar(rank, step, json);
  }
};

// The Shutdown reason a standby worker gets when the job ended without needing it (it then exits cleanly).
inline constexpr const char* kJobFinishedReason = "the job finished";
// The Shutdown reason the surviving workers of a lost replica get when an --elastic job goes on without it.
inline constexpr const char* kReplicaDroppedReason = "the job goes on without this worker's replica (--elastic)";

struct Shutdown {  // coordinator → workers: stop; worker → coordinator: leaving
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(reason);
  }
};

struct Reject {  // the reply to anything refused
  std::string reason;
  uint16_t about = 0;  // the MsgType refused (0: not a message at all); a worker's join waits for a Join's refusal
  template <class A>
  void serialize(A& ar) {
    ar(reason, about);
  }
};

struct PeerLost {  // coordinator → survivors: a worker stopped heartbeating
  int32_t rank = -1;
  std::string hostname;
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(rank, hostname, reason);
  }
};

// A one-shot request from a tool (`longhaul ctl`) that has not joined: "status", "set-codec" …
// The largest JSON argument text of a ctl request the coordinator reads (a set-codec or set-link is under 1 KB).
inline constexpr size_t kMaxCtlArgsBytes = size_t(64) << 10;

struct CtlRequest {
  std::string token;
  std::string command;
  std::string args;  // JSON text
  template <class A>
  void serialize(A& ar) {
    ar(token, command, args);
  }
};

struct CtlReply {
  bool ok = false;
  std::string body;  // JSON text on success, the reason otherwise
  template <class A>
  void serialize(A& ar) {
    ar(ok, body);
  }
};

// worker → coordinator: its state after `step` (a job checkpoint's shard; StageRunner::save_state bytes).
// worker → coordinator: bytes [offset, offset + bytes.size()) of its checkpoint shard of `step`, `total` bytes in
// all (parts come in order; the last one completes it).
struct ShardSaved {
  int32_t rank = -1;
  int64_t step = 0;
  std::vector<uint8_t> bytes;
  uint64_t offset = 0, total = 0;
  template <class A>
  void serialize(A& ar) {
    ar(rank, step, bytes, offset, total);
  }
};

// coordinator → worker: of its shard of `step`, `received` bytes have arrived (the sender keeps about a second of
// its link's rate in flight, so a heartbeat sent now is not queued behind more than that).
struct ShardAck {
  int64_t step = 0;
  uint64_t received = 0;
  template <class A>
  void serialize(A& ar) {
    ar(step, received);
  }
};

// worker → coordinator: the plan's checkpoint (step) cannot be loaded here, and why. The coordinator sets that
// checkpoint aside and rolls the job back to an older one (or the start).
struct ResumeFailed {
  int32_t rank = -1;
  int64_t step = 0;
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(rank, step, reason);
  }
};

// coordinator → workers: a worker was lost; drop the current epoch (its steps, its data plane) and join again as
// the same rank: the job goes on from its last committed checkpoint once every rank is back.
struct Rollback {
  int64_t epoch = 0;  // the epoch being left
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, reason);
  }
};

// coordinator → workers (from `ctl set-link`): one more link shape rule of the job's emulated network
// (grid/link_shapes.h: "RATE[,DELAY]" or "LINK[:DIR]=RATE[,DELAY]"), applied at once, after the job's others.
struct SetLink {
  std::string rule;
  template <class A>
  void serialize(A& ar) {
    ar(rule);
  }
};

// Preemption (SIGTERM from Slurm or Kubernetes before a kill). worker → coordinator: this worker was told to stop
// (at_step −1, `reason` says by what); coordinator → workers: save a checkpoint after step `at_step` and stop there.
struct Preempt {
  int64_t at_step = -1;
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(at_step, reason);
  }
};

template <class A>
void Heartbeat::serialize(A& ar) {
  ar(seq, step, bounded(pending, 2 * 4096, "heartbeat pending links"), join_attempt, blocked_ms);
}

// The length of the UTF-8 character at s[i] (1 to 4), or 0 when the bytes there are not one. Shared by the checks
// of names in messages and by the coordinator's printable form of a member's reasons.
size_t utf8_length_at(const std::string& s, size_t i);

using ControlMessage =
    std::variant<Join, Plan, Ready, Barrier, Heartbeat, SetCodec, StepMetrics, Shutdown, Reject, PeerLost, CtlRequest,
                 CtlReply, ShardSaved, Rollback, CodecApplied, SetLink, Preflight, Relays, ShardAck, ResumeFailed,
                 Preempt>;

MsgType message_type(const ControlMessage& m);

// What the header says, checked (magic, version, a known type) before any of the body is read, so a receiver can
// refuse a type its sender may not send without decoding it.
struct ControlHeader {
  MsgType type = MsgType::kHeartbeat;
  // Numbers one sender's messages to one receiver: a Join is 0, and so is the coordinator's first message to a
  // worker after handling its Join; each later message is one more. A Heartbeat does not take a number: it carries
  // the number the sender's next message will have, so a receiver also notices lost messages that nothing followed.
  uint32_t seq = 0;
};
Result<ControlHeader> decode_header(const uint8_t* data, size_t size);

// The numbering rule of ControlHeader::seq, one copy for both ends. take_seq: the number a message of `type` gets
// from a sender whose next number is *next (a Heartbeat takes none; a Join restarts at 0, reset by the caller).
// advance_seq: a receiver expecting *next moves past `h` and returns what was skipped (0: in order; < 0: a number
// already seen, out of order).
uint32_t take_seq(MsgType type, uint32_t* next);
int64_t advance_seq(const ControlHeader& h, uint32_t* next);

// Header + cereal body.
std::vector<uint8_t> encode_message(const ControlMessage& m, uint32_t seq = 0);
// Checks magic, version, type, body length and each message's fields; never trusts a length it has
// not seen the bytes for. The error says what is wrong ("protocol version 7, expected 1").
Result<ControlMessage> decode_message(const uint8_t* data, size_t size);
inline Result<ControlMessage> decode_message(const std::vector<uint8_t>& b) {
  return decode_message(b.data(), b.size());
}

}  // namespace lh
