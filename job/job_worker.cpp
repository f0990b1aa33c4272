// One pipeline worker: join → plan → connect → train the stage with live codec changes → leave.
// Used by `longhaul worker` and `longhaul launch`.
#include "job/job_worker.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "comm/peer_probe.h"
#include "core/cuda_runtime.h"
#include "core/dataset.h"
#include "core/log.h"
#include "grid/link_shapes.h"
#include "plan/job_config.h"
#include "runtime/stage_runner.h"
#include "transport/allow_list.h"
#include "transport/control_client.h"

namespace lh {
namespace {

// Control events arrive on a background thread: a lost peer or a shutdown fails the data plane at
// once (so a stage blocked on a receive wakes up); codec changes wait for the next step boundary.
class EventPump {
 public:
  // `on_set_link` runs on the pump's thread for each SetLink (ctl set-link).
  EventPump(ControlClient& cc, DataPlane& plane, std::function<void(const SetLink&)> on_set_link,
            std::function<std::string()> stop_requested)
      : cc_(cc),
        plane_(plane),
        on_set_link_(std::move(on_set_link)),
        stop_requested_(std::move(stop_requested)),
        thread_([this] { run(); }) {}
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
  // The coordinator's preemption: save a checkpoint after this step and stop (−1: none).
  int64_t preempt_step() {
    std::lock_guard<std::mutex> lock(mu_);
    return preempt_ ? preempt_->at_step : -1;
  }
  std::string preempt_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return preempt_ ? preempt_->reason : std::string();
  }

 private:
  void fail_all(const std::string& reason) {
    for (int peer : plane_.peers()) plane_.fail_peer(peer, reason);
  }
  void run() {
    bool asked = false;
    while (!stop_) {
      if (!asked && stop_requested_) {
        const std::string why = stop_requested_();
        if (!why.empty()) {  // once: the coordinator answers every worker's request the same way
          asked = true;
          LH_LOG_WARN("{}: asking the coordinator to checkpoint the job and stop", why);
          cc_.request_preempt(why);
        }
      }
      auto ev = cc_.wait_event(std::chrono::milliseconds(50));
      if (!ev) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (auto* m = std::get_if<SetCodec>(&*ev)) {
        changes_.push_back(*m);
      } else if (auto* p = std::get_if<Preempt>(&*ev)) {
        if (!preempt_) preempt_ = *p;
      } else if (auto* l = std::get_if<SetLink>(&*ev)) {
        if (on_set_link_) on_set_link_(*l);
      } else if (auto* lost = std::get_if<PeerLost>(&*ev)) {
        const std::string why =
            "worker " + std::to_string(lost->rank) + " (" + lost->hostname + ") was lost: " + lost->reason;
        if (!stop_reason_) stop_reason_ = unavailable(why);
        fail_all(why);
      } else if (auto* back = std::get_if<Rollback>(&*ev)) {
        // Replaces any earlier reason: a neighbour's failure that led here is part of the same loss.
        stop_reason_ = aborted("the job rolls back: " + back->reason);
        fail_all("job rolled back: " + back->reason);
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
  std::function<void(const SetLink&)> on_set_link_;
  std::function<std::string()> stop_requested_;
  std::mutex mu_;
  std::deque<SetCodec> changes_;
  std::optional<Preempt> preempt_;
  std::optional<Status> stop_reason_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// LH_FAULT_STALL=STEP:MS (tests only; see run_epoch). Unset: never.
struct FaultStall {
  int64_t after_step = -1;
  int64_t ms = 0;
};
const FaultStall& fault_stall() {
  static const FaultStall f = [] {
    FaultStall r;
    const char* env = std::getenv("LH_FAULT_STALL");
    long long step = 0, ms = 0;
    if (env && std::sscanf(env, "%lld:%lld", &step, &ms) == 2 && step > 0 && ms > 0) r = {step, ms};
    return r;
  }();
  return f;
}

// Fault injection for tests (LH_FAULT_NO_DIRECT=A-B[,C-D…]): the pre-flight takes these pairs as unable to connect
// directly, as NAT between them would make them (the relay is then tested without network namespaces).
bool fault_no_direct(int a, int b) {
  const char* env = std::getenv("LH_FAULT_NO_DIRECT");
  if (!env) return false;
  const std::string list = env;
  for (size_t i = 0; i < list.size();) {
    size_t j = list.find(',', i);
    if (j == std::string::npos) j = list.size();
    int x = -1, y = -1;
    if (std::sscanf(list.substr(i, j - i).c_str(), "%d-%d", &x, &y) == 2 && ((x == a && y == b) || (x == b && y == a)))
      return true;
    i = j + 1;
  }
  return false;
}

// Applies one set-codec message (live, or from a Plan's list) to the runner or the link schedule; refused ones are
// logged. `resumed` is the step the epoch started after: grad and tp changes up to it are in the loaded state.
// Returns the step it applies from (−1: not this worker's), or why it was refused.
Result<int64_t> apply_codec_change(const SetCodec& m, int64_t step, int64_t resumed, int rank, const Topology& topology,
                                   CodecSchedule& codecs, StageRunner& runner) {
  auto refused = [](Status s) {
    LH_LOG_WARN("set-codec ignored: {}", s.message());
    return s;
  };
  if (m.role_wide()) {
    // A grad change naming a pair is for that stage's dp group only; tp changes are for every group.
    if (m.dir == "grad" && m.src >= 0) {
      auto c = topology.checked_coord_of(m.src);
      if (!c.ok()) return refused(c.status());
      if (c->stage != topology.coord_of(rank).stage) return int64_t(-1);
    }
    const int64_t from = m.apply_at_step == -1 ? step : m.apply_at_step;
    if (from <= resumed) return int64_t(-1);
    const bool tp = m.dir == "tp";
    Status s = tp ? runner.schedule_tp_codec(m.spec, from) : runner.schedule_grad_codec(m.spec, from);
    if (!s.ok()) return refused(s);
    LH_LOG_INFO("the {} codec becomes {} from step {}", tp ? "tp shards' partial-sum" : "replicas' gradient", m.spec,
                from);
    return from;
  }
  auto change = codec_change_of(m, topology, codecs);
  if (change.ok() && change->from_step <= codecs.current_step()) {
    // It arrived after its step began here (the coordinator saw this worker's progress late). A link's packets say
    // how they were encoded, so its two ends need not switch at one step: this end switches at its next one, and
    // its acknowledgement says so.
    LH_LOG_INFO("set-codec for step {} arrived after step {} began; it applies from step {} here", change->from_step,
                codecs.current_step(), codecs.current_step() + 1);
    change->from_step = codecs.current_step() + 1;
  }
  Status s = change.ok() ? codecs.schedule_change(*change) : change.status();
  if (!s.ok()) return refused(s);
  LH_LOG_INFO("codec of link {} {} becomes {} from step {}", change->link.name(), link_dir_name(change->dir),
              change->spec, change->from_step);
  return change->from_step;
}

// The TCP ports a worker with an allow-list takes for its data plane when --data-ports names none (UCX listens on one
// per interface it uses, and the advertised listener on one more).
constexpr int kChosenDataPorts = 16;

// The data plane a worker keeps for its whole life (one UCX worker: a rollback runs none of UCX's worker teardown, and
// its address, ports and listener stay the same), and what guards its ports.
struct WorkerPlane {
  std::unique_ptr<UcxDataPlane> ucx;
  DataPortAllowList* allow = nullptr;  // null: no allow-list
  std::vector<int> data_ports;         // the TCP ports the plane listens on (for the allow-list)
  std::set<std::string> own;           // this host's interface addresses
};

// Ends an epoch's transfers on every way out once its plane is connected: no more heartbeats read the plane, the
// shaper's queued packets fail, and the kept plane is reset, letting go of every buffer of the runner's.
struct EpochEnd {
  EpochEnd(ControlClient& c, std::unique_ptr<LinkShaper>& s, UcxDataPlane& u) : cc(c), shaper(s), ucx(u) {}
  EpochEnd(const EpochEnd&) = delete;  // made in place: a copy's end would end the epoch twice
  EpochEnd& operator=(const EpochEnd&) = delete;
  ControlClient& cc;
  std::unique_ptr<LinkShaper>& shaper;
  UcxDataPlane& ucx;
  ~EpochEnd() {
    cc.set_progress_source(nullptr);
    shaper.reset();
    ucx.reset("this worker's epoch ended");
  }
};

// One epoch of the job: join (as `*rank` when it is set), connect, load the plan's state, train until the last step,
// a failure, or a rollback (kAborted: the caller joins again). Its steps, in order: join → connect → shape links →
// build the stage → resume → pre-flight → train → leave. The members are what the steps hand on, declared in the
// order they are made, so they are undone in reverse: `epoch_end_` before the runner whose buffers it frees.
class Epoch {
 public:
  Epoch(const JobWorkerOptions& options, ControlClient& cc, WorkerPlane& wp)
      : options_(options), cc_(cc), wp_(wp), ucx_(*wp.ucx) {}

  Status run(int* rank) {
    bool standby_done = false;
    if (Status s = join(rank, &standby_done); !s.ok() || standby_done) return s;
    if (Status s = connect(); !s.ok()) return s;
    if (Status s = shape_links(); !s.ok()) return s;
    if (Status s = build_stage(); !s.ok()) return s;
    if (plan_.resume_step > 0)
      if (std::optional<Status> failed = resume()) return *failed;
    for (const SetCodec& m : plan_.changes)
      (void)apply_codec_change(m, plan_.resume_step + 1, plan_.resume_step, plan_.rank, *topology_, *codecs_, *runner_);
    log_model_state();
    LH_RETURN_IF_ERROR(cc_.ready(options_.join_timeout));
    if (Status s = preflight(); !s.ok()) return s;
    return leave(train());
  }

 private:
  // Joins the job and reads its plan. `*standby_done`: the job no longer needs this worker (it ends without error).
  Status join(int* rank, bool* standby_done) {
    // The data ports are closed to every other address until the plan names the members (then renewed in connect).
    if (wp_.allow)
      if (Status s = wp_.allow->set(wp_.data_ports, wp_.own); !s.ok()) LH_LOG_WARN("{}", s.message());
    meter_ = std::make_shared<LinkMeter>();
    ucx_.set_meter(meter_);
    // Joining again after a rollback waits as long as the coordinator waits for a replacement; a coordinator that
    // goes silent meanwhile ends the wait.
    const auto join_wait = *rank >= 0
                               ? std::max<std::chrono::milliseconds>(options_.join_timeout, std::chrono::hours(24))
                               : options_.join_timeout;
    auto joined = cc_.join(ucx_.address(), join_wait, *rank >= 0 ? *rank : options_.rank,
                           Bytes(ucx_.data_public_key().begin(), ucx_.data_public_key().end()), local_ciphers());
    if (!joined.ok() && cc_.shutdown_reason() == kJobFinishedReason) {
      LH_LOG_INFO("the job finished without needing this worker (it waited as a standby)");
      *standby_done = true;
      return Status::Ok();
    }
    if (!joined.ok() && cc_.shutdown_reason() == kReplicaDroppedReason) {
      LH_LOG_WARN("rank {}: {}; this worker is done", *rank, kReplicaDroppedReason);
      *standby_done = true;
      return Status::Ok();
    }
    LH_ASSIGN_OR_RETURN(plan_, std::move(joined));
    auto job = JobConfig::from_json(plan_.config);
    if (!job.ok()) return Status(job.status()).prepend("the coordinator's plan");
    job_ = std::move(job).value();
    *rank = plan_.rank;
    if (options_.on_rank) options_.on_rank(plan_.rank);
    LH_ASSIGN_OR_RETURN(topology_, job_.topology());
    LH_ASSIGN_OR_RETURN(partition_, job_.make_partition());
    LH_ASSIGN_OR_RETURN(CodecPlan codec_plan, codec_plan_from_link_codecs(plan_.codecs, *topology_));
    codecs_.emplace(*topology_, codec_plan);
    return Status::Ok();
  }

  // Opens the data ports to the job's members and connects the plane to every peer of the plan.
  Status connect() {
    std::map<int, Bytes> peers;
    DataPlaneSecurity security;
    LH_ASSIGN_OR_RETURN(security.protection, parse_packet_protection(job_.data_protection));
    security.epoch = uint32_t(plan_.epoch);
    for (const PeerInfo& p : plan_.peers) {
      if (p.rank == plan_.rank) continue;
      peers[p.rank] = p.ucx_address;
      if (security.protection == PacketProtection::kNone) continue;
      if (p.data_key.size() != DataKeyPair::kBytes)
        return invalid_argument("the plan has no data-plane key for rank " + std::to_string(p.rank) +
                                " (a worker from before authenticated packets?)");
      auto& k = security.peers[p.rank];
      std::copy(p.data_key.begin(), p.data_key.end(), k.public_key.begin());
      k.ciphers = p.data_ciphers;
    }
    if (wp_.allow && !wp_.data_ports.empty()) open_data_ports();
    const JobConfig::DataPlaneBounds bounds = job_.data_plane_bounds();
    ucx_.set_bounds(bounds.max_packet_bytes, bounds.max_unexpected_bytes);
    LH_RETURN_IF_ERROR(ucx_.connect(plan_.rank, peers, security));
    meter_->set_self_rank(plan_.rank);
    finished_step_ = plan_.resume_step;
    epoch_end_.emplace(cc_, shaper_owned_, ucx_);
    plane_ = &ucx_;
    return Status::Ok();
  }

  void open_data_ports() {
    std::set<std::string> members = wp_.own;
    for (const PeerInfo& p : plan_.peers)
      for (const std::string& a : parse_ip_list(p.interfaces)) members.insert(a);
    Status s = wp_.allow->set(wp_.data_ports, members);
    std::string ports;
    for (int p : wp_.data_ports) ports += (ports.empty() ? "" : ", ") + std::to_string(p);
    if (s.ok())
      LH_LOG_INFO(
          "allow-list: data ports {} open only to the loopback and the {} addresses of the job's members "
          "(nftables table inet {})",
          ports, members.size(), wp_.allow->table());
    else
      LH_LOG_WARN("{}", s.message());
  }

  // Emulated links: this worker's own --link under the job's rules (ctl set-link adds more while it runs). The shaper
  // is this epoch's; the plane under it stays. Heartbeats from here on carry this worker's progress.
  Status shape_links() {
    link_rules_ = job_.links;
    base_ = options_.link.value_or(LinkShape{});
    if (options_.link || !link_rules_.empty()) {
      LH_ASSIGN_OR_RETURN(RankShapes shapes, shapes_of(*topology_, plan_.rank, link_rules_, base_));
      shaper_owned_ = std::make_unique<LinkShaper>(ucx_, shapes.default_shape);
      shaper_owned_->set_shapes(shapes.default_shape, shapes.per_peer);
      shaper_ = shaper_owned_.get();
      plane_ = shaper_;
    }
    // Heartbeats carry this worker's progress (its last step, what its data plane waits on) so the coordinator can
    // name a stalled link; the source goes before the plane does (epoch_end_).
    cc_.set_progress_source([&finished_step = finished_step_, p = plane_] {
      Heartbeat hb;
      hb.step = finished_step.load();
      auto ms = [](std::chrono::milliseconds d) { return uint32_t(std::min<int64_t>(d.count(), UINT32_MAX)); };
      for (const DataPlane::PendingLink& l : p->pending_links(std::chrono::milliseconds(500)))
        hb.pending.push_back(PendingLink{l.peer, l.send, ms(l.pending), ms(l.since_progress)});
      hb.blocked_ms = ms(Transfer::blocked_for());
      return hb;
    });
    return Status::Ok();
  }

  // A SetLink (ctl set-link), on the event pump's thread.
  void reshape(const SetLink& m) {
    if (!shaper_) {
      LH_LOG_WARN("set-link '{}' ignored: this worker does not shape its links", m.rule);
      return;
    }
    link_rules_.push_back(m.rule);
    auto shapes = shapes_of(*topology_, plan_.rank, link_rules_, base_);
    if (!shapes.ok()) {
      link_rules_.pop_back();
      LH_LOG_WARN("set-link refused: {}", shapes.status().message());
      return;
    }
    shaper_->set_shapes(shapes->default_shape, shapes->per_peer);
    LH_LOG_INFO("links reshaped by '{}'", m.rule);
  }

  // The training data and this worker's stage runner.
  Status build_stage() {
    const TrainConfig& train = job_.train;
    auto data = train.data.empty() ? TextDataset::default_corpus(train.model.seq)
                                   : TextDataset::from_file(train.data, train.model.seq);
    if (!data.ok()) return data.status();
    data_.emplace(std::move(data).value());
    sampler_ = BatchSampler(&*data_, Split::train, train.batch, train.model.seq, train.seed);
    StageRunnerOptions ro;
    ro.microbatches = job_.microbatches;
    ro.schedule = job_.schedule;
    LH_ASSIGN_OR_RETURN(std::vector<std::string> grad_specs, job_.grad_specs());
    ro.compress_grad = grad_specs.at(size_t(topology_->coord_of(plan_.rank).stage));
    LH_ASSIGN_OR_RETURN(ro.sync, parse_sync(job_.sync));
    LH_ASSIGN_OR_RETURN(ro.compress_tp, job_.tp_spec());
    LH_ASSIGN_OR_RETURN(ro.tp_heads, job_.tp_heads_split());
    ro.receive_timeout = options_.receive_timeout;
    ro.batch_slices = job_.slices();
    ro.batch_slice = job_.slice_of(topology_->coord_of(plan_.rank).dp);
    LH_ASSIGN_OR_RETURN(ro.dp_rows, job_.dp_rows());
    {
      LH_ASSIGN_OR_RETURN(auto slow, parse_slowdowns(job_.slowdown, topology_->workers()));
      if (slow.count(plan_.rank)) {
        ro.slowdown = slow[plan_.rank];
        LH_LOG_INFO("--slowdown: this worker's compute takes {}x as long", ro.slowdown);
      }
    }
    LH_ASSIGN_OR_RETURN(runner_,
                        StageRunner::create(train, *topology_, *partition_, plan_.rank, ro, *plane_, *codecs_));
    LH_LOG_INFO("stage {} of {}: blocks [{}, {}){}{}", runner_->span().stage, topology_->pp(),
                runner_->span().first_block, runner_->span().end_block(),
                runner_->span().has_embedding ? " + embedding" : "", runner_->span().has_head ? " + head" : "");
    return Status::Ok();
  }

  // Loads the plan's checkpoint shard. Set when it could not: what the epoch ends with.
  std::optional<Status> resume() {
    auto pos = runner_->load_state(std::string(plan_.shard.begin(), plan_.shard.end()));
    Status loaded = pos.ok() ? sampler_.restore(*pos) : pos.status();
    if (!loaded.ok()) {
      // Said, not just exited on: the coordinator sets this checkpoint aside and goes back to an older one (it would
      // otherwise see only a silent worker, and plan the same checkpoint again).
      loaded.prepend("the checkpoint of step " + std::to_string(plan_.resume_step));
      LH_LOG_ERROR("rank {}: {}", plan_.rank, loaded.message());
      return cc_.report_resume_failed(plan_.resume_step, loaded, std::chrono::milliseconds(60000));
    }
    LH_LOG_INFO("rank {}: resumed after step {} (epoch {})", plan_.rank, plan_.resume_step, plan_.epoch);
    return std::nullopt;
  }

  // What tensor parallelism is for: the model state this worker holds (fp32 parameters, gradients and AdamW's two
  // moments), and, at the end, its peak resident memory.
  void log_model_state() {
    const int64_t n = runner_->model().num_params();
    const WorkerCoord me = topology_->coord_of(plan_.rank);
    LH_LOG_INFO(
        "rank {} (stage {}, tp shard {} with {} heads, replica {}): {} parameters; parameters, gradients and "
        "optimizer state {:.2f} MB",
        plan_.rank, me.stage, me.tp, runner_->model().local_heads(), me.dp, n, double(n) * 16 / 1e6);
  }

  // Pre-flight, once every plane is connected (the start barrier). First every pair that must talk tries its direct
  // link (hellos both ways, within connect_timeout); the coordinator answers with the pairs that could not, which go
  // through the job's relay from then on (or it ends the job, naming them, when relays are off). Then every pair
  // measures its link, direct or relayed, before step 1; the coordinator prints the matrix.
  Status preflight() {
    ProbeOptions po;
    po.timeout = std::min<std::chrono::milliseconds>(options_.receive_timeout, std::chrono::seconds(10));
    po.connect_timeout = options_.connect_timeout;
    po.cancelled = [&cc = cc_] { return cc.rolled_back() || cc.shutdown_requested(); };
    const auto probe_t0 = std::chrono::steady_clock::now();
    auto reached = reach_peers(*plane_, *topology_, plan_.rank, po);
    if (!reached.ok() && reached.status().code() == StatusCode::kAborted && !cc_.rolled_back())
      return unavailable("the job ended during the pre-flight: " + cc_.shutdown_reason());
    LH_RETURN_IF_ERROR(reached.status());
    for (PeerProbe& p : *reached)
      if (fault_no_direct(plan_.rank, p.peer)) {
        p.ok = false;
        p.error = "fault injection: LH_FAULT_NO_DIRECT cuts this pair";
      }
    for (const PeerProbe& p : *reached)
      if (!p.ok) LH_LOG_WARN("pre-flight: rank {} cannot reach rank {} directly: {}", plan_.rank, p.peer, p.error);
    LH_ASSIGN_OR_RETURN(Relays relays, cc_.reach(std::move(reached).value(), options_.join_timeout));
    std::set<int> relayed;
    for (size_t i = 0; i < relays.lo.size(); ++i) {
      if (relays.lo[i] == plan_.rank) relayed.insert(relays.hi[i]);
      if (relays.hi[i] == plan_.rank) relayed.insert(relays.lo[i]);
    }
    if (!relayed.empty())
      if (Status s = use_relay(relays, relayed); !s.ok()) return s;
    LH_RETURN_IF_ERROR(cc_.barrier(kRelayBarrier, options_.join_timeout));
    auto probed = probe_peers(*plane_, *topology_, plan_.rank, po);
    if (!probed.ok() && probed.status().code() == StatusCode::kAborted && !cc_.rolled_back())
      return unavailable("the job ended during the pre-flight: " + cc_.shutdown_reason());
    LH_ASSIGN_OR_RETURN(std::vector<PeerProbe> probes, std::move(probed));
    for (PeerProbe& p : probes) p.relayed = relayed.count(p.peer) > 0;
    meter_->reset_counters();  // the probe's bytes are not step 1's traffic (the bandwidth estimates stay)
    for (const PeerProbe& p : probes)
      if (!p.ok) LH_LOG_ERROR("pre-flight: rank {} cannot reach rank {}: {}", plan_.rank, p.peer, p.error);
    LH_LOG_INFO("rank {}: pre-flight of {} peers ({} relayed) in {:.3f} s", plan_.rank, probes.size(), relayed.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - probe_t0).count());
    LH_RETURN_IF_ERROR(cc_.preflight(std::move(probes), options_.join_timeout));
    return Status::Ok();
  }

  // The pairs the pre-flight could not connect directly go through the job's relay.
  Status use_relay(const Relays& relays, const std::set<int>& relayed) {
    RelayClientOptions rc;
    std::string host = relays.host;
    if (host.empty()) {  // the coordinator's host, as this worker reaches it
      auto coordinator = parse_tcp_endpoint(options_.coordinator);
      if (!coordinator.ok())
        return Status(coordinator.status()).prepend("the coordinator '" + options_.coordinator + "'");
      host = coordinator->host;
    }
    rc.endpoint = TcpEndpoint{host, 0}.with_port(int(relays.port));
    rc.token = plan_.relay_token.empty() ? options_.token : plan_.relay_token;  // binds this rank only
    rc.curve = options_.curve;
    LH_RETURN_IF_ERROR(ucx_.use_relay(rc, relayed));
    meter_->set_relayed(relayed);
    return Status::Ok();
  }

  // Why a step failed: a lost neighbour (the coordinator's verdict, waited for a while) explains a failed receive
  // better than the receive itself.
  Status verdict(EventPump& events, const Status& s) {
    // A failed step waits this long for the coordinator's verdict: a lost neighbour (a rollback) or not.
    const auto verdict_wait = std::chrono::milliseconds(plan_.heartbeat_timeout_ms) + std::chrono::seconds(3);
    if (auto why = events.stop_reason()) return *why;
    if (s.code() == StatusCode::kOutOfRange) return s;  // the model's own failure (divergence): no one to wait for
    const auto until = std::chrono::steady_clock::now() + verdict_wait;
    while (std::chrono::steady_clock::now() < until) {
      if (auto why = events.stop_reason()) return *why;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return s;
  }

  // Live codec changes, each acknowledged to the coordinator when it asks.
  void apply_live_changes(EventPump& events, int64_t step) {
    for (const SetCodec& m : events.take_codec_changes()) {
      auto applied = apply_codec_change(m, step, plan_.resume_step, plan_.rank, *topology_, *codecs_, *runner_);
      if (m.id != 0)
        cc_.acknowledge(CodecApplied{plan_.rank, m.id, applied.ok() ? *applied : -1, applied.ok(),
                                     applied.ok() ? "" : applied.status().message()});
    }
  }

  // Validation as `longhaul train` does it: every eval_every steps and after the last, on the same fixed batches (a
  // fresh sampler under the job's seed) every time.
  Status validate(int64_t step) {
    const TrainConfig& train = job_.train;
    BatchSampler val(&*data_, Split::val, train.batch, train.model.seq, train.seed);
    const size_t n = size_t(train.batch) * train.model.seq;
    std::vector<int32_t> vtok(n * train.eval_batches), vtgt(n * train.eval_batches);
    for (int b = 0; b < train.eval_batches; ++b) val.next(vtok.data() + b * n, vtgt.data() + b * n);
    return runner_->evaluate(step, vtok.data(), vtgt.data(), train.eval_batches).status();
  }

  // The step's metrics go to the coordinator; its heartbeats say the step is done.
  void report_step(int64_t step) {
    WorkerStepMetrics m = runner_->take_step_metrics();
    if (ucx_.protection() != PacketProtection::kNone) m.auth_failures = ucx_.auth_failures();
    cc_.send_metrics(step, step_metrics_to_line(m));
    finished_step_ = step;
    if (step == fault_stall().after_step) {
      // Fault injection for tests (LH_FAULT_STALL=STEP:MS): this worker's training thread stops for a while after
      // STEP, its heartbeats going on, as a worker stuck in a driver call or swapping would.
      LH_LOG_WARN("fault injection: stalling for {} ms after step {}", fault_stall().ms, step);
      std::this_thread::sleep_for(std::chrono::milliseconds(fault_stall().ms));
    }
  }

  // Sends this worker's state after `step` to the coordinator; not ok: what the epoch ends with.
  Status save_checkpoint(EventPump& events, int64_t step) {
    auto bytes = runner_->save_state(sampler_.rng());
    if (!bytes.ok()) {
      // Draining --sync delayed's exchanges waits on the replicas: a lost one is the coordinator's to judge.
      return verdict(events, Status(bytes.status()).prepend("checkpoint of step " + std::to_string(step)));
    }
    if (bytes->size() > kMaxShardMessageBytes) {
      return invalid_argument("checkpoint of step " + std::to_string(step) + ": this worker's state is " +
                              std::to_string(bytes->size() >> 20) + " MiB, more than the " +
                              std::to_string(kMaxShardMessageBytes >> 20) +
                              " MiB a control message carries; use more stages or tensor shards");
    }
    cc_.send_shard(step, std::vector<uint8_t>(bytes->begin(), bytes->end()));
    return Status::Ok();
  }

  // Trains from the step after the plan's until the last, a failure, a rollback or a preemption.
  Status train() {
    Status result = Status::Ok();
    EventPump events(
        cc_, *plane_, [this](const SetLink& m) { reshape(m); }, options_.stop_requested);
    if (options_.on_training) options_.on_training(true);
    struct TrainingEnds {
      const JobWorkerOptions& o;
      ~TrainingEnds() {
        if (o.on_training) o.on_training(false);
      }
    } training_ends{options_};
    const TrainConfig& train = job_.train;
    std::vector<int32_t> tokens, targets;
    for (int64_t step = plan_.resume_step + 1; step <= train.steps; ++step) {
      if (auto why = events.stop_reason()) {
        result = *why;
        break;
      }
      apply_live_changes(events, step);
      sampler_.next(&tokens, &targets);
      auto r = runner_->step(step, tokens.data(), targets.data());
      if (!r.ok()) {
        result = verdict(events, r.status());
        break;
      }
      if ((train.eval_every > 0 && step % train.eval_every == 0) || step == train.steps) {
        if (Status v = validate(step); !v.ok()) {
          result = verdict(events, v);
          break;
        }
      }
      report_step(step);
      // Preempted: every worker saves its state after the coordinator's step and stops there. One that is past it (the
      // order came late) saves after this step instead: that checkpoint is incomplete, and the job keeps its last one.
      const int64_t preempt_at = events.preempt_step();
      const bool preempted = preempt_at > 0 && step >= preempt_at && step < train.steps;
      if (preempted && step > preempt_at)
        LH_LOG_ERROR("rank {}: the preemption's step {} has passed; stopping after step {}", plan_.rank, preempt_at,
                     step);
      if (preempted || (job_.checkpoint_every > 0 && (step % job_.checkpoint_every == 0 || step == train.steps))) {
        if (Status s = save_checkpoint(events, step); !s.ok()) {
          result = s;
          break;
        }
      }
      if (preempted) {
        LH_LOG_WARN("rank {}: preempted ({}): saved this worker's state after step {} and stops", plan_.rank,
                    events.preempt_reason(), step);
        break;
      }
    }
    return result;
  }

  // Leaving early would make the coordinator report this worker lost to peers still finishing their last step, so
  // every worker first waits for the others at the end barrier.
  Status leave(Status result) {
    if (result.ok()) result = cc_.barrier(1, options_.receive_timeout);
    if (cc_.shutdown_reason() == kReplicaDroppedReason) {  // told while it was still training
      LH_LOG_WARN("rank {}: {}; this worker is done", plan_.rank, kReplicaDroppedReason);
      return Status::Ok();
    }
    if (result.code() == StatusCode::kAborted) return result;  // no leave: this worker joins the next epoch
    cc_.leave(result.ok() ? "done" : result.message());
    struct rusage usage {};
    if (getrusage(RUSAGE_SELF, &usage) == 0)
      LH_LOG_INFO("rank {}: peak resident memory {:.1f} MB", plan_.rank, double(usage.ru_maxrss) * 1024 / 1e6);
    return result;
  }

  const JobWorkerOptions& options_;
  ControlClient& cc_;
  WorkerPlane& wp_;
  UcxDataPlane& ucx_;
  std::shared_ptr<LinkMeter> meter_;
  Plan plan_;
  JobConfig job_;
  std::optional<Topology> topology_;
  std::optional<Partition> partition_;
  std::optional<CodecSchedule> codecs_;
  std::unique_ptr<LinkShaper> shaper_owned_;
  std::unique_ptr<StageRunner> runner_;
  std::atomic<int64_t> finished_step_{0};
  std::optional<EpochEnd> epoch_end_;  // set once the plane is connected
  LinkShaper* shaper_ = nullptr;       // null: this worker does not shape its links
  DataPlane* plane_ = nullptr;         // the shaper, or the UCX plane itself
  std::vector<std::string> link_rules_;
  LinkShape base_;
  std::optional<TextDataset> data_;
  BatchSampler sampler_;
};

Status run_epoch(const JobWorkerOptions& options, ControlClient& cc, int* rank, WorkerPlane& wp) {
  Epoch epoch(options, cc, wp);
  return epoch.run(rank);
}

}  // namespace

Status run_job_worker(const JobWorkerOptions& options) {
  ControlClientOptions co;
  co.coordinator = options.coordinator;
  co.token = options.token;
  co.curve = options.curve;
  co.hostname = options.hostname;
  co.site = options.site;
  co.compute_speed = options.compute_speed;
  // What UCX puts in its worker address: the interfaces it may use (UCX_NET_DEVICES, or all).
  const char* env_devices = std::getenv("UCX_NET_DEVICES");
  co.data_addresses = interface_addresses(!options.ucx.net_devices.empty()                   ? options.ucx.net_devices
                                          : env_devices && std::string(env_devices) != "all" ? env_devices
                                                                                             : "");
  // What this machine has; the job's plan says which one it trains on (--device of the launch).
  co.device = cuda_available() ? "cuda: " + cuda_device_summary() : "cpu";
  co.coordinator_wait = options.coordinator_timeout;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<ControlClient> cc, ControlClient::connect(co));
  int rank = -1;
  // The allow-list is ready before the plane opens its ports (which are closed to all but the loopback at once), and
  // outlives it: the ports close before the table that guards them goes.
  std::unique_ptr<DataPortAllowList> allow;
  if (options.allow_list && !options.ucx.relay_only) {
    Status ok = DataPortAllowList::available();
    if (ok.ok())
      allow = std::make_unique<DataPortAllowList>();
    else
      LH_LOG_INFO("no allow-list on the data ports ({}): any address that reaches them can talk to UCX", ok.message());
  }
  WorkerPlane wp;
  if (!allow) {
    LH_ASSIGN_OR_RETURN(wp.ucx, UcxDataPlane::create(options.ucx));
  } else {
    // The table guards the ports before UCX opens them (no stranger's byte reaches UCX in between): the --data-ports
    // range, or a free range of this worker's choosing; each epoch then narrows it to the ports UCX listens on.
    wp.allow = allow.get();
    wp.own = parse_ip_list(interface_addresses());
    UcxOptions uo = options.ucx;
    const bool chosen = uo.data_ports.empty();
    for (int attempt = 0; !wp.ucx; ++attempt) {
      if (chosen) {
        auto range = free_tcp_port_range(kChosenDataPorts);
        if (!range.ok()) return Status(range.status()).prepend("the data ports");
        uo.data_ports = std::to_string(range->first) + "-" + std::to_string(range->second);
      }
      LH_ASSIGN_OR_RETURN(auto span, parse_port_range(uo.data_ports));
      std::vector<int> guarded;
      for (int p = span.first; p <= span.second; ++p) guarded.push_back(p);
      if (Status s = allow->set(guarded, wp.own); !s.ok()) LH_LOG_WARN("{}", s.message());
      auto made = UcxDataPlane::create(uo);
      if (made.ok()) {
        wp.ucx = std::move(made).value();
      } else if (!chosen || attempt == 2) {
        return made.status();
      } else {  // another process took ports of the range meanwhile
        LH_LOG_INFO("data ports {}: {}; choosing others", uo.data_ports, made.status().message());
      }
    }
    wp.data_ports = listening_tcp_ports();  // each epoch narrows the table to these (the range guards them until then)
  }
  for (;;) {
    Status s = run_epoch(options, *cc, &rank, wp);
    if (s.code() != StatusCode::kAborted) return s;
    LH_LOG_WARN(
        "rank {}: {}; joining the next epoch on the same UCX worker, address and data ports ({} plan{} ended "
        "on them)",
        rank, s.message(), wp.ucx->resets(), wp.ucx->resets() == 1 ? "" : "s");
  }
}

}  // namespace lh
