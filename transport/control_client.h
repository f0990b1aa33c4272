// defines: lh::ControlClient, a worker's DEALER connection to the coordinator (join → plan → ready → barriers,
// heartbeats in the background, metrics up, SetCodec/PeerLost/Shutdown events down), and ctl_request() for
// one-shot tools. Used by `longhaul worker`, `launch`, `ctl` and the transport tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "transport/messages.h"
#include "transport/zmq_loop.h"

namespace lh {

struct ControlClientOptions {
  std::string coordinator;  // "tcp://HOST:PORT"
  std::string token;
  std::string hostname;  // empty: gethostname()
  std::string site;      // Join::site
  std::string device = "cpu";
  double compute_speed = 0;
  // The addresses its data plane listens at (Join::data_addresses), for messages naming a pair that cannot connect.
  std::string data_addresses;
  // Until the Plan says otherwise: how often to heartbeat, and how long the coordinator may be silent
  // before it is considered lost (a Shutdown event is then queued).
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds coordinator_timeout{5000};
  // 0: a coordinator silent past the timeout ends the job (a Shutdown event). Otherwise, once joined, its loss is a
  // Rollback event: the worker joins again (as the same rank) and this long is waited for a coordinator to answer at
  // the same address (one restarted with --resume) before a Shutdown event ends it.
  std::chrono::milliseconds coordinator_wait{0};
  // The control plane's encryption (JobSecret::client_curve); the apps always set it.
  std::optional<ZmqLoop::Curve> curve;
};

// Typical worker:
//   auto cc = ControlClient::connect(opts);                     // starts the background thread
//   LH_ASSIGN_OR_RETURN(Plan plan, (*cc)->join(plane->address(), 60s));
//   plane->connect(plan.rank, addresses from plan.peers);
//   LH_RETURN_IF_ERROR((*cc)->ready(60s));                       // returns when every worker is ready
//   for each step: while (auto ev = cc->poll_event()) { SetCodec / PeerLost / Shutdown … }
//                  cc->send_metrics(step, json);
//   cc->leave("done");
class ControlClient {
 public:
  static Result<std::unique_ptr<ControlClient>> connect(const ControlClientOptions& options);
  ~ControlClient();

  // Sends Join and waits for this worker's Plan. A Reject (wrong token, job full …) is returned as
  // InvalidArgument carrying the coordinator's reason.
  // After a Rollback event, join() may be called again (with a new data-plane address and the rank held): the
  // events, barriers and plan of the abandoned epoch are dropped.
  // `data_key` / `data_ciphers`: the data plane's public key and the CPU's fast ciphers (Join::data_key).
  Result<Plan> join(const std::vector<uint8_t>& ucx_address, std::chrono::milliseconds timeout, int rank = -1,
                    std::vector<uint8_t> data_key = {}, uint32_t data_ciphers = 0);
  // Sends Ready and waits for the start barrier (Barrier 0).
  Status ready(std::chrono::milliseconds timeout);
  // Sends this worker's pre-flight and waits until every worker's is in (kPreflightBarrier); fails when the
  // coordinator ends the job instead (an unreachable pair).
  Status preflight(std::vector<PeerProbe> probes, std::chrono::milliseconds timeout);
  // Sends which peers reached this worker directly (the pre-flight's first phase) and waits for the coordinator's
  // answer: the pairs that go through the relay, and where it is. Fails when the coordinator ends the job instead (a
  // pair that cannot connect and no relay allowed).
  Result<Relays> reach(std::vector<PeerProbe> reached, std::chrono::milliseconds timeout);
  // Waits until every live worker reached barrier `id` (> 0).
  Status barrier(uint64_t id, std::chrono::milliseconds timeout);
  void send_metrics(int64_t step, std::string json);
  // What became of a SetCodec with an id (scheduled from a step, or refused), for `ctl set-codec`.
  void acknowledge(const CodecApplied& ack) { send(ack); }
  // This worker was told to stop (SIGTERM): the coordinator answers with a Preempt naming the step after which every
  // worker saves a checkpoint and stops (an event), or shuts the job down when it keeps no checkpoints.
  void request_preempt(const std::string& reason) { send(Preempt{-1, reason}); }
  // This worker's state after `step` (a job checkpoint's shard). It goes in parts of kShardPartBytes, each sent once
  // the coordinator's ShardAcks say that no more than about a second of the link's measured rate (at least 4 parts)
  // is in flight: the heartbeats and metrics sent meanwhile pass the rest of the shard, so a slow link does not get
  // this worker declared dead. Shards go one after another; barrier() waits for them first.
  void send_shard(int64_t step, std::vector<uint8_t> bytes);
  // Tells the coordinator that this epoch's checkpoint (the plan's resume step) cannot be loaded here, and waits up to
  // `timeout` for the rollback it answers with (the coordinator sets the checkpoint aside): kAborted then, as for
  // any rollback (join again); else `why` itself.
  Status report_resume_failed(int64_t step, const Status& why, std::chrono::milliseconds timeout);
  // Whether a Rollback arrived since the last join (ready() and barrier() then return kAborted).
  bool rolled_back() const;
  // Tells the coordinator this worker is leaving (it then tells the others).
  void leave(const std::string& reason);

  // Pushed by the coordinator after the plan: SetCodec, PeerLost, Rollback, Shutdown (also queued when the
  // coordinator goes silent), and Reject for a refused message.
  std::optional<ControlMessage> poll_event();
  std::optional<ControlMessage> wait_event(std::chrono::milliseconds timeout);
  bool shutdown_requested() const;
  std::string shutdown_reason() const;
  const std::optional<Plan>& plan() const { return plan_; }

  // For tests: stop heartbeating (the coordinator should declare this worker dead).
  void stop_heartbeats_for_test() { heartbeats_paused_ = true; }
  // What the next heartbeats tell the coordinator about this worker's progress (thread-safe; a callback run on
  // the control thread before each heartbeat).
  void set_progress_source(std::function<Heartbeat()> source);
  // Messages from the coordinator found missing so far (their numbers skipped: a reset connection).
  uint64_t lost_messages() const;

 private:
  ControlClient() = default;
  void on_message(Frames&& frames);
  // The coordinator acknowledged parts of the shard in flight: the window moves on.
  void on_shard_ack(const ControlHeader& h, const ShardAck& ack);
  // With mu_ held: the coordinator refused a message of ours; false when no one is to hear of it.
  bool on_reject_locked(ControlMessage& m);
  void on_tick();
  void send(const ControlMessage& m);
  // With mu_ held: the coordinator's message numbering (ControlHeader::seq).
  void check_seq_locked(const ControlHeader& h);
  // With mu_ held, while join() waits for its Plan: what the coordinator's heartbeat (or refusal of ours) says about
  // our Join. A Join it never got is sent again (same attempt); a first reply it sent that never came makes a new
  // attempt.
  void check_join_locked(const ControlHeader& h, const ControlMessage& m);
  // Sends the parts of the queued shards that the window allows (shard_mu_ taken inside; any thread).
  void pump_shards();
  // Waits until every queued shard is acknowledged whole (or the job ends or rolls back), up to `timeout`.
  Status flush_shards(std::chrono::milliseconds timeout);

  ControlClientOptions options_;
  std::unique_ptr<ZmqLoop> loop_;
  std::optional<Plan> plan_;  // written by join() only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Result<Plan>> join_reply_;
  std::set<uint64_t> released_barriers_;
  std::optional<Relays> relays_;  // the coordinator's answer to this epoch's reach()
  std::deque<ControlMessage> events_;
  bool shutdown_ = false, joined_ = false;
  bool rollback_ = false;          // a Rollback arrived for the current epoch
  bool rejoining_ = false;         // join() after a Rollback: the coordinator's silence is still judged
  bool coordinator_lost_ = false;  // waiting (coordinator_wait) for a coordinator to come back
  std::chrono::steady_clock::time_point lost_since_{}, join_sent_at_{};
  int64_t epoch_ = 1;
  std::string shutdown_reason_;
  bool join_sent_ = false;  // heartbeats run from the Join on, so a worker waiting minutes for the others stays alive
  std::chrono::steady_clock::time_point last_heard_{}, last_beat_{};
  std::chrono::milliseconds interval_{500}, timeout_{5000};
  uint64_t seq_ = 0;
  std::atomic<bool> heartbeats_paused_{false};
  std::mutex send_mu_;     // numbers and queues a message in one go
  uint32_t send_seq_ = 0;  // the number of this worker's next message (a Join restarts it at 0)
  bool rx_known_ = false;  // the coordinator's numbering is known (since its message number 0)
  uint32_t rx_next_ = 0;
  uint64_t lost_messages_ = 0;
  uint32_t attempt_ = 0;  // this worker's join attempts so far (Join::attempt)
  Join join_msg_;         // the Join of the current attempt, sent again if it went missing
  std::chrono::steady_clock::time_point join_last_sent_{};
  std::function<Heartbeat()> progress_;  // guarded by mu_
  // Shards on their way up (send_shard): the front one is being sent. Guarded by shard_mu_ (taken after mu_, never
  // before it).
  struct OutShard {
    int32_t rank = -1;  // taken from the plan on the sending thread (join() replaces the plan)
    int64_t step = 0;
    std::vector<uint8_t> bytes;
    uint64_t sent = 0, acked = 0;
  };
  std::mutex shard_mu_;
  std::condition_variable shard_cv_;
  std::deque<OutShard> shards_out_;
  uint64_t shard_epoch_ = 0;  // bumped by join(): an abandoned epoch's shards are dropped
  // The link's rate as the acknowledgements measure it (bytes/s; 0: not yet), and when the window was last opened.
  double ack_rate_ = 0;
  std::chrono::steady_clock::time_point last_ack_{};
};

// One request from a tool that has not joined (`longhaul ctl`): sends `req`, waits for the CtlReply.
Result<CtlReply> ctl_request(const std::string& coordinator, const CtlRequest& req, std::chrono::milliseconds timeout,
                             const std::optional<ZmqLoop::Curve>& curve = std::nullopt);

}  // namespace lh
