// The pipeline job's coordinator: plans, metrics, ctl status / set-codec / set-link, and lost workers.
// Used by `longhaul coordinator` and `longhaul launch`.
#include "job/job_coordinator.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "compress/codec_chain.h"
#include "core/log.h"
#include "grid/link_name.h"
#include "grid/link_shapes.h"
#include "metrics/prometheus_text.h"
#include "plan/cluster_probe.h"
#include "plan/planner.h"
#include "web/page.h"

namespace lh {

Result<std::unique_ptr<JobCoordinator>> JobCoordinator::start(const JobConfig& job,
                                                              const JobCoordinatorOptions& options) {
  LH_RETURN_IF_ERROR(job.validate());
  LH_ASSIGN_OR_RETURN(Topology topology, job.topology());
  LH_ASSIGN_OR_RETURN(CodecPlan plan, job.codec_plan());
  std::unique_ptr<JobCoordinator> c(new JobCoordinator(job, topology, CodecSchedule(topology, plan)));
  if (options.resume && options.checkpoint_dir.empty())
    return invalid_argument("--resume needs --checkpoint-dir (where the job's checkpoints are)");
  c->elastic_ = options.elastic;
  if (options.elastic && job.dp < 2)
    return invalid_argument("--elastic: the job has one replica (--dp 1), so there is none to go on without");
  if (options.elastic && options.control.replace_timeout.count() <= 0)
    return invalid_argument(
        "--elastic needs --replace-timeout > 0: the job rolls back to its last checkpoint before it goes on");
  if (!options.checkpoint_dir.empty()) {
    LH_ASSIGN_OR_RETURN(c->store_, JobCheckpointStore::open(options.checkpoint_dir, job.workers, job.resume_hash(),
                                                            options.keep_checkpoints));
  }
  if (options.resume)
    if (Status s = c->resume_from_checkpoint(job, options); !s.ok()) return s;
  std::vector<std::string> warnings;
  if (options.resume) {
    LH_ASSIGN_OR_RETURN(c->collector_,
                        MetricsCollector::open_resumed(options.metrics_path, c->resumed_from_, &warnings));
    for (const std::string& w : warnings) LH_LOG_WARN("coordinator: {}", w);
  } else {
    LH_ASSIGN_OR_RETURN(c->collector_, MetricsCollector::open(options.metrics_path));
  }
  c->history_ = std::make_unique<JobHistory>();
  for (const WorkerStepMetrics& m : c->collector_->snapshot()) c->history_->observe(m);  // a resumed job's steps
  c->collector_->set_observer([h = c->history_.get()](const WorkerStepMetrics& m) { h->observe(m); });
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    LH_RETURN_IF_ERROR(c->setup_auto_locked());
  }
  CoordinatorOptions control = options.control;
  control.expected_workers = c->job_.workers;
  LH_ASSIGN_OR_RETURN(c->coordinator_, Coordinator::start(control, c->control_hooks()));
  LH_RETURN_IF_ERROR(c->start_http(options));
  return c;
}

Status JobCoordinator::resume_from_checkpoint(const JobConfig& job, const JobCoordinatorOptions& options) {
  std::vector<std::string> warnings;
  auto ck = store_->load_latest(&warnings, [this](const nlohmann::json& m) { return grid_fits(m, true); });
  for (const std::string& w : warnings) LH_LOG_WARN("coordinator: {}", w);
  // Checkpoints that exist but none of which fits: starting over would prune them, so refuse.
  if (!ck.ok() && !warnings.empty())
    return invalid_argument("--resume: no checkpoint in '" + options.checkpoint_dir +
                            "' can be used (the newest: " + warnings.front() + ")");
  if (ck.ok()) {
    const nlohmann::json& saved_job = ck->manifest.contains("job") ? ck->manifest["job"] : nlohmann::json();
    if (auto saved = JobConfig::from_json(saved_job.dump()); saved.ok() && saved->dp < job_.dp) {
      // An --elastic job that went on with fewer replicas goes on with them.
      JobConfig next = job_;
      next.dp = saved->dp;
      next.workers = saved->workers;
      next.batch_slices = saved->batch_slices;
      next.replica_slices = saved->replica_slices;
      LH_RETURN_IF_ERROR(next.validate());
      std::lock_guard<std::mutex> lock(mu_);
      LH_RETURN_IF_ERROR(regrid_locked(next));
      LH_LOG_WARN(
          "coordinator: --elastic: the checkpoint of step {} is of {} replica(s) (slices {} of {}); the job "
          "goes on with them",
          ck->step, next.dp, nlohmann::json(next.replica_slices).dump(), next.slices());
    }
    if ((job_.partition == "speed" || job_.partition == "auto") && saved_job.is_object() &&
        saved_job.value("partition", "") != job_.partition)
      job_.partition = saved_job.value("partition", "");
    if (job_.tp_split == "speed" && saved_job.is_object() && saved_job.value("tp_split", "") != "speed")
      job_.tp_split = saved_job.value("tp_split", "");
    if (job_.dp_split == "speed" && saved_job.is_object() && saved_job.value("dp_split", "") != "speed")
      job_.dp_split = saved_job.value("dp_split", "");
    if (ck->manifest.contains("changes")) {
      Status s = restore_changes(ck->manifest["changes"]);
      if (!s.ok()) return s.prepend("checkpoint step " + std::to_string(ck->step));
    }
    if (ck->step >= job.train.steps)
      return invalid_argument("the newest checkpoint in '" + options.checkpoint_dir + "' is at step " +
                              std::to_string(ck->step) + ", not before --steps " + std::to_string(job.train.steps) +
                              "; raise --steps to train further");
    resumed_from_ = ck->step;
    LH_LOG_INFO("coordinator: resuming from the checkpoint of step {} in '{}'", ck->step, options.checkpoint_dir);
    resume_ = std::move(*ck);
  } else if (ck.status().code() == StatusCode::kNotFound) {
    LH_LOG_WARN("coordinator: --resume: {}; starting from step 0", ck.status().message());
  } else {
    return ck.status();
  }
  return Status::Ok();
}

CoordinatorHooks JobCoordinator::control_hooks() {
  JobCoordinator* self = this;
  CoordinatorHooks hooks;
  hooks.make_plans = [self](const std::vector<WorkerInfo>& w) { return self->make_plans(w); };
  hooks.on_metrics = [self](const StepMetrics& m) {
    // A step outside the job is a worker's bug or a stranger's lie: it must not move the job's newest step (which
    // schedules codec changes) or reach the metrics file.
    if (m.step < 1 || m.step > self->job_.train.steps) {
      LH_LOG_WARN("coordinator: metrics from rank {} for step {} refused: the job has steps 1..{}", m.rank, m.step,
                  self->job_.train.steps);
      return;
    }
    Status s = self->collector_->add(m.rank, m.step, self->observe_auto(m.rank, m.step, m.json));
    if (!s.ok()) LH_LOG_WARN("coordinator: {}", s.message());
  };
  hooks.on_worker_lost = [self](const WorkerInfo& w, const std::string& reason) { self->on_lost(w, reason); };
  hooks.on_join = [self](const WorkerInfo& w) {
    ++self->joined_;
    self->note(std::max<int64_t>(self->collector_->newest_step(), 0), "join",
               "a worker joined" + (w.join.hostname.empty() ? std::string() : " from " + w.join.hostname) +
                   (w.join.device.empty() ? std::string() : " (" + w.join.device + ")") +
                   (w.join.rank >= 0 ? ", asking for rank " + std::to_string(w.join.rank) : std::string()));
  };
  hooks.on_unreachable = [self](const std::string& why) {
    if (self->claim_failure(why)) self->coordinator_->shutdown(why);
  };
  hooks.on_ctl_async = [self](const CtlRequest& r, CoordinatorHooks::CtlReplyFn reply) {
    self->handle_ctl_async(r, std::move(reply));
  };
  hooks.on_codec_applied = [self](const CodecApplied& a) { self->on_codec_applied(a); };
  hooks.on_all_ready = [self] { self->training_ = true; };
  hooks.on_preempt = [self](const WorkerInfo& w, const Preempt& p) {
    self->preempt("worker " + std::to_string(w.rank) + (w.join.hostname.empty() ? "" : " (" + w.join.hostname + ")") +
                  ": " + p.reason);
  };
  hooks.on_shard = [self](const ShardSaved& sh) { self->on_shard(sh); };
  hooks.on_resume_failed = [self](const ResumeFailed& rf) { return self->on_resume_failed(rf); };
  hooks.on_rollback = [self](int64_t epoch, const std::string& reason) { self->on_rollback(epoch, reason); };
  hooks.link_name = [self](int src, int dst) {
    return src >= 0 && dst >= 0 && src != dst && src < self->topology_.workers() && dst < self->topology_.workers()
               ? link_name(self->topology_, src, dst)
               : std::string();
  };
  return hooks;
}

Result<std::vector<Plan>> JobCoordinator::make_plans(const std::vector<WorkerInfo>& workers) {
  if (static_cast<int>(workers.size()) != topology_.workers())
    return internal_error("planning " + std::to_string(workers.size()) + " workers for a job of " +
                          std::to_string(topology_.workers()));
  CodecPlan plan = codecs_.initial();
  // Stages follow ranks, ranks follow join order; a speed partition is settled now.
  std::vector<double> speeds;
  for (const WorkerInfo& w : workers) speeds.push_back(w.join.compute_speed);
  std::string partition;
  if (job_.partition == "auto") {
    // The planner's partition from what is known at the start: the speeds workers report (equal when any is
    // unknown), --slowdown, the --link rules over otherwise unlimited links, the codecs and the schedule.
    bool known = true;
    for (double v : speeds) known &= v > 0 && std::isfinite(v);
    Cluster cluster = Cluster::uniform(topology_.workers(), 1, 1e13, 0);
    if (known)
      for (int r = 0; r < topology_.workers(); ++r) cluster.set_gflops(r, speeds[size_t(r)]);
    LH_ASSIGN_OR_RETURN(partition, plan_partition(cluster, job_));
  } else {
    LH_ASSIGN_OR_RETURN(partition, job_.planned_partition(speeds));
  }
  LH_ASSIGN_OR_RETURN(std::string tp_split, job_.planned_tp_split(speeds));
  std::string dp_split = job_.dp_split;
  if (dp_split == "speed") {
    // Each replica's pace: its slowest worker's reported speed (all equal when any is unknown) over --slowdown.
    std::vector<double> paced(speeds.size(), 1.0);
    bool known = true;
    for (double v : speeds) known &= v > 0 && std::isfinite(v);
    if (known) paced = speeds;
    LH_ASSIGN_OR_RETURN(auto slow, parse_slowdowns(job_.slowdown, topology_.workers()));
    for (const auto& [rank, f] : slow) paced[size_t(rank)] /= f;
    LH_ASSIGN_OR_RETURN(dp_split, job_.planned_dp_split(paced));
  }
  std::string config;
  {
    std::lock_guard<std::mutex> lock(mu_);  // status_json reads job_
    if (job_.partition == "speed" || job_.partition == "auto") {
      LH_LOG_INFO("coordinator: partition by {}: {}", job_.partition == "auto" ? "the planner" : "speed", partition);
      job_.partition = partition;
    }
    if (job_.tp_split == "speed") {
      LH_LOG_INFO("coordinator: tp split by speed (heads per shard): {}", tp_split);
      job_.tp_split = tp_split;
    }
    if (job_.dp_split == "speed") {
      LH_LOG_INFO("coordinator: dp split by speed (sequences per replica): {}", dp_split);
      job_.dp_split = dp_split;
    }
    config = job_.to_json().dump();
  }
  std::vector<Plan> plans;
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<SetCodec> changes = changes_locked();
  for (size_t i = 0; i < workers.size(); ++i) {
    Plan p;
    p.changes = changes;
    if (resume_ && resume_->step > 0) {
      p.resume_step = resume_->step;
      LH_ASSIGN_OR_RETURN(int from, checkpoint_rank(*resume_, int(i)));
      const std::string& bytes = resume_->shards.at(size_t(from));
      p.shard.assign(bytes.begin(), bytes.end());
    }
    p.rank = static_cast<int>(i);
    p.world_size = topology_.workers();
    WorkerCoord c = topology_.coord_of(p.rank);
    p.stage = c.stage;
    p.tp_index = c.tp;
    p.dp_index = c.dp;
    p.pp = topology_.pp();
    p.tp = topology_.tp();
    p.dp = topology_.dp();
    p.codecs = link_codecs_of(plan, topology_);
    p.config = config;
    plans.push_back(std::move(p));
  }
  return plans;
}

void JobCoordinator::on_lost(const WorkerInfo& w, const std::string& reason) {
  // The coordinator reports a leaving worker's own words as "left: <reason>"; workers that finished
  // their steps say "done".
  const std::string said = reason.rfind("left: ", 0) == 0 ? reason.substr(6) : reason;
  if (w.state == WorkerInfo::State::kLeft && said == "done") return;
  ++lost_;
  const std::string host = w.join.hostname.empty() ? "" : " (" + w.join.hostname + ")";
  // No rank: the job itself gave up (no replacement came for a lost worker).
  const std::string why = w.rank < 0 ? reason
                                     : "worker " + std::to_string(w.rank) + host +
                                           (w.state == WorkerInfo::State::kDead ? " stopped heartbeating" : " left") +
                                           ": " + said;
  note(collector_->newest_step(), "lost", why);
  if (!claim_failure(why)) return;
  LH_LOG_ERROR("coordinator: {}", why);
  coordinator_->shutdown(why);
}

bool JobCoordinator::claim_failure(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_) return false;
  failure_ = unavailable(why);
  return true;
}

std::vector<SetCodec> JobCoordinator::changes_locked() const {
  std::vector<SetCodec> out;
  for (const CodecChange& c : codecs_.changes()) {
    SetCodec m = set_codec_message(c, topology_);
    m.apply_at_step = c.from_step;
    out.push_back(m);
  }
  auto role_change = [&](const GradChange& c, const char* dir) {
    SetCodec m{-1, -1, dir, c.spec, c.from};
    if (c.stage >= 0) {  // one stage's dp group: named by one of its replica pairs
      m.src = topology_.rank_of({c.stage, 0, 0});
      m.dst = topology_.rank_of({c.stage, 0, 1});
    }
    out.push_back(m);
  };
  if (topology_.dp() > 1)  // (an --elastic job down to one replica has no gradient exchange left)
    for (const GradChange& c : grad_changes_) role_change(c, "grad");
  for (const GradChange& c : tp_changes_) role_change(c, "tp");
  return out;
}

Status JobCoordinator::restore_changes(const nlohmann::json& changes) {
  if (!changes.is_array()) return corrupt("the manifest's changes are not a list");
  std::lock_guard<std::mutex> lock(mu_);
  try {
    for (const auto& e : changes) {
      SetCodec m{e.at("src").get<int32_t>(), e.at("dst").get<int32_t>(), e.at("dir").get<std::string>(),
                 e.at("spec").get<std::string>(), e.at("from_step").get<int64_t>()};
      if (m.apply_at_step < 1) return corrupt("a codec change from step " + std::to_string(m.apply_at_step));
      if (m.role_wide()) {
        int stage = -1;
        if (m.src >= 0) {
          LH_ASSIGN_OR_RETURN(WorkerCoord wc, topology_.checked_coord_of(m.src));
          stage = wc.stage;
        }
        (m.dir == "grad" ? grad_changes_ : tp_changes_).push_back({m.apply_at_step, m.spec, stage});
        continue;
      }
      LH_ASSIGN_OR_RETURN(CodecChange c, codec_change_of(m, topology_, codecs_));
      LH_RETURN_IF_ERROR(codecs_.schedule_change(c));
    }
  } catch (const std::exception& e) {
    return corrupt(std::string("a codec change in the manifest lacks a field (") + e.what() + ")");
  }
  return Status::Ok();
}

void JobCoordinator::on_shard(const ShardSaved& sh) {
  if (!store_) {
    LH_LOG_WARN("coordinator: rank {} sent a checkpoint shard, but the job has no --checkpoint-dir", sh.rank);
    return;
  }
  // Only for a step the job checkpoints, and only after the rank's own metrics for it (a worker sends them first, on
  // the same socket): a member cannot park shards for steps it has not reached.
  const int64_t every = job_.checkpoint_every;
  int64_t preempt_at = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    preempt_at = preempt_at_;
  }
  if (sh.step < 1 || sh.step > job_.train.steps ||
      (sh.step != preempt_at && (every <= 0 || (sh.step % every != 0 && sh.step != job_.train.steps)))) {
    LH_LOG_WARN(
        "coordinator: checkpoint shard of rank {} for step {} refused: the job checkpoints every {} steps of {}",
        sh.rank, sh.step, every, job_.train.steps);
    return;
  }
  if (!collector_->has(sh.rank, sh.step)) {
    LH_LOG_WARN("coordinator: checkpoint shard of rank {} for step {} refused: it has not reported that step", sh.rank,
                sh.step);
    return;
  }
  enqueue_write([this, sh] { save_shard(sh); });
}

void JobCoordinator::save_shard(const ShardSaved& sh) {
  auto complete = store_->add_shard(sh.step, sh.rank, std::string(sh.bytes.begin(), sh.bytes.end()));
  if (!complete.ok()) {
    LH_LOG_WARN("coordinator: checkpoint shard of rank {} for step {} not saved: {}", sh.rank, sh.step,
                complete.status().message());
    return;
  }
  if (!*complete) return;
  nlohmann::json extra;
  {
    std::lock_guard<std::mutex> lock(mu_);
    extra["job"] = job_.to_json();
    nlohmann::json changes = nlohmann::json::array();
    for (const SetCodec& c : changes_locked())
      changes.push_back(
          {{"src", c.src}, {"dst", c.dst}, {"dir", c.dir}, {"spec", c.spec}, {"from_step", c.apply_at_step}});
    extra["changes"] = changes;
  }
  extra["epoch"] = coordinator_->epoch();
  Status s = store_->commit(sh.step, extra);
  if (!s.ok())
    LH_LOG_ERROR("coordinator: checkpoint of step {} not committed: {}", sh.step, s.message());
  else {
    LH_LOG_INFO("coordinator: checkpoint of step {} committed in '{}'", sh.step, store_->dir());
    note(sh.step, "checkpoint", "checkpoint of step " + std::to_string(sh.step) + " committed");
  }
}

bool JobCoordinator::on_resume_failed(const ResumeFailed& rf) {
  drain_writes();
  int64_t resuming = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resuming = resume_ ? resume_->step : 0;
  }
  if (!store_ || resuming != rf.step) return false;
  Status s = store_->set_aside(rf.step, "rank " + std::to_string(rf.rank) + " could not load its shard: " + rf.reason);
  if (!s.ok()) {
    LH_LOG_ERROR("coordinator: the checkpoint of step {} cannot be set aside: {}", rf.step, s.message());
    return false;
  }
  LH_LOG_WARN("coordinator: the checkpoint of step {} is set aside as '{}.unusable'", rf.step,
              store_->dir() + "/" + JobCheckpointStore::step_dir_name(rf.step));
  return true;
}

void JobCoordinator::enqueue_write(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(writer_mu_);
  if (!writer_.joinable())
    writer_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(writer_mu_);
      for (;;) {
        writer_cv_.wait(lock, [&] { return writer_stop_ || !writes_.empty(); });
        if (writes_.empty()) return;  // stopping, nothing left
        std::function<void()> next = std::move(writes_.front());
        writes_.pop_front();
        writer_busy_ = true;
        lock.unlock();
        next();
        lock.lock();
        writer_busy_ = false;
        writer_cv_.notify_all();
      }
    });
  writes_.push_back(std::move(fn));
  writer_cv_.notify_all();
}

void JobCoordinator::drain_writes() {
  std::unique_lock<std::mutex> lock(writer_mu_);
  writer_cv_.wait(lock, [&] { return writes_.empty() && !writer_busy_; });
}

void JobCoordinator::on_rollback(int64_t epoch, const std::string& reason) {
  training_ = false;
  if (preempted_) {
    // The checkpoint the preemption asked for will not come: the job stops, its last committed one stands.
    const std::string stop = "preempted, and then " + reason;
    if (claim_failure(stop)) coordinator_->shutdown(stop);
  }
  drain_writes();  // a shard of the abandoned epoch is on disk (or refused) before the rollback looks
  std::optional<JobCheckpoint> from;
  int64_t step = 0;
  if (store_) {
    std::vector<std::string> warnings;
    store_->discard_uncommitted_after(store_->last_committed());
    auto ck = store_->load_latest(&warnings, [this](const nlohmann::json& m) { return grid_fits(m, false); });
    for (const std::string& w : warnings) LH_LOG_WARN("coordinator: {}", w);
    if (ck.ok()) {
      step = ck->step;
      from = std::move(*ck);
    } else if (ck.status().code() != StatusCode::kNotFound) {
      LH_LOG_ERROR("coordinator: no checkpoint to roll back to: {}", ck.status().message());
    }
  }
  Status s = collector_->truncate_after(step);
  if (!s.ok()) LH_LOG_WARN("coordinator: metrics after step {} not dropped: {}", step, s.message());
  history_->truncate_after(step);
  ++rollbacks_;
  note(step, "rollback",
       "epoch " + std::to_string(epoch) + ": back to step " + std::to_string(step) + " (" + reason + ")");
  {
    std::lock_guard<std::mutex> lock(mu_);
    resume_ = std::move(from);
    if (auto_) auto_->reset_window();  // its steps run again; the codecs it chose are in the codec history
    if (auto_grad_) auto_grad_->reset_window();
    if (auto_tp_) auto_tp_->reset_window();
  }
  settle_pending_acks(true, "the job rolled back to step " + std::to_string(step) +
                                " before every worker acknowledged the change; it is part of the job's codec history, "
                                "which every worker applies from its new plan");
  LH_LOG_WARN("coordinator: epoch {}: the job goes back to step {} ({}); {}", epoch, step,
              step > 0 ? "its last checkpoint"
              : store_ ? "no checkpoint yet"
                       : "no --checkpoint-dir",
              reason);
  if (elastic_) {
    const std::set<int> vacant = coordinator_->vacant_ranks();
    if (!vacant.empty()) drop_replicas(vacant);
  }
}

namespace {
std::vector<int> slice_list(const JobConfig& j) {
  std::vector<int> out;
  for (int d = 0; d < j.dp; ++d) out.push_back(j.slice_of(d));
  return out;
}
bool includes_all(const std::vector<int>& big, const std::vector<int>& small) {
  return std::includes(big.begin(), big.end(), small.begin(), small.end());
}
}  // namespace

Status JobCoordinator::grid_fits(const nlohmann::json& manifest, bool smaller_too) const {
  if (!manifest.contains("job")) return corrupt("the manifest has no job");
  auto ck = JobConfig::from_json(manifest["job"].dump());
  if (!ck.ok()) return Status(ck.status()).prepend("the manifest's job");
  const std::string grid = "pp " + std::to_string(ck->pp) + " × tp " + std::to_string(ck->tp) + " × dp " +
                           std::to_string(ck->dp) + " (" + std::to_string(ck->workers) + " workers)";
  const std::string mine = "pp " + std::to_string(job_.pp) + " × tp " + std::to_string(job_.tp) + " × dp " +
                           std::to_string(job_.dp) + " (" + std::to_string(job_.workers) + " workers)";
  if (manifest.value("workers", -1) != ck->workers) return corrupt("the manifest's worker count is not its job's");
  if (ck->pp != job_.pp || ck->tp != job_.tp || ck->slices() != job_.slices())
    return invalid_argument("a checkpoint of a " + grid + " grid; this job's is " + mine);
  const std::vector<int> theirs = slice_list(*ck), ours = slice_list(job_);
  if (theirs == ours) return Status::Ok();
  if (elastic_ && includes_all(theirs, ours)) return Status::Ok();                 // from before replicas were dropped
  if (elastic_ && smaller_too && includes_all(ours, theirs)) return Status::Ok();  // a resume after they were
  return invalid_argument("a checkpoint of a " + grid + " grid; this job's is " + mine +
                          (elastic_ ? "" : " (an --elastic job that lost replicas resumes with --elastic)"));
}

Result<int> JobCoordinator::checkpoint_rank(const JobCheckpoint& ck, int rank) const {
  if (int(ck.shards.size()) == topology_.workers() && ck.manifest.contains("job")) {
    auto same = JobConfig::from_json(ck.manifest["job"].dump());
    if (same.ok() && slice_list(*same) == slice_list(job_)) return rank;
  }
  if (!ck.manifest.contains("job")) return corrupt("checkpoint step " + std::to_string(ck.step) + ": no job");
  auto saved = JobConfig::from_json(ck.manifest["job"].dump());
  if (!saved.ok()) return Status(saved.status()).prepend("checkpoint step " + std::to_string(ck.step));
  LH_ASSIGN_OR_RETURN(Topology theirs, saved->topology());
  const WorkerCoord c = topology_.coord_of(rank);
  const int slice = job_.slice_of(c.dp);
  for (int d = 0; d < saved->dp; ++d)
    if (saved->slice_of(d) == slice) {
      const int from = theirs.rank_of({c.stage, c.tp, d});
      if (from < 0 || size_t(from) >= ck.shards.size()) break;
      return from;
    }
  return invalid_argument("checkpoint step " + std::to_string(ck.step) + " holds no state for slice " +
                          std::to_string(slice) + " of the batch (rank " + std::to_string(rank) + ")");
}

Status JobCoordinator::regrid_locked(const JobConfig& next) {
  LH_ASSIGN_OR_RETURN(Topology topology, next.topology());
  CodecSchedule codecs(topology, codecs_.initial());
  for (const CodecChange& c : codecs_.changes()) LH_RETURN_IF_ERROR(codecs.schedule_change(c));
  if (codecs_.current_step() >= 0) LH_RETURN_IF_ERROR(codecs.begin_step(codecs_.current_step()));
  job_ = next;
  topology_ = topology;
  codecs_ = std::move(codecs);
  if (store_) store_->set_workers(next.workers);
  return setup_auto_locked();  // the stand-in ranks of the links moved
}

void JobCoordinator::drop_replicas(const std::set<int>& vacant) {
  std::set<int> lost;
  for (int r : vacant)
    if (r >= 0 && r < topology_.workers()) lost.insert(topology_.coord_of(r).dp);
  if (lost.empty()) return;
  if (int(lost.size()) >= topology_.dp()) {
    LH_LOG_WARN("coordinator: --elastic: every replica lost a worker; the job waits for replacements");
    return;
  }
  JobConfig next = job_;
  for (auto it = lost.rbegin(); it != lost.rend(); ++it) {
    auto smaller = next.without_replica(*it);
    if (!smaller.ok()) {
      LH_LOG_ERROR("coordinator: --elastic: {}; the job waits for replacements", smaller.status().message());
      return;
    }
    next = std::move(*smaller);
  }
  auto smaller_topology = next.topology();
  if (!smaller_topology.ok()) return;
  std::map<int, int> new_rank;
  for (int r = 0; r < topology_.workers(); ++r) {
    const WorkerCoord c = topology_.coord_of(r);
    if (lost.count(c.dp)) continue;
    const int d = c.dp - int(std::distance(lost.begin(), lost.lower_bound(c.dp)));
    new_rank[r] = smaller_topology->rank_of({c.stage, c.tp, d});
  }
  std::string replicas;
  for (int d : lost) replicas += (replicas.empty() ? "" : ", ") + std::to_string(d);
  const int old_dp = job_.dp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status s = regrid_locked(next);
    if (!s.ok()) {
      LH_LOG_ERROR("coordinator: --elastic: {}; the job waits for replacements", s.message());
      return;
    }
  }
  const int per_slice = next.train.batch / next.slices();
  LH_LOG_WARN(
      "coordinator: --elastic: the job goes on without replica(s) {}: dp {} → {}, {} workers; each step trains on {} "
      "of the {} sequences the global batch had (the lost replicas' slices of it are skipped; data order, learning "
      "rate and its schedule unchanged)",
      replicas, old_dp, next.dp, next.workers, per_slice * next.dp, next.train.batch);
  Status s = coordinator_->regrid(next.workers, new_rank, kReplicaDroppedReason);
  if (!s.ok()) LH_LOG_ERROR("coordinator: --elastic: {}", s.message());
}

Status JobCoordinator::wait(std::chrono::milliseconds timeout) {
  if (!coordinator_->wait_done(timeout)) return unavailable("the job did not finish within the timeout");
  drain_writes();  // the last checkpoint is committed before the job is reported done
  settle_pending_acks(false, "the job ended before every worker reached the step boundary where it applies");
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_) return *failure_;
  const int64_t done = collector_->newest_step();
  if (preempt_at_ > 0 && done < job_.train.steps) {
    const int64_t committed = store_ ? store_->last_committed() : 0;
    return unavailable(
        "preempted (" + preempt_reason_ + ") after step " + std::to_string(done) + "; " +
        (committed == preempt_at_ ? "its checkpoint is committed"
         : committed > 0 ? "its checkpoint is incomplete: the newest committed one is step " + std::to_string(committed)
                         : "no checkpoint was committed"));
  }
  return Status::Ok();
}

void JobCoordinator::preempt(const std::string& reason) {
  if (preempted_.exchange(true)) return;
  std::string stop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    preempt_reason_ = reason;
    const int64_t newest = collector_->newest_step();
    if (!store_) {
      stop = "preempted (" + reason + "): the job keeps no checkpoints (--checkpoint-dir), so it stops after step " +
             std::to_string(std::max<int64_t>(newest, 0)) + " with nothing saved";
    } else if (!training_ || coordinator_->recovering()) {
      stop = "preempted (" + reason + ") before its workers trained; the newest committed checkpoint is step " +
             std::to_string(store_->last_committed());
    } else {
      // Ahead of every worker (one may have begun the step after the newest report), but soon: the scheduler's grace
      // period (Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds; 30 s by default) is running. Never past
      // the last step: a job that would end first simply ends.
      preempt_at_ = std::min<int64_t>(std::max(newest, resumed_from_) + 2, job_.train.steps);
    }
  }
  if (!stop.empty()) {
    LH_LOG_WARN("coordinator: {}", stop);
    note(collector_->newest_step(), "preempt", stop);
    if (claim_failure(stop)) coordinator_->shutdown(stop);
    return;
  }
  LH_LOG_WARN("coordinator: preempted ({}): every worker saves a checkpoint after step {} and stops", reason,
              preempt_at_);
  note(preempt_at_, "preempt",
       "preempted (" + reason + "): checkpoint after step " + std::to_string(preempt_at_) + ", then stop");
  coordinator_->broadcast(Preempt{preempt_at_, reason});
}

// Adaptive compression of the replicas' gradients: one auto "link" per stage whose group's codec is auto, its
// stand-in the pair (replica 0 → replica 1, shard 0); bytes per ladder entry: what one member sends one other per
// step, the stage shard's gradients (direct: its whole packet; mesh: 2/dp of it).
Status JobCoordinator::setup_auto_grad_locked() {
  auto_grad_.reset();
  auto_tp_.reset();
  LH_ASSIGN_OR_RETURN(std::vector<int> stages, job_.auto_grad_stages());
  if (topology_.dp() < 2) stages.clear();
  if (stages.empty() && !(job_.compress_tp == "auto" && topology_.tp() > 1)) return Status::Ok();
  AutoCodecConfig config;
  if (!stages.empty()) {
    LH_ASSIGN_OR_RETURN(config.ladder, parse_auto_grad_ladder(job_.auto_grad_ladder));
  }
  config.every = job_.auto_every;
  config.fit = job_.auto_fit;
  config.tokens_per_step = double(job_.train.batch) * job_.train.model.seq;
  LH_ASSIGN_OR_RETURN(std::vector<std::string> now, job_.grad_specs());
  for (const GradChange& c : grad_changes_)
    for (int s : stages)
      if (c.stage < 0 || c.stage == s) now[size_t(s)] = c.spec;
  std::vector<AutoCodec::Link> out;
  for (int s : stages) {
    LH_ASSIGN_OR_RETURN(double params, stage_parameters(job_, s));
    AutoCodec::Link x;
    x.src = topology_.rank_of({s, 0, 0});
    x.dst = topology_.rank_of({s, 0, 1});
    x.name = link_name(topology_, x.src, x.dst);
    x.name = x.name.substr(0, x.name.find(':'));  // a group's codec is one for both ways: "s1d0-s1d1"
    x.role = "grad";
    for (const std::string& spec : config.ladder) {
      LH_ASSIGN_OR_RETURN(compress::CodecChain chain, compress::parse_codec_spec(spec));
      auto n = chain.packet_bytes(Shape{int64_t(params)});
      if (!n.ok()) return Status(n.status()).prepend("--auto-grad-ladder entry '" + spec + "'");
      const bool direct = topology_.dp() == 2 || *n < 256 * 1024;  // as the collectives layer chooses
      x.bytes_per_mb.push_back(direct ? uint64_t(*n) : uint64_t(2 * *n / size_t(topology_.dp())));
    }
    auto at = std::find(config.ladder.begin(), config.ladder.end(), now[size_t(s)]);
    x.current = at == config.ladder.end() ? 0 : int(at - config.ladder.begin());
    out.push_back(std::move(x));
  }
  if (job_.compress_tp == "auto" && topology_.tp() > 1) {
    // The tp groups' sums: one auto "link" for all of them (they switch together), its stand-in stage 0's pair
    // (shard 0 → shard 1, replica 0); per step, four sums per block and microbatch, each one partial sum's packet.
    AutoCodecConfig tc = config;
    LH_ASSIGN_OR_RETURN(tc.ladder, parse_auto_tp_ladder(job_.auto_tp_ladder));
    AutoCodec::Link x;
    x.src = topology_.rank_of({0, 0, 0});
    x.dst = topology_.rank_of({0, 1, 0});
    x.name = link_name(topology_, x.src, x.dst);
    x.name = x.name.substr(0, x.name.find(':'));
    x.role = "tp";
    x.overlaps_compute = false;
    LH_ASSIGN_OR_RETURN(Partition part, job_.make_partition());
    x.ops_per_step = 4 * int64_t(part.counts()[0]) * job_.microbatches;
    int64_t rows = job_.train.batch / (int64_t(job_.slices()) * job_.microbatches);
    LH_ASSIGN_OR_RETURN(std::vector<int> shares, job_.dp_rows());
    for (int n : shares) rows = std::max<int64_t>(rows, n / job_.microbatches);
    for (const std::string& spec : tc.ladder) {
      LH_ASSIGN_OR_RETURN(compress::CodecChain chain, compress::parse_codec_spec(spec));
      auto n = chain.packet_bytes(Shape{rows, job_.train.model.seq, job_.train.model.d_model});
      if (!n.ok()) return Status(n.status()).prepend("--auto-tp-ladder entry '" + spec + "'");
      x.bytes_per_mb.push_back(uint64_t(*n));
    }
    std::string now = job_.tp_spec().ok() ? job_.tp_spec().value() : tc.ladder.front();
    for (const GradChange& c : tp_changes_) now = c.spec;
    auto at = std::find(tc.ladder.begin(), tc.ladder.end(), now);
    x.current = at == tc.ladder.end() ? 0 : int(at - tc.ladder.begin());
    tc.tokens_per_step = double(job_.train.batch) * job_.train.model.seq;
    auto_tp_ = std::make_unique<AutoCodec>(tc, std::vector<AutoCodec::Link>{x}, topology_.workers(), job_.microbatches);
    LH_LOG_INFO("coordinator: adaptive compression of the tp sums, ladder {}, every {} steps", job_.auto_tp_ladder,
                config.every);
  }
  if (out.empty()) return Status::Ok();
  auto_grad_ = std::make_unique<AutoCodec>(config, std::move(out), topology_.workers(), job_.microbatches);
  LH_LOG_INFO("coordinator: adaptive compression of {} replica group(s), ladder {}, every {} steps",
              auto_grad_->links().size(), job_.auto_grad_ladder, config.every);
  return Status::Ok();
}

Status JobCoordinator::setup_auto_locked() {
  LH_RETURN_IF_ERROR(setup_auto_grad_locked());
  auto_.reset();
  LH_ASSIGN_OR_RETURN(auto links, job_.auto_links());
  if (links.empty()) return Status::Ok();
  AutoCodecConfig config;
  LH_ASSIGN_OR_RETURN(config.ladder, parse_auto_ladder(job_.auto_ladder));
  config.every = job_.auto_every;
  config.fit = job_.auto_fit;
  config.tokens_per_step = double(job_.train.batch) * job_.train.model.seq;
  // One microbatch's activation (and its gradient): [batch / (slices · microbatches), seq, width].
  const GptConfig& m = job_.train.model;
  int64_t mb = job_.train.batch / (int64_t(job_.slices()) * job_.microbatches);
  LH_ASSIGN_OR_RETURN(std::vector<int> shares, job_.dp_rows());  // --dp-split: the largest replica's microbatch
  for (int n : shares) mb = std::max<int64_t>(mb, n / job_.microbatches);
  const Shape shape{mb, m.seq, m.subspace_k > 0 ? m.subspace_k : m.d_model};
  std::vector<uint64_t> bytes;
  for (const std::string& spec : config.ladder) {
    LH_ASSIGN_OR_RETURN(compress::CodecChain chain, compress::parse_codec_spec(spec));
    auto n = chain.packet_bytes(shape);
    if (!n.ok()) return Status(n.status()).prepend("--auto-ladder entry '" + spec + "' for activations");
    bytes.push_back(uint64_t(*n));
  }
  // Decisions by the planner's step model: the pipeline simulator over the job's schedule and stages.
  AutoCodecConfig::Pipeline pipe;
  pipe.kind = job_.schedule;
  pipe.stages = topology_.pp();
  for (int r = 0; r < topology_.workers(); ++r) pipe.stage_of[r] = topology_.coord_of(r).stage;
  config.pipeline = pipe;
  config.step_tolerance = job_.auto_tolerance;
  std::vector<AutoCodec::Link> out;
  for (const auto& [l, d] : links) {
    // The link's stand-in pair (tp shard 0, replica 0), as set-codec's messages name it; all its pairs switch.
    const int a = topology_.rank_of({l.from, 0, 0}), b = topology_.rank_of({l.to, 0, 0});
    AutoCodec::Link x;
    x.src = d == LinkDir::kFwd ? a : b;
    x.dst = d == LinkDir::kFwd ? b : a;
    x.name = l.name() + ":" + link_dir_name(d);
    x.role = d == LinkDir::kFwd ? "act" : "act_grad";
    x.bytes_per_mb = bytes;
    const std::string now = codecs_.spec_at(l, d, std::max<int64_t>(codecs_.current_step(), 0));
    auto at = std::find(config.ladder.begin(), config.ladder.end(), now);
    x.current = at == config.ladder.end() ? 0 : int(at - config.ladder.begin());
    out.push_back(std::move(x));
  }
  auto_ = std::make_unique<AutoCodec>(config, std::move(out), topology_.workers(), job_.microbatches);
  LH_LOG_INFO("coordinator: adaptive compression on {} link direction(s), ladder {}, every {} steps",
              auto_->links().size(), job_.auto_ladder, config.every);
  return Status::Ok();
}

std::string JobCoordinator::observe_auto(int rank, int64_t step, const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!auto_ && !auto_grad_ && !auto_tp_) return line;
  auto record = parse_step_metrics_line(line, 0, "rank " + std::to_string(rank));
  if (!record.ok() || record->worker != rank || record->step != step) return line;  // the collector says why
  if (std::optional<int64_t> decide_at = auto_grad_ ? auto_grad_->observe(*record) : std::nullopt) {
    // As set-codec --role grad: from the step after the newest a worker may have begun (three past the report).
    if (*decide_at + 2 > codecs_.current_step()) (void)codecs_.begin_step(*decide_at + 2);
    for (AutoDecision& d : auto_grad_->decide(*decide_at)) {
      d.from_step = codecs_.current_step() + 1;
      auto set = set_grad_codec_locked(d.to, d.link, 0);
      if (!set.ok()) {
        LH_LOG_WARN("coordinator: auto could not switch {} to {}: {}", d.link, d.to, set.status().message());
        continue;
      }
      LH_LOG_INFO("coordinator: auto: replica group {} {} → {} from step {} ({})", d.link, d.from, d.to, d.from_step,
                  d.reason);
      note(d.from_step, "auto", "replica group " + d.link + " " + d.from + " → " + d.to + ": " + d.reason);
      int sender = -1;
      for (const AutoCodec::Link& l : auto_grad_->links())
        if (l.name == d.link) sender = l.src;
      auto_to_record_[sender].push_back(auto_decision_to_json(d));
      auto_log_.push_back(d);
    }
  }
  if (std::optional<int64_t> decide_at = auto_tp_ ? auto_tp_->observe(*record) : std::nullopt) {
    if (*decide_at + 2 > codecs_.current_step()) (void)codecs_.begin_step(*decide_at + 2);
    for (AutoDecision& d : auto_tp_->decide(*decide_at)) {
      d.from_step = codecs_.current_step() + 1;
      auto set = set_tp_codec_locked(d.to, "", 0);
      if (!set.ok()) {
        LH_LOG_WARN("coordinator: auto could not switch the tp sums to {}: {}", d.to, set.status().message());
        continue;
      }
      LH_LOG_INFO("coordinator: auto: tp sums {} → {} from step {} ({})", d.from, d.to, d.from_step, d.reason);
      note(d.from_step, "auto", "tp sums " + d.from + " → " + d.to + ": " + d.reason);
      auto_to_record_[auto_tp_->links().front().src].push_back(auto_decision_to_json(d));
      auto_log_.push_back(d);
    }
  }
  if (std::optional<int64_t> decide_at = auto_ ? auto_->observe(*record) : std::nullopt) {
    // Like set-codec: three steps past the newest report, so every worker learns it before its step begins.
    if (*decide_at + 2 > codecs_.current_step()) (void)codecs_.begin_step(*decide_at + 2);
    for (AutoDecision& d : auto_->decide(*decide_at)) {
      const std::string name = d.link.substr(0, d.link.find(':')), dir = d.link.substr(d.link.find(':') + 1);
      auto change = codecs_.request_change(name, dir, d.to);
      if (!change.ok()) {
        LH_LOG_WARN("coordinator: auto could not switch {} to {}: {}", d.link, d.to, change.status().message());
        continue;
      }
      d.from_step = change->from_step;
      coordinator_->broadcast(set_codec_message(*change, topology_));
      LH_LOG_INFO("coordinator: auto: link {} {} → {} from step {} ({})", d.link, d.from, d.to, d.from_step, d.reason);
      note(d.from_step, "auto", d.link + " " + d.from + " → " + d.to + ": " + d.reason);
      int sender = -1;
      for (const AutoCodec::Link& l : auto_->links())
        if (l.name == d.link) sender = l.src;
      auto_to_record_[sender].push_back(auto_decision_to_json(d));
      auto_log_.push_back(d);
    }
  }
  auto pending = auto_to_record_.find(rank);
  if (pending == auto_to_record_.end() || pending->second.empty()) return line;
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) return line;
  j["auto"] = std::move(pending->second);
  auto_to_record_.erase(pending);
  return j.dump();
}

nlohmann::json JobCoordinator::status_json() {
  nlohmann::json links = nlohmann::json::array();
  const int64_t step = collector_->newest_step();
  auto summary = collector_->summary();
  std::lock_guard<std::mutex> lock(mu_);
  for (const PipelineLink& l : topology_.pipeline_links())
    for (LinkDir d : {LinkDir::kFwd, LinkDir::kBwd}) {
      nlohmann::json e = {{"link", l.name()},
                          {"dir", link_dir_name(d)},
                          {"spec", codecs_.spec_at(l, d, std::max<int64_t>(step + 1, 0))}};
      if (summary.ok())
        for (const LinkTotals& t : summary->links) {
          const bool fwd = t.role == "act", bwd = t.role == "act_grad";
          auto tl = topology_.link_between(t.src, t.dst);
          if (!tl || !(*tl == l) || !((d == LinkDir::kFwd && fwd) || (d == LinkDir::kBwd && bwd))) continue;
          e["raw_bytes"] = e.value("raw_bytes", uint64_t(0)) + t.raw_bytes;
          e["wire_bytes"] = e.value("wire_bytes", uint64_t(0)) + t.wire_bytes;
          e["busy_seconds"] = e.value("busy_seconds", 0.0) + t.seconds;
        }
      if (e.value("busy_seconds", 0.0) > 0)
        e["measured_bps"] = 8.0 * e.value("wire_bytes", uint64_t(0)) / e.value("busy_seconds", 0.0);
      links.push_back(std::move(e));
    }
  // A group row's traffic: every metered pair `counts` takes, summed.
  auto add_traffic = [&](nlohmann::json& e, const std::function<bool(const LinkTotals&)>& counts) {
    uint64_t raw = 0, wire = 0;
    double busy = 0;
    if (summary.ok())
      for (const LinkTotals& t : summary->links)
        if (counts(t)) {
          raw += t.raw_bytes;
          wire += t.wire_bytes;
          busy += t.seconds;
        }
    e["raw_bytes"] = raw;
    e["wire_bytes"] = wire;
    e["busy_seconds"] = busy;
    if (busy > 0) e["measured_bps"] = 8.0 * double(wire) / busy;
  };
  if (topology_.dp() > 1) {          // the replicas' gradient traffic, one row per stage's dp group
    auto specs = job_.grad_specs();  // valid: the job was validated at start
    for (int s = 0; s < topology_.pp(); ++s) {
      std::string spec = specs.ok() ? (*specs)[size_t(s)] : job_.compress_grad;
      for (const GradChange& c : grad_changes_)
        if (c.from <= step + 1 && (c.stage < 0 || c.stage == s)) spec = c.spec;
      nlohmann::json e = {{"link", group_label(s)}, {"dir", "grad"}, {"spec", spec}};
      add_traffic(e, [&](const LinkTotals& t) {
        return t.role == "grad" && t.src >= 0 && t.src < topology_.workers() && topology_.coord_of(t.src).stage == s;
      });
      links.push_back(std::move(e));
    }
  }
  if (topology_.tp() > 1) {  // the tp shards' partial sums, one row for every tp group
    std::string spec = job_.compress_tp;
    for (const GradChange& c : tp_changes_)
      if (c.from <= step + 1) spec = c.spec;
    nlohmann::json e = {{"link", "tp shards"}, {"dir", "tp"}, {"spec", spec}};
    add_traffic(e, [](const LinkTotals& t) { return t.role == "tp"; });
    links.push_back(std::move(e));
  }
  nlohmann::json changes = nlohmann::json::array();
  for (const CodecChange& c : codecs_.changes())
    changes.push_back(
        {{"link", c.link.name()}, {"dir", link_dir_name(c.dir)}, {"spec", c.spec}, {"from_step", c.from_step}});
  for (const GradChange& c : grad_changes_)
    changes.push_back({{"link", c.stage < 0 ? std::string("replicas") : group_label(c.stage)},
                       {"dir", "grad"},
                       {"spec", c.spec},
                       {"from_step", c.from}});
  for (const GradChange& c : tp_changes_)
    changes.push_back({{"link", "tp shards"}, {"dir", "tp"}, {"spec", c.spec}, {"from_step", c.from}});
  nlohmann::json decisions = nlohmann::json::array();
  for (size_t i = auto_log_.size() > 50 ? auto_log_.size() - 50 : 0; i < auto_log_.size(); ++i)
    decisions.push_back(auto_decision_to_json(auto_log_[i]));
  auto part = job_.make_partition();  // valid: the job was validated at start
  return {{"job", job_.to_json()},
          {"step", step},
          {"partition", part.ok() ? part->to_string() : part.status().message()},
          {"schedule", schedule_kind_name(job_.schedule)},
          {"links", links},
          {"codec_changes", changes},
          {"auto_decisions", decisions},
          {"workers", coordinator_->status_json()},
          {"http", http_url()},
          {"http_bind", http_ ? http_->host() : std::string()}};
}

std::string JobCoordinator::group_label(int stage) const {
  return topology_.pp() > 1 ? "s" + std::to_string(stage) + " replicas" : "replicas";
}

// The replicas' gradient codec, from the next step boundary: every dp group's, or (with a link naming replica
// links) the groups of the stages it touches — a group's all-reduce uses one codec.
Result<std::string> JobCoordinator::set_grad_codec_locked(const std::string& spec, const std::string& link,
                                                          uint64_t ack_id) {
  if (topology_.dp() < 2)
    return invalid_argument("set-codec --role grad: the job has one replica (--dp 1), so no gradients cross a link");
  LH_ASSIGN_OR_RETURN(SyncConfig sync, parse_sync(job_.sync));
  {
    Status s = check_grad_codec_spec(spec, sync);
    if (!s.ok()) return s.prepend("set-codec --role grad '" + spec + "'");
  }
  std::map<int, std::pair<int, int>> stages;  // stage → one of its dp pairs
  if (!link.empty()) {
    auto sel = parse_link_selector(topology_, link);
    if (!sel.ok()) return Status(sel.status()).prepend("set-codec --role grad --link");
    if (sel->kind != "dp")
      return invalid_argument("set-codec --role grad --link '" + link + "' names " + sel->kind +
                              " links; name replica links, e.g. " +
                              link_name(topology_, 0, topology_.rank_of({0, 0, 1})));
    if (link.find(':') != std::string::npos)
      return invalid_argument("set-codec --role grad --link '" + link +
                              "': a replica group's all-reduce uses one codec both ways; drop the :fwd/:bwd");
    for (const auto& p : sel->pairs) stages.emplace(topology_.coord_of(p.first).stage, p);
  }
  const int64_t from = codecs_.current_step() + 1;
  if (stages.empty()) {
    grad_changes_.push_back({from, spec, -1});
    coordinator_->broadcast(SetCodec{-1, -1, "grad", spec, from, ack_id});
  } else {
    for (const auto& [stage, pair] : stages) {
      grad_changes_.push_back({from, spec, stage});
      coordinator_->broadcast(SetCodec{pair.first, pair.second, "grad", spec, from, ack_id});
    }
  }
  LH_LOG_INFO("coordinator: the replicas' gradients{} switch to {} at step {}", link.empty() ? "" : " of " + link, spec,
              from);
  return nlohmann::json{
      {"role", "grad"}, {"link", link.empty() ? "replicas" : link}, {"spec", spec}, {"from_step", from}}
      .dump();
}

// The tp groups' codec, from the next step boundary: every group switches together.
Result<std::string> JobCoordinator::set_tp_codec_locked(const std::string& spec, const std::string& link,
                                                        uint64_t ack_id) {
  if (topology_.tp() < 2)
    return invalid_argument(
        "set-codec --role tp: the job has one tensor shard per stage (--tp 1), so no partial sums "
        "cross a link");
  if (!link.empty())
    return invalid_argument("set-codec --role tp --link '" + link +
                            "': every tp group's sums switch together; drop --link");
  {
    Status s = check_codec_spec(spec);
    if (!s.ok()) return s.prepend("set-codec --role tp '" + spec + "'");
  }
  const int64_t from = codecs_.current_step() + 1;
  tp_changes_.push_back({from, spec, -1});
  coordinator_->broadcast(SetCodec{-1, -1, "tp", spec, from, ack_id});
  LH_LOG_INFO("coordinator: the tp shards' partial sums switch to {} at step {}", spec, from);
  return nlohmann::json{{"role", "tp"}, {"link", "tp shards"}, {"spec", spec}, {"from_step", from}}.dump();
}

Result<std::string> JobCoordinator::handle_ctl(const std::string& command, const std::string& args, uint64_t ack_id) {
  if (command == "status") return status_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (command == "set-link") return set_link(args);
  if (command == "cluster") {
    // For `longhaul probe --coordinator`: the pre-flight's links and the workers' speeds from the steps so far.
    auto c = cluster_from_measurements(job_, collector_->snapshot(), coordinator_->preflight_json(),
                                       "the job's step metrics");
    if (!c.ok()) return Status(c.status()).prepend("cluster");
    nlohmann::json out = c->to_json();
    // Where each worker said it is (worker --site), so a plan made from this cluster keeps its sites.
    for (const WorkerInfo& w : coordinator_->workers())
      if (!w.join.site.empty() && w.rank >= 0 && out.contains("workers") && out["workers"].is_array() &&
          size_t(w.rank) < out["workers"].size())
        out["workers"][size_t(w.rank)]["site"] = w.join.site;
    return out.dump();
  }
  if (command != "set-codec")
    return invalid_argument("unknown ctl command '" + command + "' (allowed: status, set-codec, set-link, cluster)");
  auto j = nlohmann::json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("set-codec: the arguments are not a JSON object");
  auto text = [&](const char* f) {
    return j.contains(f) && j[f].is_string() ? j[f].get<std::string>() : std::string();
  };
  if (coordinator_->recovering())
    return unavailable("set-codec: the job is rolling back to its last checkpoint; try again once it steps");
  std::lock_guard<std::mutex> lock(mu_);
  // A worker may have finished a step whose report is still on its way and begun the next: changes take effect three
  // steps past the newest report. (A pipeline link's end that began that step anyway switches at its next one;
  // the replicas' and shards' collectives need every member at one step, and a worker that cannot refuses.)
  const int64_t newest = collector_->newest_step();
  if (newest + 2 > codecs_.current_step()) LH_RETURN_IF_ERROR(codecs_.begin_step(newest + 2));
  if (text("role") == "grad" || text("role") == "tp") {
    const bool grad = text("role") == "grad";
    auto r = grad ? set_grad_codec_locked(text("spec"), text("link"), ack_id)
                  : set_tp_codec_locked(text("spec"), text("link"), ack_id);
    if (r.ok()) {
      auto body = nlohmann::json::parse(*r, nullptr, false);
      const int64_t from = body.is_object() ? body.value("from_step", int64_t(0)) : 0;
      note(from, "codec",
           std::string(grad ? "the replicas' gradients" : "the tp sums") +
               (text("link").empty() ? "" : " of " + text("link")) + " → " + text("spec") + " (ctl set-codec)");
    }
    return r;
  }
  CodecChange change;
  if (j.contains("link")) {
    LH_ASSIGN_OR_RETURN(change, codecs_.request_change(text("link"), text("dir"), text("spec")));
  } else {
    auto rank_field = [&](const char* f) { return j.contains(f) && j[f].is_number_integer() ? j[f].get<int>() : -1; };
    SetCodec m{rank_field("src"), rank_field("dst"), text("dir"), text("spec"), -1};
    LH_ASSIGN_OR_RETURN(change, codec_change_of(m, topology_, codecs_));
    LH_RETURN_IF_ERROR(codecs_.schedule_change(change));
  }
  SetCodec message = set_codec_message(change, topology_);
  message.id = ack_id;
  coordinator_->broadcast(message);
  LH_LOG_INFO("coordinator: link {} {} switches to {} at step {}", change.link.name(), link_dir_name(change.dir),
              change.spec, change.from_step);
  note(change.from_step, "codec",
       change.link.name() + ":" + link_dir_name(change.dir) + " → " + change.spec + " (ctl set-codec)");
  return nlohmann::json{{"link", change.link.name()},
                        {"dir", link_dir_name(change.dir)},
                        {"spec", change.spec},
                        {"from_step", change.from_step}}
      .dump();
}

Result<std::string> JobCoordinator::set_link(const std::string& args) {
  auto j = nlohmann::json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("rule") || !j["rule"].is_string())
    return invalid_argument("set-link: the arguments are not a JSON object with a \"rule\" string");
  const std::string rule = j["rule"].get<std::string>();
  std::lock_guard<std::mutex> lock(mu_);
  if (job_.links.empty())
    return invalid_argument(
        "set-link: this job does not emulate its links; start it with --link RATE[,DELAY] "
        "(e.g. --link 10G for links as fast as the machine until changed)");
  if (job_.links.size() >= 4096) return invalid_argument("set-link: the job already has 4096 link rules");
  std::vector<std::string> next = job_.links;
  next.push_back(rule);
  Status s = check_link_rules(topology_, next);
  if (!s.ok()) return s.prepend("set-link");
  job_.links = std::move(next);  // the plans of later epochs carry it
  coordinator_->broadcast(SetLink{rule});
  LH_LOG_INFO("coordinator: link rule '{}' sent to every worker", rule);
  note(collector_->newest_step(), "set-link", "link rule '" + rule + "' (ctl set-link)");
  return nlohmann::json{{"rule", rule}, {"links", job_.links}}.dump();
}

JobCoordinator::~JobCoordinator() {
  http_.reset();         // no page is served after this
  coordinator_.reset();  // no hook runs after this
  {
    std::lock_guard<std::mutex> lock(writer_mu_);
    writer_stop_ = true;  // what is queued is still written
    writer_cv_.notify_all();
  }
  if (writer_.joinable()) writer_.join();
  std::lock_guard<std::mutex> lock(acks_mu_);
  pending_acks_.clear();  // the replies' sockets are gone
}

void JobCoordinator::handle_ctl_async(const CtlRequest& req, CoordinatorHooks::CtlReplyFn reply) {
  uint64_t id = 0;
  if (req.command == "set-codec") {
    std::lock_guard<std::mutex> lock(acks_mu_);
    id = ++next_ack_id_;
  }
  Result<std::string> r = handle_ctl(req.command, req.args, id);
  if (!r.ok() || id == 0) return reply(std::move(r));
  auto body = nlohmann::json::parse(*r, nullptr, false);
  std::lock_guard<std::mutex> lock(acks_mu_);
  pending_acks_[id] = PendingAck{std::move(reply), std::move(body), {}};
}

void JobCoordinator::on_codec_applied(const CodecApplied& ack) {
  CoordinatorHooks::CtlReplyFn reply;
  Result<std::string> result = std::string();
  {
    std::lock_guard<std::mutex> lock(acks_mu_);
    auto it = pending_acks_.find(ack.id);
    if (it == pending_acks_.end()) return;  // settled already (a rollback), or a replay
    PendingAck& p = it->second;
    p.acks[ack.rank] = ack;
    if (int(p.acks.size()) < topology_.workers()) return;
    std::string refused;
    nlohmann::json applied = nlohmann::json::array();
    for (const auto& [rank, a] : p.acks) {
      if (!a.ok) refused += (refused.empty() ? "" : "; ") + ("rank " + std::to_string(rank) + ": " + a.reason);
      if (a.ok && a.from_step >= 0) applied.push_back({{"rank", rank}, {"from_step", a.from_step}});
    }
    p.body["applied"] = applied;
    result = refused.empty() ? Result<std::string>(p.body.dump())
                             : Result<std::string>(invalid_argument("set-codec could not be applied: " + refused));
    reply = std::move(p.reply);
    pending_acks_.erase(it);
  }
  reply(std::move(result));
}

void JobCoordinator::settle_pending_acks(bool ok, const std::string& note) {
  std::map<uint64_t, PendingAck> pending;
  {
    std::lock_guard<std::mutex> lock(acks_mu_);
    pending.swap(pending_acks_);
  }
  for (auto& [id, p] : pending) {
    p.body["note"] = note;
    p.reply(ok ? Result<std::string>(p.body.dump()) : Result<std::string>(unavailable("set-codec: " + note)));
  }
}

// The page's data (web/page.html): the status ctl shows, with the series and events a watcher needs.
nlohmann::json JobCoordinator::page_json() {
  nlohmann::json st = status_json();
  const nlohmann::json& control = st["workers"];
  const JobConfig j = job();
  char title[160];
  std::snprintf(title, sizeof title, "%d stage%s × %d shard%s × %d replica%s · %lld steps", j.pp, j.pp == 1 ? "" : "s",
                j.tp, j.tp == 1 ? "" : "s", j.dp, j.dp == 1 ? "" : "s", static_cast<long long>(j.train.steps));
  return {{"mode", "live"},
          {"title", title},
          {"step", st["step"]},
          {"steps", j.train.steps},
          {"grid", {{"pp", j.pp}, {"tp", j.tp}, {"dp", j.dp}}},
          {"schedule", st["schedule"]},
          {"partition", st["partition"]},
          {"links", st["links"]},
          {"workers", control.value("workers", nlohmann::json::array())},
          {"preflight", control.value("preflight", nlohmann::json::array())},
          {"relay", control.value("relay", nlohmann::json())},
          {"points", history_->points_json()},
          {"events", history_->events_json()},
          {"counters",
           {{"workers_joined", joined_.load()},
            {"workers_lost", lost_.load()},
            {"rollbacks", rollbacks_.load()},
            {"auth_failures", history_->auth_failures()},
            {"refused_connections", coordinator_->refused_connections()},
            {"rejected_messages", coordinator_->rejected()}}}};
}

// /metrics: names and units as Prometheus' conventions ask (base units, _total on counters, _info for labels).
std::string JobCoordinator::prometheus_text() {
  PrometheusText p;
  const std::vector<LinkCounter> counters = history_->counters();
  auto labels = [](const LinkCounter& c) {
    return PromLabels{
        {"link", c.link}, {"role", c.role}, {"codec", c.codec}, {"path", c.relayed ? "relayed" : "direct"}};
  };
  p.family("longhaul_link_raw_bytes_total", "counter",
           "Bytes the tensors sent over a link would take uncompressed in fp32, counted by the sender.");
  for (const LinkCounter& c : counters) p.sample("longhaul_link_raw_bytes_total", labels(c), c.raw_bytes);
  p.family("longhaul_link_wire_bytes_total", "counter", "Bytes that crossed a link, counted by the sender.");
  for (const LinkCounter& c : counters) p.sample("longhaul_link_wire_bytes_total", labels(c), c.wire_bytes);
  p.family("longhaul_link_messages_total", "counter", "Messages sent over a link.");
  for (const LinkCounter& c : counters) p.sample("longhaul_link_messages_total", labels(c), c.messages);
  p.family("longhaul_link_busy_seconds_total", "counter", "Seconds a link was busy with its traffic.");
  for (const LinkCounter& c : counters) p.sample("longhaul_link_busy_seconds_total", labels(c), c.seconds);
  const std::vector<LinkGauge> gauges = history_->gauges();
  p.family("longhaul_link_bandwidth_bytes_per_second", "gauge",
           "A link's measured rate in its newest step: wire bytes over the link's serial time.");
  for (const LinkGauge& g : gauges)
    if (g.bytes_per_s)
      p.sample("longhaul_link_bandwidth_bytes_per_second", {{"link", g.link}, {"role", g.role}}, *g.bytes_per_s);
  p.family("longhaul_link_latency_seconds", "gauge", "A link's measured one-way latency in its newest step.");
  for (const LinkGauge& g : gauges)
    if (g.latency_s) p.sample("longhaul_link_latency_seconds", {{"link", g.link}, {"role", g.role}}, *g.latency_s);
  nlohmann::json st = status_json();
  p.family("longhaul_link_codec_info", "gauge",
           "The codec each link and direction uses from the next step (always 1).");
  for (const nlohmann::json& l : st["links"])
    p.sample("longhaul_link_codec_info",
             {{"link", l.value("link", "")}, {"dir", l.value("dir", "")}, {"codec", l.value("spec", "")}}, 1.0);
  const JobHistory::Latest latest = history_->latest();
  const JobConfig j = job();
  p.family("longhaul_step", "gauge", "The newest step any worker reported.");
  p.sample("longhaul_step", {}, double(latest.step));
  p.family("longhaul_steps", "gauge", "The steps the job trains.");
  p.sample("longhaul_steps", {}, double(j.train.steps));
  if (latest.tokens_per_s && *latest.tokens_per_s > 0) {
    p.family("longhaul_tokens_per_second", "gauge", "Tokens per second in the newest step a worker reported it.");
    p.sample("longhaul_tokens_per_second", {}, *latest.tokens_per_s);
    p.family("longhaul_step_seconds", "gauge", "Seconds of the newest step: its tokens over tokens per second.");
    p.sample("longhaul_step_seconds", {}, double(j.train.batch) * j.train.model.seq / *latest.tokens_per_s);
  }
  if (latest.loss) {
    p.family("longhaul_loss", "gauge", "Training loss of the newest step that reported one.");
    p.sample("longhaul_loss", {}, *latest.loss);
  }
  if (latest.val_loss) {
    p.family("longhaul_validation_loss", "gauge", "The newest validation loss.");
    p.sample("longhaul_validation_loss", {}, *latest.val_loss);
  }
  p.family("longhaul_workers", "gauge", "Workers the coordinator knows, by state.");
  std::map<std::string, int> states;
  for (const nlohmann::json& w : st["workers"].value("workers", nlohmann::json::array()))
    ++states[w.value("state", "")];
  for (const auto& [state, n] : states) p.sample("longhaul_workers", {{"state", state}}, double(n));
  p.family("longhaul_workers_joined_total", "counter",
           "Joins the coordinator admitted (rejoins after a rollback too).");
  p.sample("longhaul_workers_joined_total", {}, joined_.load());
  p.family("longhaul_workers_lost_total", "counter", "Workers that stopped heartbeating or left before the job's end.");
  p.sample("longhaul_workers_lost_total", {}, lost_.load());
  p.family("longhaul_rollbacks_total", "counter", "Rollbacks to the last checkpoint.");
  p.sample("longhaul_rollbacks_total", {}, rollbacks_.load());
  p.family("longhaul_data_auth_failures", "gauge",
           "Packets the workers' data planes refused as unauthenticated in this epoch (each worker's newest count).");
  p.sample("longhaul_data_auth_failures", {}, history_->auth_failures());
  p.family("longhaul_control_refused_connections_total", "counter",
           "Control-plane connections refused by CURVE (no or a wrong job secret).");
  p.sample("longhaul_control_refused_connections_total", {}, coordinator_->refused_connections());
  p.family("longhaul_control_rejected_messages_total", "counter",
           "Control messages refused (a bad token, garbage, an unknown type, a member not joined).");
  p.sample("longhaul_control_rejected_messages_total", {}, coordinator_->rejected());
  uint64_t decisions = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    decisions = auto_log_.size();
  }
  p.family("longhaul_auto_decisions_total", "counter", "Codec changes adaptive compression (auto) made.");
  p.sample("longhaul_auto_decisions_total", {}, decisions);
  if (http_) {
    p.family("longhaul_http_unauthorized_requests_total", "counter", "Requests to this endpoint without the token.");
    p.sample("longhaul_http_unauthorized_requests_total", {}, http_->unauthorized());
  }
  return p.str();
}

Status JobCoordinator::start_http(const JobCoordinatorOptions& options) {
  if (options.http.empty()) return Status::Ok();
  auto json_response = [](const nlohmann::json& j) {
    return HttpResponse{200, "application/json", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
  };
  std::map<std::string, HttpRoute> routes;
  // The page itself carries no data (it asks api/page with the token from its URL's fragment).
  routes["/"] = {[] { return HttpResponse{200, "text/html; charset=utf-8", live_page_html()}; }, false, 0};
  // At most one answer a second: a client that polls fast costs the job no more than one that polls slowly.
  routes["/api/page"] = {[this, json_response] { return json_response(page_json()); }, true, 1.0};
  routes["/api/status"] = {[this, json_response] { return json_response(status_json()); }, true, 1.0};
  routes["/metrics"] = {[this] {
                          return HttpResponse{200, PrometheusText::kContentType, prometheus_text()};
                        },
                        true, 1.0};
  HttpServerOptions o;
  o.listen = options.http;
  o.token = options.http_token;
  LH_ASSIGN_OR_RETURN(http_, HttpServer::start(o, std::move(routes)));
  LH_LOG_INFO("coordinator: the live page is at {} (/metrics for Prometheus{})", http_->url(),
              http_->needs_token() ? "; beyond loopback every request needs the page token" : "");
  return Status::Ok();
}

}  // namespace lh
