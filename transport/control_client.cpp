// A worker's side of the control plane and the one-shot ctl request. Used by the app layer and tests.
#include "transport/control_client.h"

#include <unistd.h>

#include <cstdio>
#include <random>

#include "core/log.h"
#include "transport/worker_address.h"

namespace lh {
namespace {
// A Join the coordinator's heartbeats say it has not received is sent again after twice the heartbeat interval, and
// never more often than this (a heartbeat may have left the coordinator before the Join arrived).
constexpr std::chrono::milliseconds kJoinResendMin{500};
}  // namespace

Result<std::unique_ptr<ControlClient>> ControlClient::connect(const ControlClientOptions& options) {
  std::unique_ptr<ControlClient> c(new ControlClient());
  c->options_ = options;
  if (c->options_.hostname.empty()) {
    char buf[256] = {};
    gethostname(buf, sizeof(buf) - 1);
    c->options_.hostname = buf;
  }
  c->interval_ = options.heartbeat_interval;
  c->timeout_ = options.coordinator_timeout;
  c->last_heard_ = std::chrono::steady_clock::now();
  ZmqLoop::Options lo;
  lo.socket_type = ZMQ_DEALER;
  lo.endpoint = options.coordinator;
  lo.tick = std::min(options.heartbeat_interval, std::chrono::milliseconds(100));
  lo.max_message_bytes = int64_t(kMaxControlMessage);
  lo.curve = options.curve;
  {
    // One id for this worker's whole life: after a reset connection ZeroMQ reconnects, and the coordinator still
    // knows it ("lh-" and 16 random hex digits; ids starting with a zero byte are ZeroMQ's own).
    std::random_device rd;
    char id[32];
    std::snprintf(id, sizeof(id), "lh-%08x%08x", rd(), rd());
    lo.routing_id = id;
  }
  ControlClient* self = c.get();
  LH_ASSIGN_OR_RETURN(c->loop_,
                      ZmqLoop::start(
                          lo, [self](Frames&& f) { self->on_message(std::move(f)); }, [self] { self->on_tick(); }));
  return c;
}

ControlClient::~ControlClient() {
  // The loop's thread may still run on_tick → send() → loop_->send() until the loop's destructor has joined it, so
  // loop_ keeps pointing at the loop while it is destroyed (unique_ptr::reset would null it first: a crash seen in
  // Coordinator.SilentWorkerIsDeclaredDeadAndOthersAreTold under load). ZmqLoop::send stays safe until that join.
  if (ZmqLoop* loop = loop_.get()) {
    delete loop;
    (void)loop_.release();
  }
}

void ControlClient::send(const ControlMessage& m) {
  std::lock_guard<std::mutex> lock(send_mu_);
  const MsgType type = message_type(m);
  if (type == MsgType::kJoin) send_seq_ = 0;
  loop_->send({encode_message(m, take_seq(type, &send_seq_))});
}

void ControlClient::set_progress_source(std::function<Heartbeat()> source) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = std::move(source);
}

uint64_t ControlClient::lost_messages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_messages_;
}

void ControlClient::check_seq_locked(const ControlHeader& h) {
  const bool beat = h.type == MsgType::kHeartbeat;
  if (!beat && h.seq == 0) {  // the coordinator's first message since it handled our Join
    rx_known_ = true;
    rx_next_ = 1;
    return;
  }
  if (!rx_known_) return;
  const int64_t gap = advance_seq(h, &rx_next_);
  if (gap == 0) return;
  lost_messages_ += gap > 0 ? uint64_t(gap) : 1;
  // Whatever was lost (a barrier release, a codec change …) leaves this worker's epoch unreliable: it leaves the
  // epoch and joins again as itself, which rolls the job back to its last checkpoint.
  if (joined_ && !rollback_ && !shutdown_) {
    const std::string why = std::to_string(gap > 0 ? gap : 1) +
                            " message(s) from the coordinator were lost (a reset connection?); joining again";
    LH_LOG_WARN("control: {}", why);
    rollback_ = true;
    events_.push_back(Rollback{epoch_, why});
    cv_.notify_all();
  }
}

void ControlClient::check_join_locked(const ControlHeader& h, const ControlMessage& m) {
  if (!join_sent_ || joined_ || join_reply_ || shutdown_) return;  // not waiting for a Plan
  const auto now = std::chrono::steady_clock::now();
  std::string why;
  if (const auto* hb = std::get_if<Heartbeat>(&m)) {
    if (hb->join_attempt == attempt_ && h.seq > 0 && !rx_known_) {
      // The coordinator has handled this Join and sent something (its Plan) that never came: a new attempt, which
      // it takes as this worker joining again.
      ++attempt_;
      join_msg_.attempt = attempt_;
      why = "the coordinator's answer to it was lost";
    } else if (hb->join_attempt < attempt_ && now - join_last_sent_ > std::max(2 * interval_, kJoinResendMin)) {
      why = "the coordinator has not received it";
    }
  } else if (const auto* r = std::get_if<Reject>(&m); r && r->about == uint16_t(MsgType::kHeartbeat)) {
    // A heartbeat refused as coming from a stranger: the coordinator does not know this worker (yet).
    if (now - join_last_sent_ > std::max(2 * interval_, kJoinResendMin))
      why = "the coordinator does not know this worker";
  }
  if (why.empty()) return;
  LH_LOG_WARN("control: sending the Join again, as attempt {} ({}; a reset connection?)", attempt_, why);
  join_last_sent_ = now;
  rx_known_ = false;
  send(join_msg_);  // send_mu_ is never held while mu_ is taken
}

void ControlClient::on_shard_ack(const ControlHeader& h, const ShardAck& ack) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_seq_locked(h);
    last_heard_ = std::chrono::steady_clock::now();
  }
  {
    std::lock_guard<std::mutex> lock(shard_mu_);
    if (!shards_out_.empty() && shards_out_.front().step == ack.step && ack.received > shards_out_.front().acked &&
        ack.received <= shards_out_.front().sent) {
      OutShard& out = shards_out_.front();
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last_ack_).count();
      if (out.acked > 0 && dt > 0) {  // the rate since the previous ack of this shard, smoothed
        const double rate = double(ack.received - out.acked) / dt;
        ack_rate_ = ack_rate_ > 0 ? 0.7 * ack_rate_ + 0.3 * rate : rate;
      }
      last_ack_ = now;
      out.acked = ack.received;
      if (out.acked == out.bytes.size()) shards_out_.pop_front();
    }
  }
  shard_cv_.notify_all();
  pump_shards();
}

bool ControlClient::on_reject_locked(ControlMessage& m) {
  const Reject& r = std::get<Reject>(m);
  if (r.about == uint16_t(MsgType::kJoin) && !joined_ && !join_reply_) {
    LH_LOG_WARN("control: the coordinator refused to let this worker join: {}", r.reason);
    join_reply_ = Result<Plan>(invalid_argument("join refused: " + r.reason));
    return true;
  }
  // A coordinator restarted after a loss refuses what the old one would have taken (queued while it was away).
  if (coordinator_lost_) {
    LH_LOG_DEBUG("control: the coordinator refused a message sent before it was restarted: {}", r.reason);
    return false;
  }
  LH_LOG_WARN("control: the coordinator refused a message: {}", r.reason);
  if (r.about == uint16_t(MsgType::kShardSaved)) {
    // The coordinator takes no shard from this worker now (its parts answered with refusals, one each): what is
    // queued will not be committed, and barrier() need not wait for it.
    std::lock_guard<std::mutex> shards(shard_mu_);
    shards_out_.clear();
    shard_cv_.notify_all();
  }
  events_.push_back(std::move(m));
  return true;
}

void ControlClient::on_message(Frames&& frames) {
  if (frames.size() != 1) {
    LH_LOG_WARN("control: ignoring a {}-frame message from the coordinator", frames.size());
    return;
  }
  // The header first: only what a coordinator sends is decoded.
  auto header = decode_header(frames[0].data(), frames[0].size());
  if (!header.ok()) {
    LH_LOG_WARN("control: ignoring a bad message from the coordinator: {}", header.status().message());
    return;
  }
  switch (header->type) {
    case MsgType::kPlan:
    case MsgType::kBarrier:
    case MsgType::kHeartbeat:
    case MsgType::kSetCodec:
    case MsgType::kSetLink:
    case MsgType::kShutdown:
    case MsgType::kReject:
    case MsgType::kPeerLost:
    case MsgType::kRollback:
    case MsgType::kRelays:
    case MsgType::kShardAck:
    case MsgType::kPreempt:
      break;
    default:
      LH_LOG_WARN("control: ignoring {} from the coordinator (not a message a coordinator sends)",
                  msg_type_name(header->type));
      return;
  }
  auto decoded = decode_message(frames[0]);
  if (!decoded.ok()) {
    LH_LOG_WARN("control: ignoring a bad message from the coordinator: {}", decoded.status().message());
    return;
  }
  ControlMessage& m = decoded.value();
  if (auto* ack = std::get_if<ShardAck>(&m)) return on_shard_ack(*header, *ack);
  std::lock_guard<std::mutex> lock(mu_);
  check_join_locked(*header, m);
  check_seq_locked(*header);
  // A refusal of anything but a Join says the coordinator does not know this worker (e.g. one restarted after a
  // loss): it is not a sign of a live coordinator of this worker's job.
  const bool refusal = message_type(m) == MsgType::kReject && std::get<Reject>(m).about != uint16_t(MsgType::kJoin);
  if (!refusal) last_heard_ = std::chrono::steady_clock::now();
  switch (message_type(m)) {
    case MsgType::kHeartbeat:
      return;
    case MsgType::kPlan:
      if (joined_ || join_reply_) {
        LH_LOG_WARN("control: ignoring a second Plan");
        return;
      }
      join_reply_ = Result<Plan>(std::get<Plan>(std::move(m)));
      break;
    case MsgType::kReject:
      if (!on_reject_locked(m)) return;
      break;
    case MsgType::kBarrier:
      released_barriers_.insert(std::get<Barrier>(m).id);
      break;
    case MsgType::kRelays:
      relays_ = std::get<Relays>(std::move(m));
      break;
    case MsgType::kShutdown:
      shutdown_ = true;
      shutdown_reason_ = std::get<Shutdown>(m).reason;
      events_.push_back(std::move(m));
      break;
    case MsgType::kRollback: {
      // A Rollback that came before this join's Plan belongs to an epoch this worker has already left.
      const int64_t current = joined_ ? epoch_ : join_reply_ && join_reply_->ok() ? (*join_reply_)->epoch : -1;
      if (current < 0 || std::get<Rollback>(m).epoch < current || rollback_) return;
    }
      rollback_ = true;
      events_.push_back(std::move(m));
      break;
    case MsgType::kSetCodec:
    case MsgType::kSetLink:
    case MsgType::kPeerLost:
    case MsgType::kPreempt:
      events_.push_back(std::move(m));
      break;
    default:
      LH_LOG_WARN("control: ignoring {} from the coordinator", msg_type_name(message_type(m)));
      return;
  }
  cv_.notify_all();
}

void ControlClient::on_tick() {
  auto now = std::chrono::steady_clock::now();
  bool beat = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!join_sent_) return;  // nothing to keep alive yet
    // The coordinator's own heartbeat interval comes with the Plan; until then, its silence is judged by join()'s
    // timeout (the join window), not by this client's default.
    if (!shutdown_ && (joined_ || rejoining_) && now - last_heard_ > timeout_) {
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_).count();
      if (options_.coordinator_wait.count() > 0 && joined_ && !coordinator_lost_ && !rollback_) {
        LH_LOG_ERROR("control: coordinator silent for {} ms; waiting up to {} s for it to come back", silent,
                     options_.coordinator_wait.count() / 1000);
        coordinator_lost_ = true;
        lost_since_ = now;
        rollback_ = true;
        events_.push_back(Rollback{epoch_, "the coordinator was lost (silent for " + std::to_string(silent) + " ms)"});
        cv_.notify_all();
        return;
      }
      if (coordinator_lost_ && now - lost_since_ < options_.coordinator_wait) return;  // still waiting for it
      LH_LOG_ERROR("control: coordinator silent for {} ms; treating it as lost", silent);
      shutdown_ = true;
      events_.push_back(Shutdown{"coordinator lost: silent for " + std::to_string(silent) + " ms"});
      cv_.notify_all();
      return;
    }
    // While a lost coordinator is awaited, heartbeats wait until a coordinator answers (they would only queue up).
    const bool awaiting = coordinator_lost_ && last_heard_ <= join_sent_at_;
    if (!shutdown_ && !heartbeats_paused_ && !awaiting && now - last_beat_ >= interval_) {
      last_beat_ = now;
      beat = true;
    }
  }
  if (beat) {
    Heartbeat hb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (progress_ && joined_) hb = progress_();
      hb.join_attempt = attempt_;
    }
    hb.seq = ++seq_;
    send(hb);
  }
}

Result<Plan> ControlClient::join(const std::vector<uint8_t>& ucx_address, std::chrono::milliseconds timeout, int rank,
                                 std::vector<uint8_t> data_key, uint32_t data_ciphers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if ((joined_ || join_reply_ || join_sent_) && !rollback_) return invalid_argument("join() called twice");
    // A rejoin after a Rollback: what belonged to the abandoned epoch goes.
    rejoining_ = joined_;
    joined_ = false;
    {
      std::lock_guard<std::mutex> shards(shard_mu_);
      shards_out_.clear();  // the abandoned epoch's checkpoint is never committed
    }
    join_reply_.reset();
    released_barriers_.clear();
    relays_.reset();
    events_.clear();
    rollback_ = false;
    rx_known_ = false;  // the coordinator numbers its messages afresh once it has our Join
    last_heard_ = std::chrono::steady_clock::now();
    join_sent_at_ = last_heard_;
    join_sent_ = true;
  }
  plan_.reset();
  Join j;
  j.token = options_.token;
  j.hostname = options_.hostname;
  j.site = options_.site;
  j.device = options_.device;
  j.compute_speed = options_.compute_speed;
  j.data_addresses = options_.data_addresses;
  j.interfaces = options_.data_addresses;
  // A worker that advertises an address (--advertise) is reached there, not at its interfaces' own.
  if (auto a = unwrap_peer_address(ucx_address); a.ok() && !a->host.empty()) j.data_addresses = a->describe();
  j.ucx_address = ucx_address;
  j.rank = rank;
  j.data_key = std::move(data_key);
  j.data_ciphers = data_ciphers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    j.attempt = ++attempt_;
    join_msg_ = j;
    join_last_sent_ = std::chrono::steady_clock::now();
    send(j);  // under mu_, so a heartbeat's check_join_locked sees this attempt and its Join in one state
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return join_reply_.has_value() || shutdown_; }))
    return unavailable("no Plan from the coordinator at " + options_.coordinator + " within " +
                       std::to_string(timeout.count()) + " ms");
  if (!join_reply_) return unavailable("the coordinator stopped the job: " + shutdown_reason_);
  Result<Plan> r = std::move(*join_reply_);
  if (!r.ok()) return r.status();
  joined_ = true;
  rejoining_ = false;
  coordinator_lost_ = false;
  epoch_ = r->epoch;
  interval_ = std::chrono::milliseconds(r->heartbeat_interval_ms);
  timeout_ = std::chrono::milliseconds(r->heartbeat_timeout_ms);
  plan_ = r.value();
  return r;
}

Status ControlClient::preflight(std::vector<PeerProbe> probes, std::chrono::milliseconds timeout) {
  if (!plan_) return invalid_argument("preflight() before join()");
  send(Preflight{plan_->rank, std::move(probes)});
  Status s = barrier(kPreflightBarrier, timeout);
  if (!s.ok() && shutdown_requested()) return unavailable("the job ended at its pre-flight: " + shutdown_reason());
  return s;
}

Result<Relays> ControlClient::reach(std::vector<PeerProbe> reached, std::chrono::milliseconds timeout) {
  if (!plan_) return invalid_argument("reach() before join()");
  Preflight m{plan_->rank, std::move(reached)};
  m.phase = Preflight::kReach;
  send(m);
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return relays_.has_value() || shutdown_ || rollback_; }))
    return unavailable("no answer to this worker's reachability from the coordinator within " +
                       std::to_string(timeout.count()) + " ms");
  if (rollback_) return aborted("the job rolled back during the pre-flight");
  if (!relays_) return unavailable("the job ended at its pre-flight: " + shutdown_reason_);
  Relays r = std::move(*relays_);
  relays_.reset();
  return r;
}

Status ControlClient::ready(std::chrono::milliseconds timeout) {
  if (!plan_) return invalid_argument("ready() before join()");
  send(Ready{plan_->rank});
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return released_barriers_.count(0) || shutdown_ || rollback_; }))
    return unavailable("the job did not start within " + std::to_string(timeout.count()) + " ms");
  if (rollback_ && !released_barriers_.count(0)) return aborted("the job rolled back before it started");
  if (!released_barriers_.count(0)) return unavailable("shut down before the job started");
  return Status::Ok();
}

Status ControlClient::barrier(uint64_t id, std::chrono::milliseconds timeout) {
  if (!plan_) return invalid_argument("barrier() before join()");
  if (id == 0) return invalid_argument("barrier 0 is the start barrier; use ready()");
  // A shard still on its way would arrive after the barrier's release: the job could end before it is saved.
  LH_RETURN_IF_ERROR(flush_shards(timeout));
  send(Barrier{id});
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return released_barriers_.count(id) || shutdown_ || rollback_; }))
    return unavailable("barrier " + std::to_string(id) + " not released within " + std::to_string(timeout.count()) +
                       " ms");
  if (rollback_ && !released_barriers_.count(id))
    return aborted("the job rolled back while waiting at barrier " + std::to_string(id));
  if (!released_barriers_.count(id)) return unavailable("shut down while waiting at barrier " + std::to_string(id));
  released_barriers_.erase(id);
  return Status::Ok();
}

void ControlClient::send_metrics(int64_t step, std::string json) {
  if (!plan_) return;
  send(StepMetrics{plan_->rank, step, std::move(json)});
}

void ControlClient::send_shard(int64_t step, std::vector<uint8_t> bytes) {
  if (!plan_ || bytes.empty()) return;
  {
    std::lock_guard<std::mutex> lock(shard_mu_);
    OutShard out;
    out.rank = plan_->rank;
    out.step = step;
    out.bytes = std::move(bytes);
    shards_out_.push_back(std::move(out));
  }
  pump_shards();
}

void ControlClient::pump_shards() {
  {
    // Sent under shard_mu_: pumps on two threads (the training thread's send_shard, the control thread's acks)
    // must not interleave their parts out of order.
    std::lock_guard<std::mutex> lock(shard_mu_);
    if (shards_out_.empty()) return;
    OutShard& out = shards_out_.front();
    if (out.sent == 0) last_ack_ = std::chrono::steady_clock::now();
    // In flight: about one second of the measured rate, at least 4 parts (the rate of a first shard is unknown:
    // 256 KiB take 2 s at 1 Mbit/s, still under a heartbeat timeout of 5 s).
    const uint64_t window = std::max<uint64_t>(4 * kShardPartBytes, uint64_t(ack_rate_));
    while (out.sent < out.bytes.size() && out.sent - out.acked < window) {
      const uint64_t n = std::min<uint64_t>(kShardPartBytes, out.bytes.size() - out.sent);
      ShardSaved part{out.rank, out.step, {}, out.sent, out.bytes.size()};
      part.bytes.assign(out.bytes.begin() + int64_t(out.sent), out.bytes.begin() + int64_t(out.sent + n));
      out.sent += n;
      send(part);
    }
  }
}

Status ControlClient::flush_shards(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(shard_mu_);
      auto idle = [&] { return shards_out_.empty(); };
      if (shard_cv_.wait_for(lock, std::chrono::milliseconds(100), idle)) return Status::Ok();
      if (std::chrono::steady_clock::now() >= deadline)
        return unavailable("the checkpoint shard of step " + std::to_string(shards_out_.front().step) +
                           " did not reach the coordinator within " + std::to_string(timeout.count()) + " ms (" +
                           std::to_string(shards_out_.front().acked) + " of " +
                           std::to_string(shards_out_.front().bytes.size()) + " bytes acknowledged)");
    }
    // Checked without shard_mu_ (mu_ comes first): a job that ended or rolled back will never take the rest.
    if (shutdown_requested() || rolled_back()) return Status::Ok();
  }
}

Status ControlClient::report_resume_failed(int64_t step, const Status& why, std::chrono::milliseconds timeout) {
  if (!plan_) return why;
  std::string reason = why.message();
  if (reason.size() > 900) reason = reason.substr(0, 900) + "…";
  send(ResumeFailed{plan_->rank, step, reason});
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return rollback_ || shutdown_; });
  if (rollback_) return aborted("the checkpoint of step " + std::to_string(step) + " could not be loaded; the job "
                                "rolls back to an older one: " + why.message());
  return why;
}

bool ControlClient::rolled_back() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rollback_;
}

void ControlClient::leave(const std::string& reason) {
  heartbeats_paused_ = true;  // the coordinator has forgotten us; a heartbeat now would be refused
  send(Shutdown{reason});
}

std::optional<ControlMessage> ControlClient::poll_event() {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return std::nullopt;
  ControlMessage m = std::move(events_.front());
  events_.pop_front();
  return m;
}

std::optional<ControlMessage> ControlClient::wait_event(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  ControlMessage m = std::move(events_.front());
  events_.pop_front();
  return m;
}

std::string ControlClient::shutdown_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_reason_;
}

bool ControlClient::shutdown_requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_;
}

Result<CtlReply> ctl_request(const std::string& coordinator, const CtlRequest& req, std::chrono::milliseconds timeout,
                             const std::optional<ZmqLoop::Curve>& curve) {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  auto cleanup = [&] {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  };
  int linger = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
  if (curve) {
    zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, curve->server_key.c_str(), curve->server_key.size() + 1);
    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, curve->public_key.c_str(), curve->public_key.size() + 1);
    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, curve->secret_key.c_str(), curve->secret_key.size() + 1);
  }
  if (zmq_connect(sock, coordinator.c_str()) != 0) {
    std::string why = zmq_strerror(zmq_errno());
    cleanup();
    return invalid_argument("cannot connect to '" + coordinator + "': " + why);
  }
  auto msg = encode_message(req);
  zmq_send(sock, msg.data(), msg.size(), 0);
  zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    long left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0 || zmq_poll(&item, 1, left) <= 0) {
      cleanup();
      return unavailable(
          "no reply from the coordinator at " + coordinator +
          (curve ? " (is it running? a --key-file other than the job's makes it refuse the connection)" : ""));
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, sock, 0);
    auto* p = static_cast<uint8_t*>(zmq_msg_data(&m));
    std::vector<uint8_t> bytes(p, p + zmq_msg_size(&m));
    zmq_msg_close(&m);
    auto d = decode_message(bytes);
    if (!d.ok()) continue;  // e.g. a heartbeat-era message we do not care about
    if (auto* reply = std::get_if<CtlReply>(&d.value())) {
      cleanup();
      return *reply;
    }
    if (auto* rej = std::get_if<Reject>(&d.value())) {
      std::string why = rej->reason;
      cleanup();
      return invalid_argument("coordinator refused the request: " + why);
    }
  }
}

}  // namespace lh
