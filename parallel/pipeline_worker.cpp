// One pipeline worker: join → plan → connect → train the stage with live codec changes → leave.
// Used by `longhaul worker` and `longhaul launch`.
#include "parallel/pipeline_worker.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/dataset.h"
#include "core/log.h"
#include "parallel/job_config.h"
#include "parallel/stage_runner.h"
#include "transport/control_client.h"

namespace lh {
namespace {

// Control events arrive on a background thread: a lost peer or a shutdown fails the data plane at
// once (so a stage blocked on a receive wakes up); codec changes wait for the next step boundary.
class EventPump {
 public:
  EventPump(ControlClient& cc, DataPlane& plane) : cc_(cc), plane_(plane), thread_([this] { run(); }) {}
  ~EventPump() {
    stop_ = true;
    thread_.join();
  }
  std::vector<SetCodec> take_codec_changes() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SetCodec> out(changes_.begin(), changes_.end());
    changes_.clear();
    return out;
  }
  // Why the job must stop, if it must.
  std::optional<Status> stop_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_reason_;
  }

 private:
  void fail_all(const std::string& reason) {
    for (int peer : plane_.peers()) plane_.fail_peer(peer, reason);
  }
  void run() {
    while (!stop_) {
      auto ev = cc_.wait_event(std::chrono::milliseconds(50));
      if (!ev) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (auto* m = std::get_if<SetCodec>(&*ev)) {
        changes_.push_back(*m);
      } else if (auto* lost = std::get_if<PeerLost>(&*ev)) {
        const std::string why =
            "worker " + std::to_string(lost->rank) + " (" + lost->hostname + ") was lost: " + lost->reason;
        if (!stop_reason_) stop_reason_ = unavailable(why);
        fail_all(why);
      } else if (auto* down = std::get_if<Shutdown>(&*ev)) {
        if (!stop_reason_) stop_reason_ = unavailable("the coordinator stopped the job: " + down->reason);
        fail_all("job shut down: " + down->reason);
      } else if (auto* rej = std::get_if<Reject>(&*ev)) {
        LH_LOG_WARN("coordinator refused a message: {}", rej->reason);
      }
    }
  }
  ControlClient& cc_;
  DataPlane& plane_;
  std::mutex mu_;
  std::deque<SetCodec> changes_;
  std::optional<Status> stop_reason_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

Status run_pipeline_worker(const PipelineWorkerOptions& options) {
  LH_ASSIGN_OR_RETURN(std::unique_ptr<UcxDataPlane> ucx, UcxDataPlane::create(options.ucx));
  auto meter = std::make_shared<LinkMeter>();
  ucx->set_meter(meter);
  ControlClientOptions co;
  co.coordinator = options.coordinator;
  co.token = options.token;
  co.hostname = options.hostname;
  co.compute_speed = options.compute_speed;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<ControlClient> cc, ControlClient::connect(co));
  LH_ASSIGN_OR_RETURN(Plan plan, cc->join(ucx->address(), options.join_timeout));
  auto job = PipelineJobConfig::from_json(plan.config);
  if (!job.ok()) return Status(job.status()).prepend("the coordinator's plan");
  if (options.on_rank) options.on_rank(plan.rank);
  LH_ASSIGN_OR_RETURN(Topology topology, job->topology());
  LH_ASSIGN_OR_RETURN(Partition partition, job->make_partition());
  LH_ASSIGN_OR_RETURN(CodecPlan codec_plan, codec_plan_from_link_codecs(plan.codecs, topology));
  CodecSchedule codecs(topology, codec_plan);

  std::map<int, Bytes> peers;
  for (const PeerInfo& p : plan.peers)
    if (p.rank != plan.rank) peers[p.rank] = p.ucx_address;
  LH_RETURN_IF_ERROR(ucx->connect(plan.rank, peers));
  meter->set_self_rank(plan.rank);
  std::unique_ptr<DataPlane> plane = std::move(ucx);
  if (options.link) plane = std::make_unique<LinkShaper>(std::move(plane), *options.link);

  const TrainConfig& train = job->train;
  auto data = train.data.empty() ? TextDataset::default_corpus(train.model.seq)
                                 : TextDataset::from_file(train.data, train.model.seq);
  if (!data.ok()) return data.status();
  BatchSampler sampler(&*data, Split::train, train.batch, train.model.seq, train.seed);
  StageRunnerOptions ro;
  ro.microbatches = job->microbatches;
  ro.schedule = job->schedule;
  LH_ASSIGN_OR_RETURN(std::vector<std::string> grad_specs, job->grad_specs());
  ro.compress_grad = grad_specs.at(size_t(topology.coord_of(plan.rank).stage));
  LH_ASSIGN_OR_RETURN(ro.sync, parse_sync(job->sync));
  ro.compress_tp = job->compress_tp;
  LH_ASSIGN_OR_RETURN(ro.tp_heads, job->tp_heads_split());
  ro.receive_timeout = options.receive_timeout;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<StageRunner> runner,
                      StageRunner::create(train, topology, partition, plan.rank, ro, *plane, codecs));
  LH_LOG_INFO("stage {} of {}: blocks [{}, {}){}{}", runner->span().stage, topology.pp(), runner->span().first_block,
              runner->span().end_block(), runner->span().has_embedding ? " + embedding" : "",
              runner->span().has_head ? " + head" : "");
  {
    // What tensor parallelism is for: the model state this worker holds (fp32 parameters, gradients and AdamW's
    // two moments), and, at the end, its peak resident memory.
    const int64_t n = runner->model().num_params();
    const WorkerCoord me = topology.coord_of(plan.rank);
    LH_LOG_INFO(
        "rank {} (stage {}, tp shard {} with {} heads, replica {}): {} parameters; parameters, gradients and "
        "optimizer state {:.2f} MB",
        plan.rank, me.stage, me.tp, runner->model().local_heads(), me.dp, n, double(n) * 16 / 1e6);
  }
  LH_RETURN_IF_ERROR(cc->ready(options.join_timeout));

  Status result = Status::Ok();
  {
    EventPump events(*cc, *plane);
    std::vector<int32_t> tokens, targets;
    for (int64_t step = 1; step <= train.steps; ++step) {
      if (auto why = events.stop_reason()) {
        result = *why;
        break;
      }
      for (const SetCodec& m : events.take_codec_changes()) {
        if (m.dir == "grad" || m.dir == "tp") {
          // A grad change naming a pair is for that stage's dp group only; tp changes are for every group.
          if (m.dir == "grad" && m.src >= 0) {
            auto c = topology.checked_coord_of(m.src);
            if (!c.ok()) {
              LH_LOG_WARN("set-codec ignored: {}", c.status().message());
              continue;
            }
            if (c->stage != topology.coord_of(plan.rank).stage) continue;
          }
          const int64_t from = m.apply_at_step == -1 ? step : m.apply_at_step;
          const bool tp = m.dir == "tp";
          Status s = tp ? runner->schedule_tp_codec(m.spec, from) : runner->schedule_grad_codec(m.spec, from);
          if (!s.ok())
            LH_LOG_WARN("set-codec ignored: {}", s.message());
          else
            LH_LOG_INFO("the {} codec becomes {} from step {}", tp ? "tp shards' partial-sum" : "replicas' gradient",
                        m.spec, from);
          continue;
        }
        auto change = codec_change_of(m, topology, codecs);
        Status s = change.ok() ? codecs.schedule_change(*change) : change.status();
        if (!s.ok())
          LH_LOG_WARN("set-codec ignored: {}", s.message());
        else
          LH_LOG_INFO("codec of link {} {} becomes {} from step {}", change->link.name(), link_dir_name(change->dir),
                      change->spec, change->from_step);
      }
      sampler.next(&tokens, &targets);
      auto r = runner->step(step, tokens.data(), targets.data());
      if (!r.ok()) {
        // A lost peer explains a failed receive better than the receive itself.
        result = events.stop_reason().value_or(r.status());
        break;
      }
      // Validation as `longhaul train` does it: every eval_every steps and after the last, on the
      // same fixed batches (a fresh sampler under the job's seed) every time.
      if ((train.eval_every > 0 && step % train.eval_every == 0) || step == train.steps) {
        BatchSampler val(&*data, Split::val, train.batch, train.model.seq, train.seed);
        const size_t n = size_t(train.batch) * train.model.seq;
        std::vector<int32_t> vtok(n * train.eval_batches), vtgt(n * train.eval_batches);
        for (int b = 0; b < train.eval_batches; ++b) val.next(vtok.data() + b * n, vtgt.data() + b * n);
        auto v = runner->evaluate(step, vtok.data(), vtgt.data(), train.eval_batches);
        if (!v.ok()) {
          result = events.stop_reason().value_or(v.status());
          break;
        }
      }
      cc->send_metrics(step, step_metrics_to_line(runner->take_step_metrics()));
    }
  }
  // Leaving early would make the coordinator report this worker lost to peers still finishing
  // their last step, so every worker first waits for the others at the end barrier.
  if (result.ok()) result = cc->barrier(1, options.receive_timeout);
  cc->leave(result.ok() ? "done" : result.message());
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) == 0)
    LH_LOG_INFO("rank {}: peak resident memory {:.1f} MB", plan.rank, double(usage.ru_maxrss) * 1024 / 1e6);
  return result;
}

}  // namespace lh
