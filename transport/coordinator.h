// defines: lh::Coordinator, the job's control-plane hub: a ROUTER socket that admits workers by join token,
// hands out Plans, releases barriers, exchanges heartbeats, declares silent workers dead (telling the others),
// relays metrics and ctl requests to app hooks, and rejects anything malformed while serving the rest.
// Used by `longhaul coordinator` / `launch` and the transport tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "transport/messages.h"
#include "transport/relay.h"
#include "transport/zmq_loop.h"

namespace lh {

struct CoordinatorOptions {
  std::string listen = "tcp://127.0.0.1:*";  // '*' port: pick a free one (see endpoint())
  std::string token;                         // the shared join token (compared in constant time)
  // The control plane's encryption and admission (JobSecret::server_curve); the apps always set it.
  std::optional<ZmqLoop::Curve> curve;
  int expected_workers = 1;  // plans go out once this many have joined
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds heartbeat_timeout{5000};  // silence longer than this: dead
  // 0: a dead worker ends the job. Otherwise a worker declared dead while the job runs starts a rollback: the
  // survivors are sent Rollback and join again as themselves, the dead one's rank waits this long for a new worker
  // (any that joins with the token), and the job is planned again (a new epoch) once every rank is back. A worker
  // that dies before the plan only frees its place.
  std::chrono::milliseconds replace_timeout{0};
  // 0: off. Otherwise a data-plane link of a running job on which nothing has moved this long (judged from the
  // workers' heartbeats: a receive waiting that long with no transfer with that peer finished) is named in the log
  // and in status_json()'s "stalls", with what its sender is doing.
  std::chrono::milliseconds stall_timeout{0};
  // The data-plane relay (transport/relay.h) for pairs of workers that cannot connect directly: started beside the
  // control socket with its token and keys. Off: such a pair ends the job at its pre-flight, named.
  bool relay = true;
  // Where the relay listens. Empty: the control socket's host, on the next port when that one is fixed (7000 → 7001),
  // on any free port when it is '*'.
  std::string relay_listen;
  // "tcp://HOST:PORT": a relay run elsewhere (`longhaul relay`, e.g. on a well-connected machine) that the workers
  // use instead; the coordinator then starts none. Empty: its own (when `relay`).
  std::string relay_at;
  // The key the relay at relay_at checks each rank's hello with (RelayOptions::rank_key; `longhaul relay` derives
  // the same one from the job secret, or takes --relay-key-file): each Plan carries its rank's token. The relay the
  // coordinator starts itself uses a random key of its own instead.
  std::string relay_rank_key;
};

struct WorkerInfo {
  // kRejoining: told to roll back, expected to join again as the same rank.
  enum class State { kJoined, kPlanned, kReady, kDead, kLeft, kRejoining };
  std::string identity;  // ZeroMQ routing id
  int rank = -1;         // -1 until planned
  int join_order = 0;    // 0 for the first worker to join
  Join join;             // what it told us (token cleared)
  State state = State::kJoined;
  std::chrono::steady_clock::time_point last_seen{};
  uint32_t next_seq = 1;  // the sequence number its next message must carry (ControlHeader::seq)
  Heartbeat progress;     // its latest heartbeat (step, pending data-plane transfers)
  std::vector<PeerProbe> probes;  // its pre-flight of this epoch (Preflight): one per peer it talks to
  // Its reachability of this epoch (Preflight phase kReach), and whether the coordinator has answered it (Relays).
  std::optional<std::vector<PeerProbe>> reach;
  bool reach_answered = false;
  std::chrono::steady_clock::time_point progress_at{};
  int64_t resume_step = 0;  // where its plan of this epoch starts (a ResumeFailed must name it)
  // Its checkpoint shard on its way up (ShardSaved parts, in order): the step and the bytes so far.
  int64_t shard_step = 0;
  std::vector<uint8_t> shard_bytes;
};
const char* worker_state_name(WorkerInfo::State s);

// Every hook runs on the coordinator's thread, one at a time; hooks may call send_to/broadcast/
// shutdown (they queue) but must not block for long.
struct CoordinatorHooks {
  std::function<void(const WorkerInfo&)> on_join;
  // Builds the Plans once expected_workers have joined; `workers` is in rank order (workers[i].rank == i: survivors
  // of a rollback keep theirs, a worker naming a free rank gets it, the rest take the free ranks in join order; when
  // workers name sites, the new ones take the free ranks site by site, see Join::site) and
  // plan i goes to workers[i]. Plan ranks must be 0..N-1, each once; the coordinator sets each plan's epoch. The
  // coordinator fills in `peers` (every rank's hostname, device and UCX address) when a plan leaves it empty, and
  // always sets the heartbeat fields. Unset: worker i gets rank i in a pp=N pipeline with no codecs and an empty
  // config.
  std::function<Result<std::vector<Plan>>(const std::vector<WorkerInfo>&)> make_plans;
  std::function<void()> on_all_ready;  // after Barrier 0 went out
  std::function<void(const StepMetrics&)> on_metrics;
  // A worker stopped heartbeating (dead) or said Shutdown (left). The others were already told (PeerLost).
  std::function<void(const WorkerInfo&, const std::string& reason)> on_worker_lost;
  // `longhaul ctl`: returns the reply body (JSON text) or an error. Unset: "status" answers
  // status_json(), "set-codec" (args: a SetCodec as {"src","dst","dir","spec","apply_at_step"}) is
  // broadcast to the workers, anything else is refused.
  std::function<Result<std::string>(const CtlRequest&)> on_ctl;
  // Takes precedence over on_ctl: the reply may come later (call `reply` once, from any thread, while the
  // coordinator lives), e.g. once the workers acknowledged a codec change.
  using CtlReplyFn = std::function<void(Result<std::string>)>;
  std::function<void(const CtlRequest&, CtlReplyFn reply)> on_ctl_async;
  // A planned worker was told to stop (SIGTERM from its scheduler: Preempt from it, `reason` made printable).
  std::function<void(const WorkerInfo&, const Preempt&)> on_preempt;
  // A worker acknowledged a SetCodec with an id (CodecApplied).
  std::function<void(const CodecApplied&)> on_codec_applied;
  // A worker's checkpoint shard, whole once its last part arrived (only from a worker of the current epoch).
  std::function<void(const ShardSaved&)> on_shard;
  // A worker could not load this epoch's checkpoint (ResumeFailed, once per epoch and rank): return true when the
  // job should roll back without it (the hook set it aside), false to end the job with the reason.
  std::function<bool(const ResumeFailed&)> on_resume_failed;
  // A rollback began (replace_timeout > 0): `epoch` is the new epoch, `reason` names the lost worker.
  std::function<void(int64_t epoch, const std::string& reason)> on_rollback;
  // A worker's pre-flight found a peer it cannot reach: `why` names both ends and the error. Unset: the coordinator
  // shuts the job down with `why`.
  std::function<void(const std::string& why)> on_unreachable;
  // The job's name for the data-plane link src → dst (stall reports). Unset: "rank SRC → rank DST".
  std::function<std::string(int src, int dst)> link_name;
};

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> start(const CoordinatorOptions& options, CoordinatorHooks hooks = {});
  ~Coordinator();  // stops serving; queued messages get up to 1 s to leave

  // Where workers connect: "tcp://127.0.0.1:40123".
  const std::string& endpoint() const { return loop_->endpoint(); }
  // The relay's endpoint ("" when the job has none), and the relay itself (its counters).
  std::string relay_endpoint() const { return relay_ ? relay_->endpoint() : options_.relay_at; }
  const Relay* relay() const { return relay_.get(); }

  // Queue a message to one planned worker / every live planned worker. Thread-safe.
  void send_to(int rank, const ControlMessage& m);
  void broadcast(const ControlMessage& m);
  // Broadcasts Shutdown(reason); done() becomes true.
  void shutdown(const std::string& reason);

  std::vector<WorkerInfo> workers() const;
  nlohmann::json status_json() const;
  // The pre-flight of the current epoch, one entry per directed pair measured (prober → peer): {"src","dst","link",
  // "ok","error","rtt_ms","mbps","probe_bytes"}; also in status_json() as "preflight".
  nlohmann::json preflight_json() const;
  // Barrier ids one member may wait at before the others arrive (a worker waits at one at a time): one more is refused.
  static constexpr size_t kMaxOpenBarriersPerMember = 8;
  // Messages refused so far (bad token, garbage, wrong version, unknown type, not joined …).
  uint64_t rejected() const;
  // Connections refused by CURVE (handshakes that failed, clients the ZAP handler turned away).
  uint64_t refused_connections() const { return loop_->auth_failures(); }
  // Blocks until every expected worker is Ready (true) or timeout/failure (false).
  bool wait_all_ready(std::chrono::milliseconds timeout) const;
  // Blocks until every worker has left or died, or shutdown() was called.
  bool wait_done(std::chrono::milliseconds timeout) const;
  bool done() const;
  int64_t epoch() const;
  bool recovering() const;
  // While the job rolls back: the ranks of lost workers that no standby is about to take (empty otherwise).
  std::set<int> vacant_ranks() const;
  // An --elastic job going on with fewer workers, while it rolls back: `new_rank` maps the rank of each worker it
  // keeps to its rank among `workers`; every other worker is told `reason` (a Shutdown) and forgotten, and the lost
  // ranks are no longer waited for. The plans go out once every kept worker has joined again.
  Status regrid(int workers, const std::map<int, int>& new_rank, const std::string& reason);

 private:
  Coordinator() = default;
  void on_message(Frames&& frames);
  // A worker's message (on_message has checked its sender and decoded it): its handler, under mu_, then what the
  // handler queued into `later` (run unlocked) and the job's stop it asked for.
  void on_worker_message(const std::string& identity, const ControlHeader& header, ControlMessage& m);
  // The handlers, called with mu_ held by `lock`. A handler that returns false (or void) has answered the message
  // itself, releasing `lock` where it had to, and nothing else happens; true: on_worker_message runs `later` and acts
  // on `stop` once the lock goes.
  bool handle_worker_message_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& w,
                                    MsgType type, ControlMessage& m, std::vector<std::function<void()>>& later,
                                    std::string& stop);
  bool on_shard_saved_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& w,
                             ShardSaved& sh, std::vector<std::function<void()>>& later);
  bool on_resume_failed_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& w,
                               ResumeFailed& rf, std::vector<std::function<void()>>& later, std::string& stop);
  void on_ready_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& w, int rank);
  void on_preflight_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& w,
                           Preflight& pf);
  void on_barrier_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& w,
                         uint64_t barrier);
  void on_tick();
  void reject(const std::string& identity, const std::string& reason, MsgType about = MsgType(0));
  void handle_join(const std::string& identity, Join&& join);
  // With mu_ held by `lock`: a Join from `same`, a worker already known (a standby when `standby`), that repeats an
  // attempt (nothing to do) or makes a newer one before its plan (it replaces the old). False: neither.
  bool repeated_join_locked(std::unique_lock<std::mutex>& lock, const std::string& identity, WorkerInfo& same,
                            bool standby, Join& join);
  void handle_ctl(const std::string& identity, const CtlRequest& req);
  void send_plans();
  // Before the plans go out: survivors keep their ranks, the new workers take the free ones; workers_ in rank order.
  void assign_ranks();
  void check_barriers();
  // Once every live worker reported its reachability: answers each with the relayed pairs, or ends the job naming a
  // pair that cannot connect when there is no relay.
  void check_reach();
  // A pair of workers cannot talk: the on_unreachable hook, or the job ends with `why`.
  void end_at_preflight(const std::string& why);
  // With mu_ held: marks `w` lost, tells the others, queues the hook into `later` (run unlocked).
  void declare_lost(WorkerInfo& w, WorkerInfo::State state, const std::string& reason,
                    std::vector<std::function<void()>>& later);
  // Sends with the next sequence number for `identity` (0 when it is not a worker this coordinator knows).
  void send_raw(const std::string& identity, const ControlMessage& m);
  // The next message to `identity` is number 0 (it sent a Join); forget_seq: it is gone.
  void reset_seq(const std::string& identity);
  void forget_seq(const std::string& identity);
  // With mu_ held: checks a known worker's message number; a gap means messages were lost (a connection reset):
  // returns a reason to roll the job back (or stop it), or "".
  std::string check_seq_locked(WorkerInfo& w, const ControlHeader& h);
  WorkerInfo* find(const std::string& identity);
  // With mu_ held: every rank has a joined worker (a fresh job's or a rollback's), so plans can go out.
  bool complete_locked() const;
  nlohmann::json preflight_json_locked() const;
  // With mu_ held: the lost worker `w` starts a rollback (see CoordinatorOptions::replace_timeout).
  // `rejoined`: a worker whose Join starts the rollback (it gets no Rollback message; it has left its epoch).
  void begin_rollback_locked(const std::string& reason, std::vector<std::function<void()>>& later,
                             const std::string& rejoined = "");
  // With mu_ held, a running job's worker lost messages: rolls the job back (replace_timeout > 0); otherwise
  // returns the reason the job must stop.
  std::string on_lost_messages_locked(const std::string& reason, std::vector<std::function<void()>>& later,
                                      const std::string& rejoined = "");
  bool all_finished_locked() const;

  CoordinatorOptions options_;
  CoordinatorHooks hooks_;
  std::unique_ptr<ZmqLoop> loop_;
  std::unique_ptr<Relay> relay_;
  std::string relay_rank_key_;  // what the job's relay checks hellos with (empty: the join token, as before)
  std::chrono::steady_clock::time_point preflight_t0_{};  // the start barrier's release

  mutable std::mutex mu_;  // guards everything below (hooks run with it released)
  mutable std::condition_variable cv_;
  std::vector<WorkerInfo> workers_;  // in join order
  std::map<int, std::string> rank_to_identity_;
  bool planned_ = false, all_ready_ = false, shut_down_ = false;
  std::map<uint64_t, std::set<int>> barrier_arrivals_;  // barrier id -> ranks that reached it
  uint64_t rejected_ = 0;
  int64_t resume_failed_epoch_ = 0;  // the epoch whose checkpoint a worker could not load (one report an epoch)
  int64_t epoch_ = 1;
  bool recovering_ = false;
  std::chrono::steady_clock::time_point recovery_deadline_{};
  std::set<int> vacant_;  // ranks of lost workers waiting for a replacement
  // Workers that joined a running job (replace_timeout > 0): each takes the place of the next lost worker.
  std::vector<WorkerInfo> standby_;
  // With mu_ held: moves standbys into the job while it has fewer than expected_workers.
  void promote_standbys_locked();
  std::chrono::steady_clock::time_point last_beat_{};  // loop thread only

  // Why a heartbeat's pending list is refused ("" when it is fine): more entries than two per rank of the job, a
  // peer outside the job, a peer and way twice, any entry before a plan.
  std::string check_pending_locked(const WorkerInfo& w, const std::vector<PendingLink>& pending) const;
  // With mu_ held: the links that have stalled now, (src, dst) → what is known about it.
  std::map<std::pair<int, int>, std::string> find_stalls_locked(std::chrono::steady_clock::time_point now) const;
  std::map<std::pair<int, int>, std::string> stalls_;  // as last found (mu_)
  // With mu_ held: ranks that wait on each other in a cycle, each for a packet its predecessor is not sending (a
  // packet the data plane lost), every wait at least the stall timeout; "" when there is none. Such a job never
  // moves again by itself.
  std::string find_deadlock_locked(std::chrono::steady_clock::time_point now) const;

  std::mutex send_mu_;                        // taken after mu_, never before it: orders numbering and queueing
  std::map<std::string, uint32_t> send_seq_;  // identity → the number of its next message
};

}  // namespace lh
