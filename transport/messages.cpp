// Framing, cereal encoding and validation of control-plane messages. Used by Coordinator and ControlClient.
#include "transport/messages.h"

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstring>
#include <set>

#include "transport/wire_archive.h"

namespace lh {

size_t utf8_length_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  return n;
}

namespace {

constexpr size_t kMaxName = 4096;  // token, hostname, device, reasons, specs

Status check_len(const std::string& s, const char* what, size_t max = kMaxName) {
  if (s.size() > max)
    return corrupt(std::string(what) + " is " + std::to_string(s.size()) + " bytes (max " + std::to_string(max) + ")");
  return Status::Ok();
}

Status check_rank(int32_t r, const char* what) {
  if (r < 0 || r > 4095) return corrupt(std::string(what) + " " + std::to_string(r) + " outside [0, 4095]");
  return Status::Ok();
}

// Names shown in status JSON and logs: valid UTF-8 without control characters (nlohmann::json::dump throws on
// invalid UTF-8).
Status check_name(const std::string& s, const char* what) {
  LH_RETURN_IF_ERROR(check_len(s, what));
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length_at(s, i);
    if (n == 0) return corrupt(std::string(what) + " is not valid UTF-8");
    const auto c = static_cast<unsigned char>(s[i]);
    if (n == 1 && (c < 0x20 || c == 0x7f)) return corrupt(std::string(what) + " holds a control character");
    i += n;
  }
  return Status::Ok();
}

// A checkpoint's step in a message that names one (a shard, its acknowledgement, a failure to load it).
Status check_checkpoint_step(int64_t step, const char* what) {
  if (step < 1 || step >= (int64_t(1) << 24)) return corrupt(std::string(what) + " " + std::to_string(step));
  return Status::Ok();
}

Status validate(const Join& m) {
  LH_RETURN_IF_ERROR(check_len(m.token, "join token"));
  LH_RETURN_IF_ERROR(check_name(m.hostname, "hostname"));
  LH_RETURN_IF_ERROR(check_name(m.device, "device"));
  LH_RETURN_IF_ERROR(check_name(m.data_addresses, "data addresses"));
  LH_RETURN_IF_ERROR(check_name(m.interfaces, "interface addresses"));
  LH_RETURN_IF_ERROR(check_name(m.site, "site"));
  if (!(m.compute_speed >= 0) || m.compute_speed > 1e12)
    return corrupt("compute speed " + std::to_string(m.compute_speed) + " is not a speed");
  if (m.ucx_address.empty() || m.ucx_address.size() > (1u << 20))
    return corrupt("UCX address of " + std::to_string(m.ucx_address.size()) + " bytes");
  if (m.rank != -1) LH_RETURN_IF_ERROR(check_rank(m.rank, "join rank"));
  if (!m.data_key.empty() && m.data_key.size() != 32)
    return corrupt("data-plane key of " + std::to_string(m.data_key.size()) + " bytes (expected 32)");
  return Status::Ok();
}

Status validate(const SetCodec& m);

Status validate(const Plan& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "plan rank"));
  if (m.world_size <= m.rank || m.world_size > 4096)
    return corrupt("plan world size " + std::to_string(m.world_size) + " does not hold rank " + std::to_string(m.rank));
  // Each axis is bounded before the product, which would overflow for axes near 2^31 (found by libFuzzer).
  if (m.pp < 1 || m.tp < 1 || m.dp < 1 || m.pp > 4096 || m.tp > 4096 || m.dp > 4096 ||
      int64_t(m.pp) * m.tp * m.dp != m.world_size)
    return corrupt("plan grid " + std::to_string(m.pp) + "x" + std::to_string(m.tp) + "x" + std::to_string(m.dp) +
                   " does not match world size " + std::to_string(m.world_size));
  if (m.stage < 0 || m.stage >= m.pp || m.tp_index < 0 || m.tp_index >= m.tp || m.dp_index < 0 || m.dp_index >= m.dp)
    return corrupt("plan position (stage " + std::to_string(m.stage) + ", tp " + std::to_string(m.tp_index) + ", dp " +
                   std::to_string(m.dp_index) + ") outside the grid");
  std::set<int32_t> seen;
  for (const auto& p : m.peers) {
    LH_RETURN_IF_ERROR(check_rank(p.rank, "plan peer rank"));
    if (p.rank >= m.world_size) return corrupt("plan peer rank " + std::to_string(p.rank) + " >= world size");
    if (!seen.insert(p.rank).second) return corrupt("plan lists rank " + std::to_string(p.rank) + " twice");
    LH_RETURN_IF_ERROR(check_name(p.hostname, "peer hostname"));
    LH_RETURN_IF_ERROR(check_name(p.device, "peer device"));
    if (!p.data_key.empty() && p.data_key.size() != 32)
      return corrupt("plan peer " + std::to_string(p.rank) + "'s data-plane key of " +
                     std::to_string(p.data_key.size()) + " bytes (expected 32)");
  }
  for (const auto& c : m.codecs) {
    LH_RETURN_IF_ERROR(check_len(c.dir, "codec direction"));
    LH_RETURN_IF_ERROR(check_len(c.spec, "codec spec"));
  }
  if (m.heartbeat_interval_ms <= 0 || m.heartbeat_timeout_ms < m.heartbeat_interval_ms)
    return corrupt("plan heartbeat interval " + std::to_string(m.heartbeat_interval_ms) + " ms / timeout " +
                   std::to_string(m.heartbeat_timeout_ms) + " ms");
  if (m.epoch < 1) return corrupt("plan epoch " + std::to_string(m.epoch));
  if (m.resume_step < 0 || m.resume_step >= (int64_t(1) << 24))
    return corrupt("plan resume step " + std::to_string(m.resume_step));
  if ((m.resume_step > 0) != !m.shard.empty())
    return corrupt("plan resumes at step " + std::to_string(m.resume_step) + " with a state of " +
                   std::to_string(m.shard.size()) + " bytes");
  if (m.changes.size() > 65536) return corrupt("plan lists " + std::to_string(m.changes.size()) + " codec changes");
  for (const SetCodec& c : m.changes) LH_RETURN_IF_ERROR(validate(c));
  return Status::Ok();
}

Status validate(const Ready& m) {
  return check_rank(m.rank, "ready rank");
}
Status validate(const Preflight& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "pre-flight rank"));
  if (m.phase != Preflight::kReach && m.phase != Preflight::kMeasure)
    return corrupt("pre-flight phase " + std::to_string(m.phase));
  for (const PeerProbe& p : m.probes) {
    LH_RETURN_IF_ERROR(check_rank(p.peer, "probe peer"));
    LH_RETURN_IF_ERROR(check_name(p.error, "probe error"));
    if (!(p.rtt_ms >= 0 && p.rtt_ms < 1e7) || !(p.send_mbps >= 0 && p.send_mbps < 1e9))
      return corrupt("probe of peer " + std::to_string(p.peer) + ": rtt " + std::to_string(p.rtt_ms) + " ms, " +
                     std::to_string(p.send_mbps) + " Mbit/s");
  }
  return Status::Ok();
}
Status validate(const Relays& m) {
  if (m.lo.size() != m.hi.size())
    return corrupt("relays list " + std::to_string(m.lo.size()) + " low and " + std::to_string(m.hi.size()) +
                   " high ranks");
  for (size_t i = 0; i < m.lo.size(); ++i) {
    LH_RETURN_IF_ERROR(check_rank(m.lo[i], "relayed pair rank"));
    LH_RETURN_IF_ERROR(check_rank(m.hi[i], "relayed pair rank"));
    if (m.lo[i] >= m.hi[i])
      return corrupt("relayed pair " + std::to_string(m.lo[i]) + "-" + std::to_string(m.hi[i]) + " is not (low, high)");
  }
  LH_RETURN_IF_ERROR(check_name(m.host, "relay host"));
  if (m.port > 65535) return corrupt("relay port " + std::to_string(m.port));
  if (!m.lo.empty() && m.port == 0) return corrupt("relayed pairs without a relay port");
  return Status::Ok();
}
Status validate(const Barrier&) {
  return Status::Ok();
}
Status validate(const Heartbeat& m) {
  if (m.step < -1 || m.step >= (int64_t(1) << 24)) return corrupt("heartbeat step " + std::to_string(m.step));
  for (const PendingLink& p : m.pending) LH_RETURN_IF_ERROR(check_rank(p.peer, "heartbeat pending peer"));
  return Status::Ok();
}
Status validate(const SetCodec& m) {
  // A role-wide change (grad: every replica link) names no pair.
  const bool role_wide = m.role_wide() && m.src == -1 && m.dst == -1;
  if (!role_wide) {
    LH_RETURN_IF_ERROR(check_rank(m.src, "set-codec src"));
    LH_RETURN_IF_ERROR(check_rank(m.dst, "set-codec dst"));
  }
  LH_RETURN_IF_ERROR(check_len(m.dir, "set-codec direction"));
  LH_RETURN_IF_ERROR(check_len(m.spec, "set-codec spec"));
  if (m.apply_at_step < -1) return corrupt("set-codec step " + std::to_string(m.apply_at_step));
  return Status::Ok();
}
Status validate(const StepMetrics& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "metrics rank"));
  if (m.step < 0 || m.step >= (int64_t(1) << 24)) return corrupt("metrics step " + std::to_string(m.step));
  return Status::Ok();
}
Status validate(const Shutdown& m) {
  return check_len(m.reason, "shutdown reason");
}
Status validate(const Reject& m) {
  return check_len(m.reason, "reject reason");
}
Status validate(const PeerLost& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "lost rank"));
  return check_len(m.reason, "lost reason");
}
Status validate(const CtlRequest& m) {
  LH_RETURN_IF_ERROR(check_len(m.token, "ctl token"));
  return check_len(m.command, "ctl command");
}
Status validate(const CtlReply&) {
  return Status::Ok();
}

Status validate(const ShardSaved& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "shard rank"));
  LH_RETURN_IF_ERROR(check_checkpoint_step(m.step, "shard step"));
  if (m.bytes.empty()) return corrupt("an empty shard");
  const uint64_t total = m.total > 0 ? m.total : m.bytes.size();  // 0: the whole shard in one message
  if (total > kMaxShardMessageBytes || m.offset > total || m.bytes.size() > total - m.offset)
    return corrupt("shard part [" + std::to_string(m.offset) + ", +" + std::to_string(m.bytes.size()) + ") of " +
                   std::to_string(m.total) + " bytes (at most " + std::to_string(kMaxShardMessageBytes) + ")");
  return Status::Ok();
}
Status validate(const ShardAck& m) {
  return check_checkpoint_step(m.step, "shard ack step");
}
Status validate(const ResumeFailed& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "resume-failed rank"));
  LH_RETURN_IF_ERROR(check_checkpoint_step(m.step, "resume-failed step"));
  return check_len(m.reason, "resume-failed reason");
}

Status validate(const Preempt& m) {
  if (m.at_step < -1) return corrupt("preempt step " + std::to_string(m.at_step));
  return check_len(m.reason, "preempt reason");
}

Status validate(const Rollback& m) {
  if (m.epoch < 1) return corrupt("rollback epoch " + std::to_string(m.epoch));
  return check_len(m.reason, "rollback reason");
}

Status validate(const CodecApplied& m) {
  LH_RETURN_IF_ERROR(check_rank(m.rank, "codec-applied rank"));
  if (m.id == 0) return corrupt("codec-applied for change 0");
  if (m.from_step < -1 || m.from_step >= (int64_t(1) << 24))
    return corrupt("codec-applied step " + std::to_string(m.from_step));
  return check_len(m.reason, "codec-applied reason");
}

Status validate(const SetLink& m) {
  if (m.rule.empty()) return corrupt("set-link without a rule");
  return check_name(m.rule, "set-link rule");
}

template <class T>
Result<ControlMessage> decode_as(const uint8_t* body, size_t size) {
  T m;
  try {
    WireInputArchive ar(body, size);
    ar(m);
    if (ar.remaining() != 0) return corrupt(std::to_string(ar.remaining()) + " stray bytes after the message body");
  } catch (const std::exception& e) {  // cereal::Exception, or bad_alloc/length_error from a container
    return corrupt(std::string("malformed body: ") + e.what());
  }
  LH_RETURN_IF_ERROR(validate(m));
  return ControlMessage(std::move(m));
}

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kJoin:
      return "Join";
    case MsgType::kPlan:
      return "Plan";
    case MsgType::kReady:
      return "Ready";
    case MsgType::kBarrier:
      return "Barrier";
    case MsgType::kHeartbeat:
      return "Heartbeat";
    case MsgType::kSetCodec:
      return "SetCodec";
    case MsgType::kStepMetrics:
      return "StepMetrics";
    case MsgType::kShutdown:
      return "Shutdown";
    case MsgType::kReject:
      return "Reject";
    case MsgType::kPeerLost:
      return "PeerLost";
    case MsgType::kCtlRequest:
      return "CtlRequest";
    case MsgType::kCtlReply:
      return "CtlReply";
    case MsgType::kShardSaved:
      return "ShardSaved";
    case MsgType::kRollback:
      return "Rollback";
    case MsgType::kCodecApplied:
      return "CodecApplied";
    case MsgType::kSetLink:
      return "SetLink";
    case MsgType::kPreflight:
      return "Preflight";
    case MsgType::kRelays:
      return "Relays";
    case MsgType::kShardAck:
      return "ShardAck";
    case MsgType::kResumeFailed:
      return "ResumeFailed";
    case MsgType::kPreempt:
      return "Preempt";
  }
  return "unknown";
}

MsgType message_type(const ControlMessage& m) {
  return static_cast<MsgType>(m.index() + 1);
}

std::vector<uint8_t> encode_message(const ControlMessage& m, uint32_t seq) {
  std::vector<uint8_t> out(kControlHeaderBytes);
  uint32_t magic = kControlMagic;
  uint16_t version = kProtocolVersion, type = static_cast<uint16_t>(message_type(m));
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &type, 2);
  std::memcpy(out.data() + 8, &seq, 4);
  WireOutputArchive ar(out);
  std::visit([&](const auto& msg) { ar(msg); }, m);
  return out;
}

Result<ControlHeader> decode_header(const uint8_t* data, size_t size) {
  if (size < kControlHeaderBytes)
    return corrupt("message of " + std::to_string(size) + " bytes is shorter than the " +
                   std::to_string(kControlHeaderBytes) + "-byte header");
  if (size > kMaxControlMessage) return corrupt("message of " + std::to_string(size) + " bytes exceeds the limit");
  uint32_t magic, seq;
  uint16_t version, type;
  std::memcpy(&magic, data, 4);
  std::memcpy(&version, data + 4, 2);
  std::memcpy(&type, data + 6, 2);
  std::memcpy(&seq, data + 8, 4);
  if (magic != kControlMagic) return corrupt("bad magic (not a longhaul control message)");
  if (version != kProtocolVersion)
    return corrupt("protocol version " + std::to_string(version) + ", expected " + std::to_string(kProtocolVersion));
  if (type < uint16_t(MsgType::kJoin) || type > uint16_t(MsgType::kPreempt))
    return corrupt("unknown message type " + std::to_string(type));
  return ControlHeader{static_cast<MsgType>(type), seq};
}

uint32_t take_seq(MsgType type, uint32_t* next) {
  return type == MsgType::kHeartbeat ? *next : (*next)++;
}

int64_t advance_seq(const ControlHeader& h, uint32_t* next) {
  const int64_t skipped = int64_t(h.seq) - int64_t(*next);
  *next = h.type == MsgType::kHeartbeat ? h.seq : h.seq + 1;
  return skipped;
}

Result<ControlMessage> decode_message(const uint8_t* data, size_t size) {
  LH_ASSIGN_OR_RETURN(ControlHeader h, decode_header(data, size));
  const uint8_t* body = data + kControlHeaderBytes;
  size_t n = size - kControlHeaderBytes;
  switch (h.type) {
    case MsgType::kJoin:
      return decode_as<Join>(body, n);
    case MsgType::kPlan:
      return decode_as<Plan>(body, n);
    case MsgType::kReady:
      return decode_as<Ready>(body, n);
    case MsgType::kBarrier:
      return decode_as<Barrier>(body, n);
    case MsgType::kHeartbeat:
      return decode_as<Heartbeat>(body, n);
    case MsgType::kSetCodec:
      return decode_as<SetCodec>(body, n);
    case MsgType::kStepMetrics:
      return decode_as<StepMetrics>(body, n);
    case MsgType::kShutdown:
      return decode_as<Shutdown>(body, n);
    case MsgType::kReject:
      return decode_as<Reject>(body, n);
    case MsgType::kPeerLost:
      return decode_as<PeerLost>(body, n);
    case MsgType::kCtlRequest:
      return decode_as<CtlRequest>(body, n);
    case MsgType::kCtlReply:
      return decode_as<CtlReply>(body, n);
    case MsgType::kShardSaved:
      return decode_as<ShardSaved>(body, n);
    case MsgType::kRollback:
      return decode_as<Rollback>(body, n);
    case MsgType::kCodecApplied:
      return decode_as<CodecApplied>(body, n);
    case MsgType::kSetLink:
      return decode_as<SetLink>(body, n);
    case MsgType::kPreflight:
      return decode_as<Preflight>(body, n);
    case MsgType::kRelays:
      return decode_as<Relays>(body, n);
    case MsgType::kShardAck:
      return decode_as<ShardAck>(body, n);
    case MsgType::kResumeFailed:
      return decode_as<ResumeFailed>(body, n);
    case MsgType::kPreempt:
      return decode_as<Preempt>(body, n);
  }
  return corrupt("unknown message type " + std::to_string(uint16_t(h.type)));
}

}  // namespace lh
