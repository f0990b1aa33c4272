// defines: lh::JobCoordinator — the coordinator of a pipeline job: it plans workers (rank, stage,
// peers, codecs, job config), gathers their step metrics into the job's file, serves `ctl status` and
// `ctl set-codec` (scheduled at a step boundary ahead of every worker), and ends the job with the name
// of any worker lost. Used by `longhaul coordinator` and `longhaul launch`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "comm/dp_reducer.h"
#include "grid/codec_plan.h"
#include "job/job_checkpoint.h"
#include "metrics/job_history.h"
#include "metrics/metrics_collector.h"
#include "plan/auto_codec.h"
#include "plan/job_config.h"
#include "transport/coordinator.h"
#include "web/http_server.h"

namespace lh {

struct JobCoordinatorOptions {
  CoordinatorOptions control;  // listen address, token, heartbeats (expected_workers is set from the job)
  std::string metrics_path;    // the job's JSON-lines metrics; empty: memory only
  // Job checkpoints (the job's checkpoint_every sets how often): committed here, `keep` of them kept.
  std::string checkpoint_dir;
  int keep_checkpoints = 3;
  // Start from the newest usable checkpoint in checkpoint_dir (none: from the beginning, with a warning).
  bool resume = false;
  // --elastic (dp > 1): a lost worker's replica is dropped at the rollback instead of waiting for a replacement
  // (when no standby waits); see JobConfig::without_replica.
  bool elastic = false;
  // --http ADDR:PORT: the live page (/), /metrics (Prometheus) and /api/status, /api/page; empty: none. Beyond
  // loopback every request for data needs `http_token` (JobSecret::page_token) as "Authorization: Bearer …".
  std::string http;
  std::string http_token;
};

class JobCoordinator {
 public:
  static Result<std::unique_ptr<JobCoordinator>> start(const JobConfig& job, const JobCoordinatorOptions& options);
  const std::string& endpoint() const { return coordinator_->endpoint(); }

  // Blocks until every worker has left or one was lost: OK when all finished, else an error naming
  // the lost worker (the others are told to stop). Unavailable on timeout.
  Status wait(std::chrono::milliseconds timeout);
  Result<MetricsSummary> summary() const { return collector_->summary(); }
  // The newest step any worker reported.
  int64_t newest_step() const { return collector_->newest_step(); }
  // Tells every worker the job is over (they stop; a worker would otherwise wait for its coordinator to come back).
  void stop(const std::string& reason) { coordinator_->shutdown(reason); }
  // Preemption (SIGTERM to the coordinator, or a worker's Preempt): with a checkpoint directory and the job training,
  // every worker is told to save its state after a step just ahead of all of them and stop there, and wait() then
  // reports the preemption; otherwise the job stops at once. Once per job (later calls change nothing).
  void preempt(const std::string& reason);
  // Whether the job was preempted (wait()'s error then says after which step, and which checkpoint is committed).
  bool preempted() const { return preempted_; }
  // The step the job started from (0, or the checkpoint --resume found) and the newest committed checkpoint.
  int64_t resumed_from() const { return resumed_from_; }
  int64_t last_checkpoint() const { return store_ ? store_->last_committed() : 0; }
  int64_t epoch() const { return coordinator_->epoch(); }
  // The job as it runs now: an --elastic job's grid shrinks when it loses replicas (and a resumed one starts with
  // its checkpoint's).
  JobConfig job() {
    std::lock_guard<std::mutex> lock(mu_);
    return job_;
  }

  // The ctl commands (also reachable through the control socket):
  //   status                                  → JSON: job, step, plan, codecs per link, measured bandwidth
  //   set-codec {"link":"1-2","dir":"fwd","spec":"int4"} (or "src"/"dst" ranks instead of "link")
  //                                           → JSON with the step the change takes effect
  //   set-link {"rule":"0-1:fwd=5M,80ms"}     → JSON with the job's link rules now
  // `ack_id` non-zero: the SetCodec messages carry it and every worker acknowledges it (CodecApplied).
  Result<std::string> handle_ctl(const std::string& command, const std::string& args, uint64_t ack_id = 0);
  ~JobCoordinator();

  // The live page's address ("http://HOST:PORT/"; empty without --http).
  std::string http_url() const { return http_ ? http_->url() : std::string(); }
  const HttpServer* http() const { return http_.get(); }
  // What the page shows (web/page.html's data: status, series, events, counters) and the Prometheus exposition.
  nlohmann::json page_json();
  std::string prometheus_text();
  const JobHistory& history() const { return *history_; }

 private:
  // `ctl set-link`: {"rule": "0-1:fwd=5M,80ms"} appended to the job's link rules and sent to every worker.
  Result<std::string> set_link(const std::string& args);
  // Hold mu_; broadcast with `ack_id`.
  Result<std::string> set_grad_codec_locked(const std::string& spec, const std::string& link, uint64_t ack_id);
  Result<std::string> set_tp_codec_locked(const std::string& spec, const std::string& link, uint64_t ack_id);
  // ctl through the control socket: set-codec replies once every worker acknowledged the change.
  void handle_ctl_async(const CtlRequest& req, CoordinatorHooks::CtlReplyFn reply);
  void on_codec_applied(const CodecApplied& ack);
  // Completes every set-codec still waiting for acknowledgements (a rollback, the end of the job).
  void settle_pending_acks(bool ok, const std::string& note);
  // "replicas" (pp = 1) or "s1 replicas": the status row of one stage's dp group.
  std::string group_label(int stage) const;
  JobCoordinator(JobConfig job, Topology topology, CodecSchedule schedule)
      : job_(std::move(job)), topology_(std::move(topology)), codecs_(std::move(schedule)) {}
  Result<std::vector<Plan>> make_plans(const std::vector<WorkerInfo>& workers);
  void on_lost(const WorkerInfo& w, const std::string& reason);
  // Records `why` as the job's failure unless one is recorded already (the first is the cause; the rest follow from
  // it). True when this call recorded it: the caller then shuts the job down.
  bool claim_failure(const std::string& why);
  // A whole shard from the control thread: checked there, written and committed on the writer thread.
  void on_shard(const ShardSaved& shard);
  void save_shard(const ShardSaved& shard);
  // A worker could not load this epoch's checkpoint: it is set aside (true), so the rollback takes an older one.
  bool on_resume_failed(const ResumeFailed& rf);
  // Checkpoint writes (shards, manifests and their fsyncs) run on writer_, off the control thread, in order: a large
  // shard on a slow disk must not hold up the heartbeats. drain_writes() waits until every queued write is done
  // (a rollback, the end of the job).
  void enqueue_write(std::function<void()> fn);
  void drain_writes();
  void on_rollback(int64_t epoch, const std::string& reason);
  // Every live codec change so far, as the Plan's `changes` list (the manifest stores the same).
  std::vector<SetCodec> changes_locked() const;
  // Puts a checkpoint's changes (manifest "changes") back into the codec history.
  Status restore_changes(const nlohmann::json& changes);
  // start's step for --resume: the newest checkpoint that fits the grid (an --elastic job's fewer replicas, the
  // settled partition and splits, the codec changes), or a fresh start when there is none.
  Status resume_from_checkpoint(const JobConfig& job, const JobCoordinatorOptions& options);
  // What the control-plane coordinator calls back into this one for (plans, metrics, joins, losses, ctl, shards).
  CoordinatorHooks control_hooks();
  nlohmann::json status_json();
  // --elastic: whether a checkpoint's manifest fits this job's grid (the same, or one it shrank from; at resume
  // also one it shrank to), and which of its shards rank `rank` of this grid starts from.
  Status grid_fits(const nlohmann::json& manifest, bool smaller_too) const;
  Result<int> checkpoint_rank(const JobCheckpoint& ck, int rank) const;
  // Makes `next` (a smaller grid of the same job) the job's: topology, codec history, checkpoint store.
  Status regrid_locked(const JobConfig& next);
  // --elastic, at a rollback: goes on without the replicas of the `vacant` ranks, if a whole replica is left.
  void drop_replicas(const std::set<int>& vacant);
  // Adaptive compression (--compress-fwd/--compress-bwd/--compress-link … auto): the decider for this grid.
  Status setup_auto_locked();
  Status setup_auto_grad_locked();
  // A worker's metrics line on its way to the file: observed for adaptive compression (which may decide and
  // schedule codec changes now) and given the decisions about the worker's outgoing links made since its last line.
  std::string observe_auto(int rank, int64_t step, const std::string& line);

  JobConfig job_;
  Topology topology_;
  std::mutex mu_;  // guards codecs_ and failure_
  CodecSchedule codecs_;
  struct GradChange {
    int64_t from = 0;
    std::string spec;
    int stage = -1;  // whose dp group; −1: every group
  };
  std::vector<GradChange> grad_changes_;  // ctl set-codec --role grad [--link …]
  std::vector<GradChange> tp_changes_;    // ctl set-codec --role tp (every group: stage −1)
  std::optional<Status> failure_;
  std::unique_ptr<MetricsCollector> collector_;
  std::unique_ptr<JobCheckpointStore> store_;
  std::thread writer_;
  std::mutex writer_mu_;
  std::condition_variable writer_cv_;
  std::deque<std::function<void()>> writes_;
  bool writer_busy_ = false, writer_stop_ = false;
  std::optional<JobCheckpoint> resume_;  // what the next plans start from (guarded by mu_)
  bool elastic_ = false;
  int64_t resumed_from_ = 0;
  // set-codec requests waiting for the workers' CodecApplied (coordinator thread only, like the hooks).
  struct PendingAck {
    CoordinatorHooks::CtlReplyFn reply;
    nlohmann::json body;               // the reply, "applied" added
    std::map<int, CodecApplied> acks;  // by rank
  };
  std::map<uint64_t, PendingAck> pending_acks_;
  std::mutex acks_mu_;
  uint64_t next_ack_id_ = 0;
  std::unique_ptr<AutoCodec> auto_;                            // null without auto links (guarded by mu_)
  std::unique_ptr<AutoCodec> auto_grad_;                       // null without auto replica groups (guarded by mu_)
  std::unique_ptr<AutoCodec> auto_tp_;                         // null unless --compress-tp auto (guarded by mu_)
  std::map<int, std::vector<nlohmann::json>> auto_to_record_;  // rank → decisions for its next metrics line
  std::vector<AutoDecision> auto_log_;                         // every decision, for ctl status
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobHistory> history_;  // the page's series and events, /metrics' counters
  std::atomic<uint64_t> joined_{0}, lost_{0}, rollbacks_{0};
  std::atomic<bool> training_{false};   // every worker of this epoch was ready (Barrier 0), and no rollback since
  std::atomic<bool> preempted_{false};  // preempt() was called
  int64_t preempt_at_ = -1;             // the step the workers checkpoint after and stop (guarded by mu_)
  std::string preempt_reason_;          // guarded by mu_
  void note(int64_t step, const std::string& kind, const std::string& text) { history_->event(step, kind, text); }
  Status start_http(const JobCoordinatorOptions& options);
  std::unique_ptr<HttpServer> http_;  // stopped first: its handlers read everything above
};

}  // namespace lh
