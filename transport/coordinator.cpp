// The coordinator's message handling: admission by token, plans, barriers, heartbeats, dead-worker detection,
// metrics and ctl relay, rejection with a logged reason. Used by the app layer and tests.
#include "transport/coordinator.h"

#include <sodium.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>

#include "core/json_limits.h"
#include "core/log.h"
#include "transport/job_secret.h"
#include "transport/worker_address.h"

namespace lh {
namespace {

using Deferred = std::vector<std::function<void()>>;

void run_all(Deferred& d) {
  for (auto& fn : d) fn();
}

bool live(const WorkerInfo& w) {
  return w.state != WorkerInfo::State::kDead && w.state != WorkerInfo::State::kLeft;
}

// What a joined worker (or standby) may send after its Join.
bool sent_by_workers(MsgType t) {
  switch (t) {
    case MsgType::kHeartbeat:
    case MsgType::kReady:
    case MsgType::kPreflight:
    case MsgType::kBarrier:
    case MsgType::kStepMetrics:
    case MsgType::kShutdown:
    case MsgType::kShardSaved:
    case MsgType::kCodecApplied:
    case MsgType::kResumeFailed:
    case MsgType::kPreempt:
      return true;
    default:
      return false;
  }
}

// A member's own words (a Shutdown's or ResumeFailed's reason) on their way into logs, status and other workers'
// messages: control characters (a terminal escape, a forged log line after a newline) and bytes that are not UTF-8
// become '?', and at most 1000 bytes are kept.
std::string printable_reason(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < 1000;) {
    const size_t n = utf8_length_at(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    if (n > 0 && !(n == 1 && (c < 0x20 || c == 0x7f))) {
      out.append(text, i, n);
      i += n;
    } else {
      out += '?';
      ++i;
    }
  }
  if (out.size() >= 1000) out += "…";
  return out;
}

std::string printable_id(const std::string& id) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : id) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

}  // namespace

const char* worker_state_name(WorkerInfo::State s) {
  switch (s) {
    case WorkerInfo::State::kJoined:
      return "joined";
    case WorkerInfo::State::kPlanned:
      return "planned";
    case WorkerInfo::State::kReady:
      return "ready";
    case WorkerInfo::State::kDead:
      return "dead";
    case WorkerInfo::State::kLeft:
      return "left";
    case WorkerInfo::State::kRejoining:
      return "rejoining";
  }
  return "unknown";
}

Result<std::unique_ptr<Coordinator>> Coordinator::start(const CoordinatorOptions& options, CoordinatorHooks hooks) {
  if (options.expected_workers < 1 || options.expected_workers > 4096)
    return invalid_argument("expected workers " + std::to_string(options.expected_workers) + " outside [1, 4096]");
  if (options.heartbeat_interval.count() <= 0 || options.heartbeat_timeout < options.heartbeat_interval)
    return invalid_argument("heartbeat timeout must be at least the (positive) heartbeat interval");
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->options_ = options;
  c->hooks_ = std::move(hooks);
  ZmqLoop::Options lo;
  lo.socket_type = ZMQ_ROUTER;
  lo.endpoint = options.listen;
  lo.bind = true;
  lo.tick = std::min(options.heartbeat_interval, std::chrono::milliseconds(100));
  lo.max_message_bytes = int64_t(kMaxControlMessage);
  lo.bind_retry = std::chrono::seconds(15);
  lo.curve = options.curve;
  Coordinator* self = c.get();
  LH_ASSIGN_OR_RETURN(c->loop_,
                      ZmqLoop::start(
                          lo, [self](Frames&& f) { self->on_message(std::move(f)); }, [self] { self->on_tick(); }));
  LH_LOG_INFO("coordinator listening on {} for {} workers", c->endpoint(), options.expected_workers);
  if (!options.relay_at.empty()) {
    auto at = parse_tcp_endpoint(options.relay_at);
    if (!at.ok()) return invalid_argument("relay '" + options.relay_at + "': " + at.status().message());
    LH_RETURN_IF_ERROR(check_relay_rank_key(options.relay_rank_key));
    c->relay_rank_key_ = options.relay_rank_key;
  } else if (options.relay) {
    RelayOptions ro;
    ro.token = options.token;
    c->relay_rank_key_.resize(kRelayRankKeyBytes);  // only this process and its relay know it
    randombytes_buf(c->relay_rank_key_.data(), c->relay_rank_key_.size());
    ro.rank_key = c->relay_rank_key_;
    ro.curve = options.curve;
    ro.listen = options.relay_listen;
    if (ro.listen.empty()) {
      // The control socket's host; the next port when the control port is fixed.
      auto listen = parse_tcp_endpoint(options.listen, /*any_port=*/true);
      if (!listen.ok())
        return invalid_argument("the relay's address from listen '" + options.listen +
                                "': " + listen.status().message() + " (--relay-port sets it, --no-relay turns it off)");
      ro.listen = listen->with_port(listen->port > 0 ? listen->port + 1 : 0);
    }
    auto relay = Relay::start(ro);
    if (!relay.ok())
      return Status(relay.status()).prepend("(--relay-port sets where it listens, --no-relay turns it off)");
    c->relay_ = std::move(relay).value();
  }
  return c;
}

Coordinator::~Coordinator() {
  loop_.reset();
  relay_.reset();
}

void Coordinator::send_raw(const std::string& identity, const ControlMessage& m) {
  std::lock_guard<std::mutex> lock(send_mu_);
  uint32_t seq = 0;
  auto it = send_seq_.find(identity);
  if (it != send_seq_.end()) seq = take_seq(message_type(m), &it->second);
  loop_->send({std::vector<uint8_t>(identity.begin(), identity.end()), encode_message(m, seq)});
}

void Coordinator::reset_seq(const std::string& identity) {
  std::lock_guard<std::mutex> lock(send_mu_);
  send_seq_[identity] = 0;
}

void Coordinator::forget_seq(const std::string& identity) {
  std::lock_guard<std::mutex> lock(send_mu_);
  send_seq_.erase(identity);
}

std::string Coordinator::check_seq_locked(WorkerInfo& w, const ControlHeader& h) {
  const uint32_t expected = w.next_seq;
  const int64_t gap = advance_seq(h, &w.next_seq);
  if (gap == 0) return "";
  // Only a worker of a running epoch has anything to lose; before its plan, or rolling back, it just resyncs.
  if (w.state != WorkerInfo::State::kPlanned && w.state != WorkerInfo::State::kReady) return "";
  return "rank " + std::to_string(w.rank) + " ('" + w.join.hostname + "'): " +
         (gap > 0 ? std::to_string(gap) + " of its control messages were lost on the way (a reset connection?)"
                  : "its control messages arrived out of order (number " + std::to_string(h.seq) + ", expected " +
                        std::to_string(expected) + ")");
}

std::string Coordinator::on_lost_messages_locked(const std::string& reason, Deferred& later,
                                                 const std::string& rejoined) {
  if (options_.replace_timeout.count() > 0 && !shut_down_) {
    LH_LOG_WARN("coordinator: {}; the job rolls back to its last checkpoint", reason);
    if (planned_) begin_rollback_locked(reason, later, rejoined);
    return "";
  }
  return reason + " (with --replace-timeout 0 the job cannot roll back)";
}

void Coordinator::reject(const std::string& identity, const std::string& reason, MsgType about) {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = ++rejected_;
  }
  // A flood of garbage must not become a flood of log lines: the first 20, then every 1000th.
  if (n <= 20 || n % 1000 == 0)
    LH_LOG_WARN("coordinator: rejected a message from {}: {} ({} rejected so far)", printable_id(identity), reason, n);
  send_raw(identity, Reject{reason, uint16_t(about)});
}

WorkerInfo* Coordinator::find(const std::string& identity) {
  for (auto& w : workers_)
    if (w.identity == identity) return &w;
  return nullptr;
}

void Coordinator::promote_standbys_locked() {
  while (!standby_.empty() && int(workers_.size()) < options_.expected_workers) {
    WorkerInfo w = std::move(standby_.front());
    standby_.erase(standby_.begin());
    w.join_order = int(workers_.size());
    LH_LOG_INFO("coordinator: the standby worker from '{}' takes a lost worker's place", w.join.hostname);
    workers_.push_back(std::move(w));
  }
}

void Coordinator::on_message(Frames&& frames) {
  if (frames.size() != 2) {
    if (!frames.empty()) {
      std::string id(frames[0].begin(), frames[0].end());
      reject(id, "expected one frame per message, got " + std::to_string(frames.size() - 1));
    }
    return;
  }
  std::string id(frames[0].begin(), frames[0].end());
  // The header first: the sender's state decides which types are decoded at all.
  auto header = decode_header(frames[1].data(), frames[1].size());
  if (!header.ok()) {
    // The refusal names the type the header claims, so a worker whose Join was refused hears it as such.
    uint16_t claimed = 0;
    if (frames[1].size() >= 8) std::memcpy(&claimed, frames[1].data() + 6, 2);
    return reject(id, header.status().message(), MsgType(claimed));
  }
  const MsgType type = header->type;
  if (type != MsgType::kJoin && type != MsgType::kCtlRequest) {  // anyone may ask those (the token decides)
    if (!sent_by_workers(type))
      return reject(id, std::string(msg_type_name(type)) + " is not a message a worker sends", type);
    bool known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = find(id) != nullptr ||
              std::any_of(standby_.begin(), standby_.end(), [&](const WorkerInfo& o) { return o.identity == id; });
    }
    if (!known) return reject(id, std::string(msg_type_name(type)) + " from a sender that has not joined", type);
  }
  auto decoded = decode_message(frames[1]);
  if (!decoded.ok()) return reject(id, decoded.status().message(), type);
  ControlMessage& m = decoded.value();
  if (type == MsgType::kJoin) return handle_join(id, std::move(std::get<Join>(m)));
  if (type == MsgType::kCtlRequest) return handle_ctl(id, std::get<CtlRequest>(m));
  on_worker_message(id, *header, m);
}

void Coordinator::on_worker_message(const std::string& id, const ControlHeader& header, ControlMessage& m) {
  const MsgType type = header.type;
  Deferred later;
  std::string stop;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& sb : standby_)
      if (sb.identity == id) {  // a standby only keeps itself alive until it is needed
        sb.last_seen = std::chrono::steady_clock::now();
        advance_seq(header, &sb.next_seq);
        if (type == MsgType::kShutdown) {
          LH_LOG_INFO("coordinator: the standby worker from '{}' left", sb.join.hostname);
          standby_.erase(
              std::remove_if(standby_.begin(), standby_.end(), [&](const WorkerInfo& o) { return o.identity == id; }),
              standby_.end());
        }
        return;
      }
    WorkerInfo* w = find(id);
    if (!w || !live(*w)) {
      lock.unlock();
      return reject(id, std::string(msg_type_name(type)) + " from a sender that has not joined", type);
    }
    w->last_seen = std::chrono::steady_clock::now();
    if (std::string lost = check_seq_locked(*w, header); !lost.empty()) {
      stop = on_lost_messages_locked(lost, later);
      if (stop.empty()) {  // rolled back: what this message belonged to is abandoned
        lock.unlock();
        run_all(later);
        return;
      }
    }
    // A worker told to roll back may still send what its abandoned epoch produced: dropped quietly.
    if (w->state == WorkerInfo::State::kRejoining && type != MsgType::kShutdown && type != MsgType::kHeartbeat) return;
    if (!handle_worker_message_locked(lock, id, *w, type, m, later, stop)) return;
  }
  run_all(later);
  if (!stop.empty()) {
    LH_LOG_ERROR("coordinator: {}", stop);
    shutdown(stop);
  }
}

bool Coordinator::handle_worker_message_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& w,
                                               MsgType type, ControlMessage& m, Deferred& later, std::string& stop) {
  switch (type) {
    case MsgType::kHeartbeat: {
      Heartbeat& hb = std::get<Heartbeat>(m);
      if (std::string bad = check_pending_locked(w, hb.pending); !bad.empty()) {
        lock.unlock();
        reject(id, bad, type);
        return false;
      }
      w.progress = std::move(hb);
      w.progress_at = w.last_seen;
      return true;
    }
    case MsgType::kShardSaved:
      return on_shard_saved_locked(lock, id, w, std::get<ShardSaved>(m), later);
    case MsgType::kResumeFailed:
      return on_resume_failed_locked(lock, id, w, std::get<ResumeFailed>(m), later, stop);
    case MsgType::kReady:
      on_ready_locked(lock, id, w, std::get<Ready>(m).rank);
      return false;
    case MsgType::kPreflight:
      on_preflight_locked(lock, id, w, std::get<Preflight>(m));
      return false;
    case MsgType::kBarrier:
      on_barrier_locked(lock, id, w, std::get<Barrier>(m).id);
      return false;
    case MsgType::kStepMetrics: {
      auto& sm = std::get<StepMetrics>(m);
      if (sm.rank != w.rank) {
        lock.unlock();
        reject(id, "StepMetrics for rank " + std::to_string(sm.rank) + " from rank " + std::to_string(w.rank));
        return false;
      }
      if (hooks_.on_metrics) later.push_back([this, sm] { hooks_.on_metrics(sm); });
      return true;
    }
    case MsgType::kShutdown: {
      declare_lost(w, WorkerInfo::State::kLeft, "left: " + printable_reason(std::get<Shutdown>(m).reason), later);
      return true;
    }
    case MsgType::kPreempt: {
      if (w.rank < 0) {
        lock.unlock();
        reject(id, "Preempt before a plan", type);
        return false;
      }
      Preempt p = std::get<Preempt>(m);
      p.reason = printable_reason(p.reason);
      if (hooks_.on_preempt) later.push_back([this, copy = w, p] { hooks_.on_preempt(copy, p); });
      return true;
    }
    case MsgType::kCodecApplied: {
      auto& ca = std::get<CodecApplied>(m);
      if (ca.rank != w.rank) {
        lock.unlock();
        reject(id, "CodecApplied for rank " + std::to_string(ca.rank) + " from rank " + std::to_string(w.rank));
        return false;
      }
      if (hooks_.on_codec_applied) later.push_back([this, ca] { hooks_.on_codec_applied(ca); });
      return true;
    }
    default: {
      lock.unlock();
      reject(id, std::string(msg_type_name(type)) + " is not a message a worker sends");
      return false;
    }
  }
}

bool Coordinator::on_shard_saved_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& w,
                                        ShardSaved& sh, Deferred& later) {
  const MsgType type = MsgType::kShardSaved;
  if (sh.rank != w.rank || w.state != WorkerInfo::State::kReady) {
    std::string why = "ShardSaved for rank " + std::to_string(sh.rank) + " from rank " + std::to_string(w.rank) +
                      " in state " + worker_state_name(w.state);
    lock.unlock();
    reject(id, why, type);
    return false;
  }
  // Parts in order: a first part starts a shard (dropping an unfinished one), the next continues it.
  if (sh.offset == 0) {
    w.shard_step = sh.step;
    w.shard_bytes.clear();
  }
  const uint64_t total = sh.total > 0 ? sh.total : sh.bytes.size();
  if (sh.step != w.shard_step || sh.offset != w.shard_bytes.size()) {
    std::string why = "a checkpoint shard part of step " + std::to_string(sh.step) + " at byte " +
                      std::to_string(sh.offset) + " from rank " + std::to_string(w.rank) + ", which has sent " +
                      std::to_string(w.shard_bytes.size()) + " bytes of step " + std::to_string(w.shard_step);
    w.shard_step = 0;
    w.shard_bytes = {};
    lock.unlock();
    reject(id, why, type);
    return false;
  }
  w.shard_bytes.insert(w.shard_bytes.end(), sh.bytes.begin(), sh.bytes.end());
  send_raw(id, ShardAck{sh.step, uint64_t(w.shard_bytes.size())});
  if (w.shard_bytes.size() < total) return true;
  ShardSaved whole{sh.rank, sh.step, std::move(w.shard_bytes), 0, total};
  w.shard_step = 0;
  w.shard_bytes = {};
  if (hooks_.on_shard) later.push_back([this, whole = std::move(whole)] { hooks_.on_shard(whole); });
  return true;
}

bool Coordinator::on_resume_failed_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& w,
                                          ResumeFailed& rf, Deferred& later, std::string& stop) {
  if (rf.rank != w.rank || (w.state != WorkerInfo::State::kPlanned && w.state != WorkerInfo::State::kReady) ||
      rf.step != w.resume_step || resume_failed_epoch_ == epoch_) {
    std::string why = "ResumeFailed for rank " + std::to_string(rf.rank) + " from rank " + std::to_string(w.rank) +
                      " in state " + worker_state_name(w.state) + " for step " + std::to_string(rf.step) +
                      " (its plan resumes after step " + std::to_string(w.resume_step) + ")" +
                      (resume_failed_epoch_ == epoch_ ? "; this epoch's was already taken" : "");
    lock.unlock();
    reject(id, why, MsgType::kResumeFailed);
    return false;
  }
  resume_failed_epoch_ = epoch_;
  rf.reason = printable_reason(rf.reason);
  const std::string reason = "rank " + std::to_string(rf.rank) + " ('" + w.join.hostname +
                             "') cannot load its shard of the checkpoint of step " + std::to_string(rf.step) + ": " +
                             rf.reason;
  LH_LOG_ERROR("coordinator: {}", reason);
  lock.unlock();
  const bool set_aside = hooks_.on_resume_failed && hooks_.on_resume_failed(rf);
  lock.lock();
  stop = set_aside ? on_lost_messages_locked(reason + "; the job goes back to an older checkpoint", later) : reason;
  return true;
}

void Coordinator::on_ready_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& w, int r) {
  if (w.state != WorkerInfo::State::kPlanned || r != w.rank) {
    std::string why = "Ready for rank " + std::to_string(r) + " from a worker in state " + worker_state_name(w.state) +
                      " with rank " + std::to_string(w.rank);
    lock.unlock();
    return reject(id, why);
  }
  w.state = WorkerInfo::State::kReady;
  w.probes.clear();  // this epoch's pre-flight comes next
  w.reach.reset();
  w.reach_answered = false;
  LH_LOG_INFO("coordinator: rank {} ready", r);
  lock.unlock();
  check_barriers();
}

void Coordinator::on_preflight_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& w,
                                      Preflight& pf) {
  if (w.state != WorkerInfo::State::kReady || pf.rank != w.rank) {
    std::string why = "Preflight for rank " + std::to_string(pf.rank) + " from a worker in state " +
                      worker_state_name(w.state) + " with rank " + std::to_string(w.rank);
    lock.unlock();
    return reject(id, why);
  }
  if (pf.phase == Preflight::kReach) {
    w.reach = std::move(pf.probes);
    lock.unlock();
    check_reach();
    return;
  }
  w.probes = std::move(pf.probes);
  std::string unreachable;
  for (const PeerProbe& p : w.probes) {
    if (p.ok) continue;
    std::string peer_host;
    for (const auto& o : workers_)
      if (o.rank == p.peer && live(o)) peer_host = o.join.hostname;
    const std::string link = hooks_.link_name ? " (link " + hooks_.link_name(pf.rank, p.peer) + ")" : "";
    unreachable = "pre-flight: rank " + std::to_string(pf.rank) + " ('" + w.join.hostname + "') cannot reach rank " +
                  std::to_string(p.peer) + " ('" + peer_host + "', at the UCX worker address its Join gave)" + link +
                  ": " + p.error;
    break;
  }
  lock.unlock();
  if (!unreachable.empty()) end_at_preflight(unreachable);
}

void Coordinator::on_barrier_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& w,
                                    uint64_t barrier) {
  if (w.rank < 0) {
    lock.unlock();
    return reject(id, "Barrier before a plan");
  }
  if (!barrier_arrivals_.count(barrier)) {
    // Ids are a member's to choose: each may hold a few open at once (a worker waits at one at a time).
    size_t open = 0;
    for (const auto& [other, ranks] : barrier_arrivals_) open += ranks.count(w.rank);
    if (open >= kMaxOpenBarriersPerMember) {
      std::string why = "Barrier " + std::to_string(barrier) + " from rank " + std::to_string(w.rank) +
                        ", which already waits at " + std::to_string(open) + " open barriers (at most " +
                        std::to_string(kMaxOpenBarriersPerMember) + ")";
      lock.unlock();
      return reject(id, why, MsgType::kBarrier);
    }
  }
  barrier_arrivals_[barrier].insert(w.rank);
  lock.unlock();
  check_barriers();
}

bool Coordinator::repeated_join_locked(std::unique_lock<std::mutex>& lock, const std::string& id, WorkerInfo& same,
                                       bool standby, Join& join) {
  if (join.attempt == same.join.attempt) {
    // The same join again: the worker resent it because our heartbeats crossed it on the way. Nothing to do.
    same.last_seen = std::chrono::steady_clock::now();
    LH_LOG_DEBUG("coordinator: a repeated Join (attempt {}) from '{}'", join.attempt, join.hostname);
    return true;
  }
  if (join.attempt > same.join.attempt && (standby || same.state == WorkerInfo::State::kJoined)) {
    // Not planned yet: a newer attempt (what we sent it went missing) replaces the old one.
    LH_LOG_INFO("coordinator: worker from '{}' joined again (attempt {}) before its plan", join.hostname, join.attempt);
    same.join = std::move(join);
    same.last_seen = std::chrono::steady_clock::now();
    lock.unlock();
    reset_seq(id);
    return true;
  }
  return false;
}

void Coordinator::handle_join(const std::string& id, Join&& join) {
  if (!constant_time_equal(join.token, options_.token)) {
    return reject(id, "wrong join token from host '" + join.hostname + "'", MsgType::kJoin);
  }
  join.token.clear();
  WorkerInfo snapshot;
  bool plan_now = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    std::string why;
    WorkerInfo* known = find(id);
    if (known && live(*known)) known->next_seq = 1;  // a Join is number 0
    WorkerInfo* standby = nullptr;
    for (auto& sb : standby_)
      if (sb.identity == id) standby = &sb;
    if (standby) standby->next_seq = 1;
    if (WorkerInfo* same = known && live(*known) ? known : standby; same && join.attempt > 0)
      if (repeated_join_locked(lock, id, *same, same == standby, join)) return;
    // (A new attempt from a worker whose first Plan went missing names no rank yet; it is the same worker.)
    if (known && planned_ && (join.rank == known->rank || (join.attempt > known->join.attempt && join.rank < 0)) &&
        (known->state == WorkerInfo::State::kPlanned || known->state == WorkerInfo::State::kReady)) {
      // A worker of the running epoch joins again as itself: it lost control messages (a reset connection) and
      // left its epoch. The job rolls back; it takes its place again at once.
      Deferred later;
      std::string stop = on_lost_messages_locked("rank " + std::to_string(known->rank) + " ('" + known->join.hostname +
                                                     "') joined again (it lost control messages)",
                                                 later, id);
      if (!stop.empty()) {
        lock.unlock();
        return reject(id, stop, MsgType::kJoin);
      }
      known = find(id);
      lock.unlock();
      run_all(later);
      lock.lock();
      known = find(id);
      if (!known) return;
    }
    if (known) {
      if (known->state == WorkerInfo::State::kRejoining) {
        // A survivor of a rollback, back with its new data-plane address; it keeps its rank.
        known->join = std::move(join);
        known->state = WorkerInfo::State::kJoined;
        known->last_seen = std::chrono::steady_clock::now();
        LH_LOG_INFO("coordinator: rank {} ('{}') joined again for epoch {}", known->rank, known->join.hostname, epoch_);
        plan_now = complete_locked();
        lock.unlock();
        reset_seq(id);
        if (plan_now) send_plans();
        return;
      }
      why = "already joined";
    } else if (std::any_of(standby_.begin(), standby_.end(), [&](const WorkerInfo& o) { return o.identity == id; })) {
      why = "already joined (as a standby)";
    } else if (planned_ && options_.replace_timeout.count() > 0 && !shut_down_) {
      if (standby_.size() >= size_t(options_.expected_workers)) {
        why = "the job is running and has " + std::to_string(standby_.size()) + " standby workers already";
      } else {
        // A worker restarted (or added) while the job runs waits to take the place of the next lost one.
        WorkerInfo w;
        w.identity = id;
        w.join = std::move(join);
        w.last_seen = std::chrono::steady_clock::now();
        LH_LOG_INFO(
            "coordinator: worker from '{}' joined the running job as a standby (it takes the place of the "
            "next lost worker)",
            w.join.hostname);
        standby_.push_back(std::move(w));
        lock.unlock();
        reset_seq(id);
        return;
      }
    } else if (planned_) {
      why = "the job is already planned";
    } else if (int(workers_.size()) >= options_.expected_workers) {
      why = "the job is full (" + std::to_string(options_.expected_workers) + " workers)";
    }
    if (!why.empty()) {
      lock.unlock();
      if (known) reset_seq(id);  // its next message (this refusal) is number 0
      return reject(id, why, MsgType::kJoin);
    }
    WorkerInfo w;
    w.identity = id;
    w.join_order = int(workers_.size());
    w.join = std::move(join);
    w.last_seen = std::chrono::steady_clock::now();
    workers_.push_back(w);
    snapshot = w;
    plan_now = complete_locked();
    LH_LOG_INFO("coordinator: worker {} joined from '{}' ({}, {}){}, {}/{}", w.join_order, w.join.hostname,
                w.join.device,
                w.join.compute_speed > 0 ? fmt::format("{:.1f} GFLOP/s", w.join.compute_speed) : "speed not reported",
                recovering_ ? " to replace a lost worker" : "", workers_.size(), options_.expected_workers);
  }
  reset_seq(id);
  if (hooks_.on_join) hooks_.on_join(snapshot);
  if (plan_now) send_plans();
}

bool Coordinator::complete_locked() const {
  if (planned_ || shut_down_ || int(workers_.size()) != options_.expected_workers) return false;
  for (const auto& w : workers_)
    if (w.state != WorkerInfo::State::kJoined) return false;
  return true;
}

void Coordinator::assign_ranks() {
  // Ranks: survivors keep theirs; the others take the free ones (below). Then workers_ is in rank order.
  std::lock_guard<std::mutex> lock(mu_);
  const int n = options_.expected_workers;
  std::vector<bool> used(size_t(n), false);
  for (auto& w : workers_)
    if (w.rank >= 0 && w.rank < n) used[size_t(w.rank)] = true;
  // When workers name sites, the new ones take the free ranks site by site: sites in the order of the lowest rank
  // their workers ask for (then by name), and in a site by the rank each asks for, then in join order. Two Slurm
  // allocations whose SLURM_PROCIDs both start at 0 then hold consecutive ranks each, as a hostfile's sites do, and
  // a restarted coordinator gives the workers that come back the ranks they held.
  std::vector<WorkerInfo*> fresh;
  for (auto& w : workers_)
    if (w.rank < 0) fresh.push_back(&w);
  if (std::any_of(workers_.begin(), workers_.end(), [](const WorkerInfo& w) { return !w.join.site.empty(); })) {
    std::map<std::string, int32_t> lowest;  // site → the lowest rank its workers ask for (INT32_MAX: none)
    auto asked = [](const WorkerInfo* w) { return w->join.rank >= 0 ? w->join.rank : INT32_MAX; };
    for (const WorkerInfo* w : fresh) {
      auto it = lowest.emplace(w->join.site, INT32_MAX).first;
      it->second = std::min(it->second, asked(w));
    }
    std::stable_sort(fresh.begin(), fresh.end(), [&](const WorkerInfo* a, const WorkerInfo* b) {
      return std::make_tuple(lowest[a->join.site], a->join.site, asked(a)) <
             std::make_tuple(lowest[b->join.site], b->join.site, asked(b));
    });
  } else {
    // Without sites: a worker naming a free rank (one coming back to a restarted coordinator) gets it.
    for (WorkerInfo* w : fresh)
      if (w->join.rank >= 0 && w->join.rank < n && !used[size_t(w->join.rank)]) {
        w->rank = w->join.rank;
        used[size_t(w->rank)] = true;
      }
  }
  int next = 0;
  for (WorkerInfo* w : fresh)
    if (w->rank < 0) {
      while (used[size_t(next)]) ++next;
      w->rank = next;
      used[size_t(next)] = true;
    }
  std::stable_sort(workers_.begin(), workers_.end(),
                   [](const WorkerInfo& a, const WorkerInfo& b) { return a.rank < b.rank; });
}

void Coordinator::send_plans() {
  assign_ranks();
  std::vector<WorkerInfo> ws = workers();
  std::vector<Plan> plans;
  if (hooks_.make_plans) {
    auto r = hooks_.make_plans(ws);
    if (!r.ok()) {
      LH_LOG_ERROR("coordinator: cannot plan the job: {}", r.status().to_string());
      shutdown("planning failed: " + r.status().message());
      return;
    }
    plans = std::move(r).value();
  } else {
    for (size_t i = 0; i < ws.size(); ++i) {
      Plan p;
      p.rank = int(i);
      p.world_size = int(ws.size());
      p.stage = int(i);
      p.pp = int(ws.size());
      plans.push_back(p);
    }
  }
  std::set<int> ranks;
  for (auto& p : plans) ranks.insert(p.rank);
  if (plans.size() != ws.size() || ranks.size() != ws.size() || *ranks.begin() != 0 ||
      *ranks.rbegin() != int(ws.size()) - 1) {
    LH_LOG_ERROR("coordinator: make_plans returned {} plans for {} workers or ranks not 0..N-1", plans.size(),
                 ws.size());
    shutdown("planning failed: bad plan set");
    return;
  }
  std::vector<PeerInfo> peers(ws.size());
  for (size_t i = 0; i < ws.size(); ++i)
    peers[size_t(plans[i].rank)] = PeerInfo{plans[i].rank,          ws[i].join.hostname,     ws[i].join.device,
                                            ws[i].join.ucx_address, ws[i].join.data_key,     ws[i].join.data_ciphers,
                                            ws[i].join.interfaces};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < ws.size(); ++i) {
      workers_[i].rank = plans[i].rank;
      if (workers_[i].state == WorkerInfo::State::kJoined) workers_[i].state = WorkerInfo::State::kPlanned;
      rank_to_identity_[plans[i].rank] = workers_[i].identity;
    }
    planned_ = true;
    recovering_ = false;
    vacant_.clear();
  }
  const int64_t epoch = this->epoch();
  for (size_t i = 0; i < ws.size(); ++i) {
    Plan& p = plans[i];
    p.epoch = epoch;
    if (p.peers.empty()) p.peers = peers;
    p.heartbeat_interval_ms = int32_t(options_.heartbeat_interval.count());
    p.heartbeat_timeout_ms = int32_t(options_.heartbeat_timeout.count());
    if (!relay_rank_key_.empty()) p.relay_token = relay_rank_token(relay_rank_key_, p.rank);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (WorkerInfo* w = find(ws[i].identity)) w->resume_step = p.resume_step;
    }
    send_raw(ws[i].identity, p);
  }
  LH_LOG_INFO("coordinator: plans sent to {} workers (epoch {})", ws.size(), epoch);
}

void Coordinator::check_reach() {
  Relays answer;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool waiting = false;
    for (const WorkerInfo& w : workers_)
      if (live(w) && w.rank >= 0) {
        if (!w.reach) return;  // not everyone has reported yet
        waiting |= !w.reach_answered;
      }
    if (!waiting) return;
    // A pair is direct when each end heard the other's hello; why not, from each end that did not.
    std::map<std::pair<int, int>, std::string> cut;
    std::map<int, const WorkerInfo*> by_rank;
    for (const WorkerInfo& w : workers_)
      if (live(w) && w.rank >= 0) by_rank[w.rank] = &w;
    for (const auto& [rank, w] : by_rank)
      for (const PeerProbe& p : *w->reach) {
        if (p.ok) continue;
        std::string& why = cut[{std::min(rank, int(p.peer)), std::max(rank, int(p.peer))}];
        why += (why.empty() ? "" : "; ") + ("rank " + std::to_string(rank) + ": " + p.error);
      }
    for (auto& w : workers_)
      if (live(w) && w.rank >= 0) w.reach_answered = true;
    std::vector<std::string> names, details;
    for (const auto& [pair, why] : cut) {
      auto who = [&](int r) {
        auto it = by_rank.find(r);
        if (it == by_rank.end()) return "rank " + std::to_string(r);
        const Join& j = it->second->join;
        return "rank " + std::to_string(r) + " '" + j.hostname + "'" +
               (j.data_addresses.empty() ? std::string() : " at " + j.data_addresses);
      };
      const std::string link =
          hooks_.link_name ? hooks_.link_name(pair.first, pair.second) : std::to_string(pair.first) + "-" +
                                                                               std::to_string(pair.second);
      const std::string name = link.substr(0, link.find(':'));
      const std::string what = "link " + name + " (" + who(pair.first) + ", " + who(pair.second) + ")";
      names.push_back(name);
      details.push_back(what + ": " + why);
      if (relay_ || !options_.relay_at.empty()) {
        LH_LOG_WARN("coordinator: pre-flight: {} cannot connect directly ({}); relaying it through {}", what, why,
                    relay_endpoint());
        answer.lo.push_back(pair.first);
        answer.hi.push_back(pair.second);
      }
    }
    if (!relay_ && options_.relay_at.empty() && !cut.empty()) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      failure = "pre-flight: " + std::string(cut.size() == 1 ? "link " : "links ") + list + " cannot connect " +
                "directly, and relays are off (--no-relay)";
      for (size_t i = 0; i < details.size() && i < 4; ++i) failure += "; " + details[i];
      if (details.size() > 4) failure += "; and " + std::to_string(details.size() - 4) + " more";
      bool advertised = false;
      for (const auto& [pair, why] : cut)
        for (int r : {pair.first, pair.second})
          if (auto it = by_rank.find(r); it != by_rank.end())
            if (auto a = unwrap_peer_address(it->second->join.ucx_address); a.ok()) advertised |= !a->host.empty();
      if (advertised)
        failure +=
            " (UCX reaches an advertised address's listener, then connects its data lanes to the interfaces' own "
            "addresses: behind NAT with port forwarding those fail; such a pair needs the relay)";
    }
    if (!answer.lo.empty() && relay_) answer.port = relay_->port();
    if (!answer.lo.empty() && !options_.relay_at.empty()) {
      const TcpEndpoint at = parse_tcp_endpoint(options_.relay_at).value();  // checked by start()
      answer.host = at.host;
      answer.port = uint32_t(at.port);
    }
  }
  if (!failure.empty()) return end_at_preflight(failure);
  broadcast(answer);
}

void Coordinator::end_at_preflight(const std::string& why) {
  LH_LOG_ERROR("coordinator: {}", why);
  if (hooks_.on_unreachable)
    hooks_.on_unreachable(why);
  else
    shutdown(why);
}

void Coordinator::check_barriers() {
  std::vector<uint64_t> released;
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<int> live_ranks;
    bool every_ready = planned_;
    for (auto& w : workers_) {
      if (!live(w)) continue;
      live_ranks.insert(w.rank);
      if (w.state != WorkerInfo::State::kReady) every_ready = false;
    }
    if (every_ready && !all_ready_ && !live_ranks.empty()) {
      all_ready_ = true;
      start = true;
    }
    // A pre-flight that found an unreachable pair never opens its barrier (the job ends instead).
    bool preflight_failed = false;
    for (auto& w : workers_)
      if (live(w))
        for (const PeerProbe& p : w.probes) preflight_failed |= !p.ok;
    for (auto it = barrier_arrivals_.begin(); it != barrier_arrivals_.end();) {
      if (it->first == kPreflightBarrier && preflight_failed) {
        ++it;
        continue;
      }
      bool all = all_ready_ && !live_ranks.empty() &&
                 std::includes(it->second.begin(), it->second.end(), live_ranks.begin(), live_ranks.end());
      if (all) {
        released.push_back(it->first);
        it = barrier_arrivals_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (start) {
    preflight_t0_ = std::chrono::steady_clock::now();
    LH_LOG_INFO("coordinator: every worker is ready; starting");
    broadcast(Barrier{0});
    cv_.notify_all();
    if (hooks_.on_all_ready) hooks_.on_all_ready();
  }
  for (uint64_t id : released) {
    if (id == kPreflightBarrier) {
      // The reachability matrix: one line per pair, both ways.
      const nlohmann::json pf = preflight_json();
      std::map<std::pair<int, int>, std::string> lines;
      std::set<std::pair<int, int>> relayed;
      for (const auto& e : pf) {
        const int a = e["src"], b = e["dst"];
        if (e.value("relayed", false)) relayed.insert({std::min(a, b), std::max(a, b)});
        auto& line = lines[{std::min(a, b), std::max(a, b)}];
        char buf[160];
        if (a < b) {
          std::snprintf(buf, sizeof(buf), "rtt %.2f ms", e["rtt_ms"].get<double>());
          line = std::string(buf) + line;
        }
        if (e["mbps"].get<double>() > 0) {
          std::snprintf(buf, sizeof(buf), ", %d→%d %.1f Mbit/s", a, b, e["mbps"].get<double>());
          line += buf;
        }
      }
      for (const auto& [pair, line] : lines) {
        std::string name = hooks_.link_name ? hooks_.link_name(pair.first, pair.second) : "";
        name = name.empty() ? std::to_string(pair.first) + "-" + std::to_string(pair.second)
                            : name.substr(0, name.find(':'));  // the pair, both ways
        LH_LOG_INFO("coordinator: pre-flight {} ({}-{}): {}, {}", name, pair.first, pair.second,
                    relayed.count(pair) ? "relayed" : "direct", line);
      }
      LH_LOG_INFO("coordinator: pre-flight of {} pairs ({} relayed) took {:.2f} s", lines.size(), relayed.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - preflight_t0_).count());
    }
    broadcast(Barrier{id});
  }
}

void Coordinator::declare_lost(WorkerInfo& w, WorkerInfo::State state, const std::string& reason,
                               std::vector<std::function<void()>>& later) {
  bool someone_left = false;
  for (const auto& o : workers_) someone_left |= o.state == WorkerInfo::State::kLeft;
  const bool rejoining = w.state == WorkerInfo::State::kRejoining;
  if (options_.replace_timeout.count() > 0 && !shut_down_ && !someone_left &&
      (state == WorkerInfo::State::kDead || rejoining)) {
    const int rank = w.rank;
    const std::string host = w.join.hostname;
    if (planned_ || recovering_)
      LH_LOG_ERROR("coordinator: rank {} ('{}') {}: {}", rank, host,
                   state == WorkerInfo::State::kDead ? "declared dead" : "left", reason);
    else
      LH_LOG_WARN("coordinator: worker '{}' was lost before the job was planned ({}); its place is free", host, reason);
    const std::string id = w.identity;
    forget_seq(id);
    workers_.erase(
        std::remove_if(workers_.begin(), workers_.end(), [&](const WorkerInfo& o) { return o.identity == id; }),
        workers_.end());
    if (rank >= 0) {
      rank_to_identity_.erase(rank);
      vacant_.insert(rank);
    }
    if (planned_ || recovering_)
      begin_rollback_locked("worker " + std::to_string(rank) + " ('" + host + "') was lost: " + reason, later);
    promote_standbys_locked();
    cv_.notify_all();
    return;
  }
  w.state = state;
  PeerLost lost{w.rank, w.join.hostname, reason};
  if (state == WorkerInfo::State::kDead)
    LH_LOG_ERROR("coordinator: rank {} ('{}') declared dead: {}", w.rank, w.join.hostname, reason);
  else
    LH_LOG_INFO("coordinator: rank {} ('{}') {}", w.rank, w.join.hostname, reason);
  for (auto& o : workers_)
    if (live(o) && o.identity != w.identity) send_raw(o.identity, lost);
  cv_.notify_all();
  if (hooks_.on_worker_lost) later.push_back([this, copy = w, reason] { hooks_.on_worker_lost(copy, reason); });
}

void Coordinator::begin_rollback_locked(const std::string& reason, std::vector<std::function<void()>>& later,
                                        const std::string& rejoined) {
  if (!planned_) return;  // already waiting for workers: the new vacancy is simply one more
  const int64_t left = epoch_++;
  planned_ = false;
  all_ready_ = false;
  barrier_arrivals_.clear();
  recovering_ = true;
  recovery_deadline_ = std::chrono::steady_clock::now() + options_.replace_timeout;
  for (WorkerInfo& w : workers_) w.progress = Heartbeat{};  // the abandoned epoch's waits are no stall of the next
  stalls_.clear();
  if (vacant_.empty()) {
    LH_LOG_WARN("coordinator: rolling the job back (epoch {} → {}); every worker rejoins", left, epoch_);
  } else {
    std::string r;
    for (int v : vacant_) r += (r.empty() ? "" : ",") + std::to_string(v);
    LH_LOG_WARN(
        "coordinator: rolling the job back (epoch {} → {}); rank(s) {} to fill (by a standby, or a "
        "replacement within {} s)",
        left, epoch_, r, options_.replace_timeout.count() / 1000);
  }
  for (auto& o : workers_)
    if (live(o)) {
      o.state = WorkerInfo::State::kRejoining;
      if (o.identity != rejoined) send_raw(o.identity, Rollback{left, reason});
    }
  if (hooks_.on_rollback) later.push_back([this, e = epoch_, reason] { hooks_.on_rollback(e, reason); });
}

std::string Coordinator::check_pending_locked(const WorkerInfo& w, const std::vector<PendingLink>& pending) const {
  // Each peer and way at most once, from a planned rank to a rank of the job: the list is bounded by the job. (An
  // entry for the sender itself is no wait on another rank: the stall and deadlock checks pass over it.)
  const size_t most = 2 * size_t(std::max(options_.expected_workers, int(workers_.size())));
  auto named = [&](const std::string& what) {
    return "Heartbeat from rank " + std::to_string(w.rank) + " lists " + what;
  };
  if (pending.empty()) return "";
  if (w.rank < 0) return named("pending links before a plan");
  if (pending.size() > most)
    return named(std::to_string(pending.size()) + " pending links; a job of " +
                 std::to_string(most / 2) + " workers has at most " + std::to_string(most));
  std::set<std::pair<int, bool>> seen;
  for (const PendingLink& p : pending) {
    if (p.peer < 0 || size_t(p.peer) >= most / 2)
      return named("a pending link with rank " + std::to_string(p.peer));
    if (!seen.insert({p.peer, p.send}).second)
      return named("rank " + std::to_string(p.peer) + (p.send ? " (send)" : " (receive)") + " twice");
  }
  return "";
}

std::map<std::pair<int, int>, std::string> Coordinator::find_stalls_locked(
    std::chrono::steady_clock::time_point now) const {
  std::map<std::pair<int, int>, std::string> out;
  if (options_.stall_timeout.count() <= 0 || !all_ready_) return out;
  const auto limit = uint32_t(std::min<int64_t>(options_.stall_timeout.count(), UINT32_MAX));
  std::map<int, const WorkerInfo*> by_rank;
  for (const WorkerInfo& w : workers_)
    if (w.state == WorkerInfo::State::kReady && now - w.progress_at <= options_.heartbeat_timeout) by_rank[w.rank] = &w;
  auto seconds = [](uint32_t ms) { return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s"; };
  for (const auto& [rank, w] : by_rank)
    for (const PendingLink& p : w->progress.pending) {
      if (p.send || p.since_progress_ms < limit || p.peer == rank) continue;
      const int src = p.peer, dst = rank;
      std::string name = hooks_.link_name ? hooks_.link_name(src, dst) : std::string();
      name = (name.empty() ? "" : name + " ") + "(rank " + std::to_string(src) + " → rank " + std::to_string(dst) + ")";
      std::string what = "link " + name + ": nothing has moved for " + seconds(p.since_progress_ms) + "; ";
      auto sender = by_rank.find(src);
      const PendingLink* sending = nullptr;
      if (sender != by_rank.end())
        for (const PendingLink& q : sender->second->progress.pending)
          if (q.send && q.peer == dst) sending = &q;
      if (sending) {
        if (sending->since_progress_ms < limit) continue;  // its sender sees it move
        what += "rank " + std::to_string(src) + " has had a packet on its way for " + seconds(sending->pending_ms) +
                " (a blocked or very slow link)";
      } else if (sender == by_rank.end()) {
        what +=
            "rank " + std::to_string(dst) + " waits for rank " + std::to_string(src) + ", whose progress is unknown";
      } else {
        const Heartbeat& hb = sender->second->progress;
        std::string waits;
        for (const PendingLink& q : hb.pending)
          if (!q.send) waits += (waits.empty() ? "" : ", ") + std::to_string(q.peer);
        what += "rank " + std::to_string(dst) + " waits for rank " + std::to_string(src) +
                ", which is not sending to it (rank " + std::to_string(src) + " finished step " +
                std::to_string(hb.step) +
                (waits.empty() ? ", and waits on no one" : ", and waits on rank(s) " + waits) + ")";
      }
      out[{src, dst}] = what;
    }
  return out;
}

std::string Coordinator::find_deadlock_locked(std::chrono::steady_clock::time_point now) const {
  if (options_.stall_timeout.count() <= 0 || !all_ready_) return "";
  const auto limit = uint32_t(std::min<int64_t>(options_.stall_timeout.count(), UINT32_MAX));
  std::map<int, const WorkerInfo*> by_rank;
  for (const WorkerInfo& w : workers_)
    if (w.state == WorkerInfo::State::kReady && now - w.progress_at <= options_.heartbeat_timeout) by_rank[w.rank] = &w;
  // waits[r]: the ranks r has waited on that long, which have nothing on its way to r — r's training thread blocked
  // all that while (a rank that computes with receives posted ahead is not stuck).
  std::map<int, std::set<int>> waits;
  for (const auto& [rank, w] : by_rank)
    for (const PendingLink& p : w->progress.pending) {
      if (w->progress.blocked_ms < limit) break;
      if (p.send || p.since_progress_ms < limit || p.peer == rank) continue;  // a cycle needs two ranks
      auto sender = by_rank.find(p.peer);
      if (sender == by_rank.end()) continue;  // its progress is unknown
      bool sending = false;
      for (const PendingLink& q : sender->second->progress.pending) sending |= q.send && q.peer == rank;
      if (!sending) waits[rank].insert(p.peer);
    }
  // A cycle in that graph (depth-first, from each rank).
  for (const auto& entry : waits) {
    const int start = entry.first;  // a plain variable: a lambda may not capture a structured binding (C++17)
    std::vector<int> path = {start};
    std::set<int> seen;
    std::function<bool(int)> visit = [&](int r) {
      auto it = waits.find(r);
      if (it == waits.end()) return false;
      for (int next : it->second) {
        if (next == start) return true;
        if (seen.insert(next).second) {
          path.push_back(next);
          if (visit(next)) return true;
          path.pop_back();
        }
      }
      return false;
    };
    if (visit(start)) {
      std::string cycle;
      for (size_t i = 0; i < path.size(); ++i)
        cycle += "rank " + std::to_string(path[i]) + " waits on rank " +
                 std::to_string(i + 1 < path.size() ? path[i + 1] : start) + ", ";
      return cycle + "each blocked, and no packet is on its way to any of them";
    }
  }
  return "";
}

void Coordinator::on_tick() {
  auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, uint32_t>> alive;  // identity, the newest Join attempt handled from it
  Deferred later;
  std::string give_up;
  {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, std::string>> silent_ones;  // identity, reason
    for (const WorkerInfo& w : workers_) {
      if (!live(w)) continue;
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.last_seen);
      if (silent > options_.heartbeat_timeout)
        silent_ones.emplace_back(w.identity, "no message for " + std::to_string(silent.count()) + " ms (timeout " +
                                                 std::to_string(options_.heartbeat_timeout.count()) + " ms)");
      else
        alive.emplace_back(w.identity, w.join.attempt);
    }
    for (const auto& [id, why] : silent_ones)
      if (WorkerInfo* w = find(id)) declare_lost(*w, WorkerInfo::State::kDead, why, later);
    for (auto it = standby_.begin(); it != standby_.end();) {
      if (now - it->last_seen > options_.heartbeat_timeout) {
        LH_LOG_WARN("coordinator: the standby worker from '{}' went silent; dropped", it->join.hostname);
        it = standby_.erase(it);
      } else {
        alive.emplace_back(it->identity, it->join.attempt);
        ++it;
      }
    }
    auto stalls = find_stalls_locked(now);
    for (const auto& [key, what] : stalls)
      if (!stalls_.count(key)) LH_LOG_WARN("coordinator: stalled data-plane {}", what);
    for (const auto& [key, what] : stalls_)
      if (!stalls.count(key))
        LH_LOG_INFO("coordinator: the link rank {} → rank {} is moving again", key.first, key.second);
    stalls_ = std::move(stalls);
    if (planned_ && !shut_down_) {
      if (std::string cycle = find_deadlock_locked(now); !cycle.empty()) {
        // A packet the data plane lost (the stall detector names the links): waiting longer changes nothing.
        // Rolling back gives every worker new data-plane endpoints and goes on from the last checkpoint.
        give_up = on_lost_messages_locked("the data plane lost a packet: " + cycle + " (for at least " +
                                              std::to_string(options_.stall_timeout.count() / 1000) + " s)",
                                          later);
      }
    }
    if (recovering_ && !shut_down_ && now > recovery_deadline_) {
      std::string ranks;
      for (int v : vacant_) ranks += (ranks.empty() ? "" : ",") + std::to_string(v);
      give_up = "no worker took the place of rank(s) " + ranks + " within the replace timeout of " +
                std::to_string(options_.replace_timeout.count() / 1000) + " s";
    }
  }
  run_all(later);
  {
    std::vector<std::string> unneeded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!standby_.empty() && all_finished_locked()) {
        for (const auto& sb : standby_) unneeded.push_back(sb.identity);
        standby_.clear();
      }
    }
    for (const auto& id : unneeded) send_raw(id, Shutdown{kJobFinishedReason});
  }
  if (!give_up.empty()) {
    LH_LOG_ERROR("coordinator: {}", give_up);
    if (hooks_.on_worker_lost) {
      WorkerInfo none;
      none.state = WorkerInfo::State::kDead;
      hooks_.on_worker_lost(none, give_up);
    }
    shutdown(give_up);
  }
  if (now - last_beat_ >= options_.heartbeat_interval) {
    last_beat_ = now;
    for (auto& [id, attempt] : alive) {
      Heartbeat hb;
      hb.join_attempt = attempt;
      send_raw(id, hb);
    }
  }
  check_barriers();  // a death or departure may complete a barrier the lost worker never reached
}

void Coordinator::handle_ctl(const std::string& id, const CtlRequest& req) {
  if (!constant_time_equal(req.token, options_.token)) return reject(id, "wrong token on a ctl request");
  // A member's arguments are JSON the handlers parse and copy: bounded before any of them sees it.
  if (Status bounded = check_json_limits(req.args, JsonLimits{kMaxCtlArgsBytes}, "a ctl request's arguments");
      !bounded.ok()) {
    LH_LOG_WARN("coordinator: {}", bounded.message());
    send_raw(id, CtlReply{false, bounded.message()});
    return;
  }
  if (hooks_.on_ctl_async) {
    hooks_.on_ctl_async(req, [this, id, command = req.command](Result<std::string> r) {
      if (!r.ok()) LH_LOG_WARN("coordinator: ctl '{}' failed: {}", command, r.status().message());
      send_raw(id, r.ok() ? CtlReply{true, r.value()} : CtlReply{false, r.status().message()});
    });
    return;
  }
  Result<std::string> reply = std::string();
  if (hooks_.on_ctl) {
    reply = hooks_.on_ctl(req);
  } else if (req.command == "status") {
    reply = status_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else if (req.command == "set-codec") {
    auto j = nlohmann::json::parse(req.args, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      reply = invalid_argument("set-codec: arguments are not a JSON object");
    } else {
      SetCodec sc;
      Status fields;
      try {
        sc = SetCodec{j.value("src", -1), j.value("dst", -1), j.value("dir", std::string()),
                      j.value("spec", std::string()), j.value("apply_at_step", int64_t(-1))};
      } catch (const nlohmann::json::exception& e) {  // {"src":"0"}: a type_error
        fields = invalid_argument(std::string("set-codec: ") + e.what());
      }
      auto check = fields.ok() ? decode_message(encode_message(sc)) : Result<ControlMessage>(fields);
      if (!check.ok())
        reply = check.status();
      else {
        broadcast(sc);
        reply = std::string(R"({"broadcast":true})");
      }
    }
  } else {
    reply = invalid_argument("unknown ctl command '" + req.command + "' (allowed: status, set-codec)");
  }
  if (reply.ok())
    send_raw(id, CtlReply{true, reply.value()});
  else {
    LH_LOG_WARN("coordinator: ctl '{}' failed: {}", req.command, reply.status().message());
    send_raw(id, CtlReply{false, reply.status().message()});
  }
}

void Coordinator::send_to(int rank, const ControlMessage& m) {
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rank_to_identity_.find(rank);
    if (it == rank_to_identity_.end()) {
      LH_LOG_WARN("coordinator: no worker has rank {}; {} not sent", rank, msg_type_name(message_type(m)));
      return;
    }
    id = it->second;
  }
  send_raw(id, m);
}

void Coordinator::broadcast(const ControlMessage& m) {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_)
      if (live(w)) ids.push_back(w.identity);
  }
  for (auto& id : ids) send_raw(id, m);
}

void Coordinator::shutdown(const std::string& reason) {
  LH_LOG_INFO("coordinator: shutting the job down: {}", reason);
  broadcast(Shutdown{reason});
  std::vector<std::string> standbys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& sb : standby_) standbys.push_back(sb.identity);
    standby_.clear();
  }
  for (const auto& id : standbys) send_raw(id, Shutdown{reason});
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  cv_.notify_all();
}

std::vector<WorkerInfo> Coordinator::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_;
}

nlohmann::json Coordinator::status_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json ws = nlohmann::json::array();
  auto now = std::chrono::steady_clock::now();
  for (auto& w : workers_)
    ws.push_back({{"rank", w.rank},
                  {"hostname", w.join.hostname},
                  {"site", w.join.site},
                  {"device", w.join.device},
                  {"compute_speed", w.join.compute_speed},
                  {"state", worker_state_name(w.state)},
                  {"silent_ms", std::chrono::duration_cast<std::chrono::milliseconds>(now - w.last_seen).count()}});
  return {{"endpoint", loop_->endpoint()},
          {"epoch", epoch_},
          {"recovering", recovering_},
          {"expected_workers", options_.expected_workers},
          {"planned", planned_},
          {"running", all_ready_},
          {"shut_down", shut_down_},
          {"rejected", rejected_},
          {"refused_connections", loop_->auth_failures()},
          {"stalls",
           [&] {
             nlohmann::json a = nlohmann::json::array();
             for (const auto& [key, what] : stalls_) a.push_back(what);
             return a;
           }()},
          {"workers", ws},
          {"preflight", preflight_json_locked()},
          {"relay", relay_                       ? nlohmann::json{{"endpoint", relay_->endpoint()},
                                            {"connected", relay_->connected()},
                                            {"dropped", relay_->dropped()}}
                    : !options_.relay_at.empty() ? nlohmann::json{{"endpoint", options_.relay_at}, {"external", true}}
                                                 : nlohmann::json(nullptr)}};
}

nlohmann::json Coordinator::preflight_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  return preflight_json_locked();
}

nlohmann::json Coordinator::preflight_json_locked() const {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& w : workers_) {
    if (w.rank < 0 || !live(w)) continue;
    for (const PeerProbe& p : w.probes)
      a.push_back({{"src", w.rank},
                   {"dst", p.peer},
                   {"link", hooks_.link_name ? hooks_.link_name(w.rank, p.peer) : ""},
                   {"ok", p.ok},
                   {"error", p.error},
                   {"rtt_ms", p.rtt_ms},
                   {"mbps", p.send_mbps},
                   {"probe_bytes", p.probe_bytes},
                   {"relayed", p.relayed}});
  }
  return a;
}

uint64_t Coordinator::rejected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

bool Coordinator::wait_all_ready(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return all_ready_ || shut_down_; }) && all_ready_;
}

bool Coordinator::all_finished_locked() const {
  if (shut_down_) return true;
  if (int(workers_.size()) < options_.expected_workers) return false;
  for (auto& w : workers_)
    if (live(w)) return false;
  return true;
}

bool Coordinator::wait_done(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return all_finished_locked(); });
}

int64_t Coordinator::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

bool Coordinator::recovering() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recovering_;
}

std::set<int> Coordinator::vacant_ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!recovering_ || planned_) return {};
  for (const WorkerInfo& w : workers_)
    if (w.rank < 0) return {};  // a standby (or a late worker) takes a place
  return vacant_;
}

Status Coordinator::regrid(int workers, const std::map<int, int>& new_rank, const std::string& reason) {
  std::vector<std::string> dropped;
  bool plan_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!recovering_ || planned_ || shut_down_) return unavailable("regrid: the job is not rolling back");
    if (workers < 1 || int(new_rank.size()) != workers)
      return invalid_argument("regrid: " + std::to_string(new_rank.size()) + " ranks kept for " +
                              std::to_string(workers) + " workers");
    std::vector<WorkerInfo> kept;
    for (WorkerInfo& w : workers_) {
      auto it = w.rank >= 0 ? new_rank.find(w.rank) : new_rank.end();
      if (it == new_rank.end()) {
        if (live(w)) dropped.push_back(w.identity);
        continue;
      }
      w.rank = it->second;
      w.join_order = int(kept.size());
      kept.push_back(std::move(w));
    }
    workers_ = std::move(kept);
    options_.expected_workers = workers;
    rank_to_identity_.clear();
    vacant_.clear();
    std::set<int> taken;
    for (const WorkerInfo& w : workers_) {
      rank_to_identity_[w.rank] = w.identity;
      taken.insert(w.rank);
    }
    for (int r = 0; r < workers; ++r)
      if (!taken.count(r)) vacant_.insert(r);
    plan_now = complete_locked();
  }
  LH_LOG_WARN("coordinator: the job goes on with {} workers; {} worker(s) leave: {}", workers, dropped.size(), reason);
  for (const std::string& id : dropped) {
    send_raw(id, Shutdown{reason});
    forget_seq(id);
  }
  if (plan_now) send_plans();
  return Status::Ok();
}

bool Coordinator::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_finished_locked();
}

}  // namespace lh
