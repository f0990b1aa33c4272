// Tests for StageRunner: S-stage pipelines (GPipe and 1F1B) reproduce the single-process trainer's
// losses, codecs compress every link and switch at a step boundary, bad setups are refused, and a
// missing peer is an error naming it. Stages run on threads joined by LocalDataPlane. Label `runtime`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/exec.h"
#include "core/rng.h"
#include "grid/tp_split.h"
#include "metrics/metrics_summary.h"
#include "runtime/stage_runner.h"
#include "runtime/subspace_boundary.h"
#include "tests/common/local_data_plane.h"
#include "tests/common/result_value.h"
#include "transport/link_shaper.h"

namespace lh {
namespace {

// A small deterministic corpus: words drawn from a short list, so the model has something to learn.
std::string corpus_file() {
  static const std::string path = [] {
    const char* words[] = {"the ",  "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ",    "dog ",    "and ",
                           "runs ", "far ",   "away. ", "A ",   "slow ",  "link ", "carries ", "bytes.\n"};
    Rng rng(99);
    std::string text;
    while (text.size() < 120000) text += words[rng.next_u32() % 17];
    std::string p = ::testing::TempDir() + "lh_stage_runner_corpus_" + std::to_string(getpid()) + ".txt";
    std::ofstream(p) << text;
    return p;
  }();
  return path;
}

TrainConfig tiny_config() {
  TrainConfig cfg;
  cfg.model.layers = 4;
  cfg.model.d_model = 32;
  cfg.model.heads = 2;
  cfg.model.seq = 16;
  cfg.batch = 8;
  cfg.steps = 4;
  cfg.warmup = 1;
  cfg.lr = 3e-3f;
  cfg.seed = 7;
  cfg.data = corpus_file();
  return cfg;
}

struct PipelineRun {
  std::vector<float> losses;                            // the last stage's, per step
  std::vector<float> grad_norms;                        // stage 0's (every stage sees the whole model's), per step
  std::vector<std::vector<float>> grad_norms_by_stage;  // every stage's, per step
  std::optional<float> val_loss;                        // the last stage's, after the last step
  std::vector<WorkerStepMetrics> metrics;               // every stage, every step
  std::vector<Status> statuses;                         // per stage
  std::vector<std::vector<float>> replicated;           // per rank: the bits of the slices every tp shard holds whole
};

// Every rank of `run` finished, and its per-step losses and final validation loss equal a one-process reference
// to 1e-5 (relative). `what` names the run in failures.
void expect_reference_losses(const PipelineRun& run, const std::vector<float>& ref, float ref_val,
                             const std::string& what) {
  for (size_t r = 0; r < run.statuses.size(); ++r)
    ASSERT_TRUE(run.statuses[r].ok()) << what << " rank " << r << ": " << run.statuses[r].to_string();
  ASSERT_EQ(run.losses.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref[i], 1e-5 * std::fabs(ref[i])) << what << " step " << i + 1;
  ASSERT_TRUE(run.val_loss.has_value()) << what;
  EXPECT_NEAR(*run.val_loss, ref_val, 1e-5 * ref_val) << what;
}

// The grid and codecs of one threaded run.
struct GridSpec {
  int S = 1, dp = 1, tp = 1;
  std::vector<int> tp_heads;  // empty: even
  std::string tp_codec = "none";
  ScheduleKind kind = ScheduleKind::k1F1B;
  int M = 4;
  std::string fwd = "none", bwd = "none", grad = "none";
  SyncConfig sync;
  int steps = 4;
  int change_at = 0;  // > 0: link 0-1 fwd switches to new_spec at this step
  std::string new_spec;
  // > 0: after this step every rank saves its state, drops its runner and codec schedule, and goes on with fresh
  // ones loaded from the saved bytes (as a worker does after a rollback); `state_bytes` gets each rank's size and
  // `states` (if set) the bytes. With `keep_going` the ranks save and go on with the runner they have (as after a
  // job checkpoint).
  int reload_after = 0;
  bool keep_going = false;
  std::vector<size_t>* state_bytes = nullptr;
  std::vector<std::string>* states = nullptr;
  std::chrono::microseconds delay{0};                    // > 0: every link gets this one-way delay (LinkShaper)
  std::vector<std::vector<Action>>* executed = nullptr;  // if set: each rank's actions in the last step, as run
};

// Bits of every parameter a rank holds, for comparing replicas.
std::vector<float> all_params(Gpt& model) {
  std::vector<float> out;
  for (ParamGroup* g : model.param_groups()) {
    std::vector<float> v = g->params.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Bits of the slices every tensor shard holds whole (layernorms, output biases, embedding, head).
std::vector<float> replicated_params(Gpt& model) {
  std::vector<float> out;
  for (ParamGroup* g : model.param_groups()) {
    std::vector<float> v = g->params.to_vector();
    for (const ParamSlice& sl : g->slices)
      if (sl.tp_replicated) out.insert(out.end(), v.begin() + sl.offset, v.begin() + sl.offset + sl.numel());
  }
  return out;
}

// Runs a pp × tp × dp job on threads: losses, norms and the validation loss as replica 0 sees them.
PipelineRun run_grid(const TrainConfig& cfg, const GridSpec& g, std::vector<std::vector<float>>* params = nullptr) {
  const int S = g.S, W = g.S * g.dp * g.tp, M = g.M, steps = g.steps;
  Topology topo = value_of(Topology::create(W, S, g.tp, g.dp));
  Partition part = value_of(Partition::even(cfg.model.layers, S));
  auto fabric = std::make_shared<LocalFabric>();
  TextDataset data = value_of(TextDataset::from_file(cfg.data, cfg.model.seq));
  PipelineRun run;
  run.statuses.resize(W);
  run.replicated.resize(W);
  run.grad_norms_by_stage.resize(W);
  if (params) params->assign(W, {});
  std::vector<std::vector<float>> losses_by_rank(W);
  std::vector<std::optional<float>> val_by_rank(W);
  std::vector<std::vector<WorkerStepMetrics>> per_stage(W);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < W; ++rank) {
    threads.emplace_back([&, rank] {
      const int change_at = g.change_at;
      const std::string& new_spec = g.new_spec;
      std::unique_ptr<DataPlane> owned = std::make_unique<LocalDataPlane>(fabric, rank, W);
      owned->set_meter(std::make_shared<LinkMeter>(rank));
      if (g.delay.count() > 0) owned = std::make_unique<LinkShaper>(std::move(owned), LinkShape{0, g.delay});
      DataPlane& plane = *owned;
      auto schedule = std::make_unique<CodecSchedule>(topo, value_of(CodecPlan::create(topo, g.fwd, g.bwd, {})));
      StageRunnerOptions opts;
      opts.microbatches = M;
      opts.schedule = g.kind;
      opts.compress_grad = g.grad;
      opts.sync = g.sync;
      opts.compress_tp = g.tp_codec;
      opts.tp_heads = g.tp_heads;
      opts.receive_timeout = std::chrono::seconds(60);
      auto runner = StageRunner::create(cfg, topo, part, rank, opts, plane, *schedule);
      if (!runner.ok()) {
        run.statuses[rank] = runner.status();
        return;
      }
      BatchSampler sampler(&data, Split::train, cfg.batch, cfg.model.seq, cfg.seed);
      std::vector<int32_t> tok, tgt;
      for (int step = 1; step <= steps; ++step) {
        if (step == g.reload_after + 1 && g.reload_after > 0) {
          auto bytes = (*runner)->save_state(sampler.rng());
          if (!bytes.ok()) {
            run.statuses[rank] = bytes.status();
            return;
          }
          if (g.state_bytes) (*g.state_bytes)[size_t(rank)] = bytes->size();
          if (g.states) (*g.states)[size_t(rank)] = *bytes;
          if (!g.keep_going) {
            runner = Result<std::unique_ptr<StageRunner>>(internal_error("dropped"));
            schedule = std::make_unique<CodecSchedule>(topo, value_of(CodecPlan::create(topo, g.fwd, g.bwd, {})));
            // The link codec history comes back from the job (a Plan lists every change); the rest from the bytes.
            if (change_at > 0 && change_at <= g.reload_after && S > 1) {
              EXPECT_TRUE(schedule->schedule_change({PipelineLink{0, 1}, LinkDir::kFwd, new_spec, change_at}).ok());
            }
            runner = StageRunner::create(cfg, topo, part, rank, opts, plane, *schedule);
            Result<Rng> pos = runner.ok() ? (*runner)->load_state(*bytes) : Result<Rng>(runner.status());
            Status s = pos.ok() ? sampler.restore(*pos) : pos.status();
            if (!s.ok()) {
              run.statuses[rank] = s;
              return;
            }
            EXPECT_EQ((*runner)->last_step(), g.reload_after);
          }
        }
        if (step == change_at && S > 1) {
          Status s = schedule->schedule_change({PipelineLink{0, 1}, LinkDir::kFwd, new_spec, step});
          if (!s.ok()) {
            run.statuses[rank] = s;
            return;
          }
        }
        sampler.next(&tok, &tgt);
        auto r = (*runner)->step(step, tok.data(), tgt.data());
        if (!r.ok()) {
          run.statuses[rank] = r.status();
          return;
        }
        if (r->loss) losses_by_rank[rank].push_back(*r->loss);
        if (rank == 0) run.grad_norms.push_back(r->grad_norm);
        run.grad_norms_by_stage[rank].push_back(r->grad_norm);
        if (step == steps) {
          BatchSampler val(&data, Split::val, cfg.batch, cfg.model.seq, cfg.seed);
          const size_t n = size_t(cfg.batch) * cfg.model.seq;
          std::vector<int32_t> vtok(n * cfg.eval_batches), vtgt(n * cfg.eval_batches);
          for (int b = 0; b < cfg.eval_batches; ++b) val.next(vtok.data() + b * n, vtgt.data() + b * n);
          auto v = (*runner)->evaluate(step, vtok.data(), vtgt.data(), cfg.eval_batches);
          if (!v.ok()) {
            run.statuses[rank] = v.status();
            return;
          }
          val_by_rank[rank] = *v;
        }
        per_stage[rank].push_back((*runner)->take_step_metrics());
        if (g.executed) (*g.executed)[size_t(rank)] = (*runner)->last_actions();
      }
      if (params) (*params)[rank] = all_params((*runner)->model());
      run.replicated[rank] = replicated_params((*runner)->model());
    });
  }
  for (auto& t : threads) t.join();
  for (auto& v : per_stage) run.metrics.insert(run.metrics.end(), v.begin(), v.end());
  // The job's loss is the mean of the last stage's replicas, each on its slice (as the metrics summary takes it).
  const int last = topo.rank_of({S - 1, 0, 0});
  run.val_loss = val_by_rank[last];
  for (size_t i = 0; i < losses_by_rank[last].size(); ++i) {
    double sum = 0;
    for (int d = 0; d < g.dp; ++d) sum += losses_by_rank[topo.rank_of({S - 1, 0, d})].at(i);
    run.losses.push_back(float(sum / g.dp));
  }
  // Tensor shards compute the head on the same summed activations: their losses are the same bits.
  for (int r = 0; r < W; ++r) {
    if (topo.coord_of(r).stage != S - 1) continue;
    EXPECT_EQ(losses_by_rank[r], losses_by_rank[topo.rank_of({S - 1, 0, topo.coord_of(r).dp})]) << "rank " << r;
  }
  // Validation is averaged over the replicas inside the job: every replica returns the same value.
  for (int d = 1; d < g.dp; ++d) EXPECT_EQ(val_by_rank[topo.rank_of({S - 1, 0, d})], run.val_loss) << "replica " << d;
  return run;
}

// Runs `steps` steps of an S-stage pipeline; `change_at` > 0 switches link 0-1 fwd to `new_spec` there.
PipelineRun run_pipeline(const TrainConfig& cfg, int S, ScheduleKind kind, int M, const std::string& fwd,
                         const std::string& bwd, int steps, int change_at = 0, const std::string& new_spec = "") {
  GridSpec g;
  g.S = S;
  g.kind = kind;
  g.M = M;
  g.fwd = fwd;
  g.bwd = bwd;
  g.steps = steps;
  g.change_at = change_at;
  g.new_spec = new_spec;
  return run_grid(cfg, g);
}

std::vector<StepStats> reference_steps(const TrainConfig& cfg, int steps, float* val_loss = nullptr) {
  auto trainer = value_of(Trainer::create(cfg));
  std::vector<StepStats> out;
  for (int i = 0; i < steps; ++i) out.push_back(value_of(trainer->step()));
  if (val_loss) *val_loss = value_of(trainer->evaluate());
  return out;
}

// The validation loss of a whole model on the job's fixed validation batches, as Trainer::evaluate takes it.
float reference_val_loss(const TrainConfig& cfg, const TextDataset& data, Gpt& model) {
  BatchSampler val(&data, Split::val, cfg.batch, cfg.model.seq, cfg.seed);
  std::vector<int32_t> tok, tgt;
  ActivationCache cache;
  double total = 0;
  for (int i = 0; i < cfg.eval_batches; ++i) {
    val.next(&tok, &tgt);
    total += value_of(model.forward(cache, tok.data(), tgt.data(), cfg.batch, cfg.model.seq));
  }
  return float(total / cfg.eval_batches);
}

// The async schedule's rule on one process, written out plainly: step t's gradient is taken at the weights of update
// t − 2 (with `predict`, at W_{t−2} + (W_{t−2} − W_{t−3})), clipped, and AdamW applies it to the newest weights,
// W_{t−1}. Per-step losses (at the weights the gradient was taken at), and the final weights' validation loss.
std::vector<float> reference_async_losses(const TrainConfig& cfg, int steps, bool predict, float* val_loss) {
  Gpt cur = value_of(Gpt::create(cfg.model, cfg.device, cfg.seed));
  Gpt stale = value_of(Gpt::create(cfg.model, cfg.device, cfg.seed));
  AdamW opt;
  EXPECT_TRUE(opt.init(cur.param_groups(), cfg.device).ok());
  TextDataset data = value_of(TextDataset::from_file(cfg.data, cfg.model.seq));
  BatchSampler sampler(&data, Split::train, cfg.batch, cfg.model.seq, cfg.seed);
  std::vector<std::vector<float>> versions = {all_params(cur)};  // W_0, W_1, …
  auto load = [](Gpt& m, const std::vector<float>& flat) {
    size_t at = 0;
    for (ParamGroup* g : m.param_groups()) {
      std::vector<float> v(flat.begin() + long(at), flat.begin() + long(at + size_t(g->numel)));
      at += size_t(g->numel);
      EXPECT_TRUE(g->params.copy_from(Tensor::from_vector(v, g->params.shape())).ok());
    }
  };
  std::vector<float> losses;
  std::vector<int32_t> tok, tgt;
  ActivationCache cache;
  for (int t = 1; t <= steps; ++t) {
    const int base = std::max(t - 2, 0);
    std::vector<float> w = versions[size_t(base)];
    if (predict && base >= 1)
      for (size_t k = 0; k < w.size(); ++k) w[k] += w[k] - versions[size_t(base - 1)][k];
    load(stale, w);
    sampler.next(&tok, &tgt);
    EXPECT_TRUE(stale.zero_grad().ok());
    losses.push_back(value_of(stale.forward(cache, tok.data(), tgt.data(), cfg.batch, cfg.model.seq)));
    EXPECT_TRUE(stale.backward(cache).ok());
    std::vector<ParamGroup*> from = stale.param_groups(), to = cur.param_groups();
    for (size_t i = 0; i < to.size(); ++i) EXPECT_TRUE(to[i]->grads.copy_from(from[i]->grads).ok());
    AdamWConfig acfg;
    acfg.lr = lr_at(cfg, t);
    acfg.weight_decay = cfg.weight_decay;
    EXPECT_TRUE(opt.step(cur.exec(), to, acfg, cfg.grad_clip, t).ok());
    versions.push_back(all_params(cur));
  }
  if (val_loss) *val_loss = reference_val_loss(cfg, data, cur);
  return losses;
}

std::vector<float> reference_losses(const TrainConfig& cfg, int steps) {
  std::vector<float> out;
  for (const StepStats& s : reference_steps(cfg, steps)) out.push_back(s.loss);
  return out;
}

// (raw, wire) bytes of every grad-role row: the replicas' gradient traffic.
std::pair<uint64_t, uint64_t> grad_bytes(const MetricsSummary& sum) {
  uint64_t raw = 0, wire = 0;
  for (const LinkTotals& t : sum.links)
    if (t.role == "grad") {
      raw += t.raw_bytes;
      wire += t.wire_bytes;
    }
  return {raw, wire};
}

class StageRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { set_num_threads(1); }
};

TEST_F(StageRunnerTest, PipelinesReproduceTheSingleProcessTrainer) {
  const TrainConfig cfg = tiny_config();
  const int steps = 4;
  float ref_val = 0;
  const std::vector<StepStats> ref_steps = reference_steps(cfg, steps, &ref_val);
  std::vector<float> ref;
  for (const StepStats& s : ref_steps) ref.push_back(s.loss);
  ASSERT_LT(ref.back(), ref.front());                // the reference learns, so the comparison means something
  ASSERT_GT(ref_steps[0].grad_norm, cfg.grad_clip);  // clipping is active: the norm must be the whole model's
  for (int S : {1, 2, 4})
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kEager}) {
      PipelineRun run = run_pipeline(cfg, S, kind, /*M=*/4, "none", "none", steps);
      ASSERT_NO_FATAL_FAILURE(expect_reference_losses(
          run, ref, ref_val, std::string(schedule_kind_name(kind)) + " S=" + std::to_string(S)));
      ASSERT_EQ(run.grad_norms.size(), ref.size());
      for (int i = 0; i < steps; ++i)
        EXPECT_NEAR(run.grad_norms[i], ref_steps[i].grad_norm, 1e-5 * ref_steps[i].grad_norm)
            << schedule_kind_name(kind) << " S=" << S << " step " << i + 1;
      // Every stage clips with the same bits: the parts are summed in one order everywhere.
      for (int s = 1; s < S; ++s) EXPECT_EQ(run.grad_norms_by_stage[s], run.grad_norms_by_stage[0]) << "stage " << s;
    }
}

// Eager over links with delay: the last stage runs each backward right after its forward, stage 0 sends every
// forward before its first gradient can be back, what each stage ran is a valid schedule, and the weights see the
// gradients in the same order as GPipe's: the same bits, and with compressed links too (stream states in order).
TEST_F(StageRunnerTest, EagerRunsWhatHasArrivedWithGPipesBits) {
  const TrainConfig cfg = tiny_config();
  for (const char* codec : {"none", "ef+int4"}) {
    GridSpec g;
    g.S = 4;
    g.M = 4;
    g.steps = 3;
    g.fwd = g.bwd = codec;
    g.delay = std::chrono::milliseconds(30);
    g.kind = ScheduleKind::kGPipe;
    PipelineRun gpipe = run_grid(cfg, g);
    std::vector<std::vector<Action>> ran(4);
    g.kind = ScheduleKind::kEager;
    g.executed = &ran;
    PipelineRun eager = run_grid(cfg, g);
    for (int s = 0; s < 4; ++s) {
      ASSERT_TRUE(gpipe.statuses[s].ok()) << gpipe.statuses[s].to_string();
      ASSERT_TRUE(eager.statuses[s].ok()) << eager.statuses[s].to_string();
    }
    ASSERT_EQ(eager.losses.size(), 3u);
    EXPECT_EQ(eager.losses, gpipe.losses) << codec;
    EXPECT_EQ(eager.grad_norms, gpipe.grad_norms) << codec;
    auto sched = PipelineSchedule::from_lists(ScheduleKind::kEager, 4, ran);
    ASSERT_TRUE(sched.ok()) << sched.status().to_string();
    EXPECT_EQ(ran[3],
              (std::vector<Action>{recv_act(0), forward(0), backward(0), send_grad(0), recv_act(1), forward(1),
                                   backward(1), send_grad(1), recv_act(2), forward(2), backward(2), send_grad(2),
                                   recv_act(3), forward(3), backward(3), send_grad(3), optimizer_step()}))
        << sched->describe();
    // A gradient needs 6 delays (180 ms) to come back to stage 0: all four forwards go out first.
    const std::vector<Action> head(ran[0].begin(), ran[0].begin() + 8);
    EXPECT_EQ(head, (std::vector<Action>{forward(0), send_act(0), forward(1), send_act(1), forward(2), send_act(2),
                                         forward(3), send_act(3)}))
        << sched->describe();
  }
}

// The async schedules against the rule written out on one process: 1, 2 and 4 stages, the last over links with a
// delay (so the two steps really overlap and a stage's order depends on timing), and with weight prediction. The
// result does not depend on timing, only on the rule.
TEST_F(StageRunnerTest, AsyncSchedulesFollowTheStaleWeightRule) {
  TrainConfig cfg = tiny_config();
  const int steps = 6;
  cfg.steps = steps;  // the learning-rate schedule and the runner's last step
  for (ScheduleKind kind : {ScheduleKind::kAsync, ScheduleKind::kAsyncPredict}) {
    const bool predict = kind == ScheduleKind::kAsyncPredict;
    float ref_val = 0;
    const std::vector<float> ref = reference_async_losses(cfg, steps, predict, &ref_val);
    ASSERT_LT(ref.back(), ref.front());
    const TrainConfig& run_cfg = cfg;
    for (int S : {1, 2, 4}) {
      GridSpec g;
      g.S = S;
      g.kind = kind;
      g.steps = steps;
      if (S == 4) g.delay = std::chrono::milliseconds(20);
      PipelineRun run = run_grid(run_cfg, g);
      ASSERT_NO_FATAL_FAILURE(expect_reference_losses(
          run, ref, ref_val, std::string(schedule_kind_name(kind)) + " S=" + std::to_string(S)));
    }
  }
  // Steps 1 and 2 both compute with the initial weights: step 2's loss is not the synchronous one.
  const std::vector<float> sync = reference_losses(cfg, 2);
  const std::vector<float> stale = reference_async_losses(cfg, 2, false, nullptr);
  EXPECT_NEAR(stale[0], sync[0], 1e-6 * sync[0]);
  EXPECT_GT(std::fabs(stale[1] - sync[1]), 1e-3);
}

TEST_F(StageRunnerTest, ReplicasReproduceTheSingleProcessTrainer) {
  const TrainConfig cfg = tiny_config();
  const int steps = 4;
  float ref_val = 0;
  const std::vector<StepStats> ref = reference_steps(cfg, steps, &ref_val);
  ASSERT_LT(ref.back().loss, ref.front().loss);
  for (auto [S, dp] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}}) {
    GridSpec g;
    g.S = S;
    g.dp = dp;
    g.M = 2;
    g.steps = steps;
    std::vector<std::vector<float>> params;
    PipelineRun run = run_grid(cfg, g, &params);
    const std::string what = "pp " + std::to_string(S) + " dp " + std::to_string(dp);
    for (size_t r = 0; r < run.statuses.size(); ++r)
      ASSERT_TRUE(run.statuses[r].ok()) << what << " rank " << r << ": " << run.statuses[r].to_string();
    ASSERT_EQ(run.losses.size(), size_t(steps)) << what;
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(run.losses[i], ref[i].loss, 1e-5 * ref[i].loss) << what << " step " << i + 1;
      EXPECT_NEAR(run.grad_norms[i], ref[i].grad_norm, 1e-5 * ref[i].grad_norm) << what << " step " << i + 1;
    }
    ASSERT_TRUE(run.val_loss.has_value()) << what;
    EXPECT_NEAR(*run.val_loss, ref_val, 1e-5 * ref_val) << what;
    // The replicas of a stage end with the same bits: they applied the same averaged gradients.
    Topology topo = value_of(Topology::create(S * dp, S, 1, dp));
    for (int r = 0; r < S * dp; ++r) {
      const WorkerCoord c = topo.coord_of(r);
      EXPECT_EQ(params[r], params[topo.rank_of({c.stage, 0, 0})]) << what << " rank " << r;
      EXPECT_EQ(run.grad_norms_by_stage[r], run.grad_norms_by_stage[0]) << what << " rank " << r;
    }
    // The gradient exchange is metered as role grad between replicas of a stage, fp32 (`none`).
    MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
    uint64_t grad_bytes = 0;
    for (const LinkTotals& t : sum.links)
      if (t.role == "grad") {
        EXPECT_EQ(topo.coord_of(t.src).stage, topo.coord_of(t.dst).stage) << what;
        EXPECT_GE(t.wire_bytes, t.raw_bytes) << what;  // a packet header on top of fp32
        grad_bytes += t.wire_bytes;
      }
    EXPECT_GT(grad_bytes, 0u) << what;
  }
}

TEST_F(StageRunnerTest, CompressedGradientsKeepReplicasIdenticalAndSendFewerBytes) {
  const TrainConfig cfg = tiny_config();
  const int steps = 4;
  const std::vector<float> ref = reference_losses(cfg, steps);
  for (const std::string spec : {"int8", "ef+int4", "ef+topk:ratio=0.1+int8", "powersgd:rank=2"}) {
    GridSpec g;
    g.S = 2;
    g.dp = 2;
    g.M = 2;
    g.grad = spec;
    g.steps = steps;
    std::vector<std::vector<float>> params;
    PipelineRun run = run_grid(cfg, g, &params);
    for (const Status& st : run.statuses) ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
    for (int i = 0; i < steps; ++i) EXPECT_NEAR(run.losses[i], ref[i], 0.05 * ref[i]) << spec << " step " << i + 1;
    EXPECT_EQ(params[0], params[1]) << spec;  // stage 0's replicas
    EXPECT_EQ(params[2], params[3]) << spec;  // stage 1's replicas
    MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
    auto [raw, wire] = grad_bytes(sum);
    ASSERT_GT(raw, 0u) << spec;
    EXPECT_LT(wire * 3, raw) << spec;
  }
}

// A worker that rolls back to a job checkpoint rebuilds its runner and loads its saved state: the run must go on
// with the same bits as one that never stopped, for every kind of state a stage carries (error feedback on links,
// in the replicas' reducer and in the tp sums, PowerSGD's warm start, DiLoCo's anchor, --sync delayed's averages in
// flight and weight prediction, a live codec change). A worker that saves and goes on (a job checkpoint) must not
// change its run either.
TEST_F(StageRunnerTest, AReloadedStateContinuesWithTheSameBits) {
  TrainConfig cfg = tiny_config();
  // As long as the runs: --sync delayed applies each average D steps late until the last step, which applies every
  // one in flight.
  cfg.steps = 6;
  struct Case {
    const char* what;
    GridSpec g;
  };
  std::vector<Case> cases;
  {
    GridSpec g;
    g.S = 2;
    g.dp = 2;
    g.M = 2;
    g.fwd = "ef+int4";
    g.bwd = "int8";
    g.grad = "ef+int4";
    g.change_at = 2;
    g.new_spec = "ef+int8";
    cases.push_back({"pp2 dp2, ef links and gradients, a change before the reload", g});
    g.change_at = 5;
    cases.push_back({"pp2 dp2, a change after the reload", g});
  }
  {
    GridSpec g;
    g.S = 2;
    g.tp = 2;
    g.M = 2;
    g.fwd = "ef+int8";
    g.tp_codec = "ef+int8";
    cases.push_back({"pp2 tp2, ef partial sums", g});
  }
  {
    GridSpec g;
    g.dp = 2;
    g.M = 2;
    g.grad = "powersgd:rank=2";
    cases.push_back({"dp2 powersgd", g});
    g.grad = "int8";
    g.sync = value_of(parse_sync("diloco:H=2,outer_lr=0.7,outer_momentum=0.9"));
    cases.push_back({"dp2 diloco H=2", g});
  }
  {
    // Warmup 1, so the reload after step 3 has averages in flight: step 3's with D=1, steps 2 and 3's with D=2.
    GridSpec g;
    g.S = 2;
    g.dp = 2;
    g.M = 2;
    g.grad = "ef+int8";
    g.sync = value_of(parse_sync("delayed:D=1"));
    cases.push_back({"pp2 dp2 delayed:D=1, ef+int8 gradients", g});
    g.S = 1;
    g.sync = value_of(parse_sync("delayed:D=2"));
    cases.push_back({"dp2 delayed:D=2, ef+int8 gradients", g});
  }
  for (Case& c : cases) {
    c.g.steps = 6;
    std::vector<std::vector<float>> straight_params, saved_params, reloaded_params;
    PipelineRun straight = run_grid(cfg, c.g, &straight_params);
    const int W = c.g.S * c.g.dp * c.g.tp;
    std::vector<size_t> sizes(size_t(W), 0);
    c.g.reload_after = 3;
    c.g.keep_going = true;
    PipelineRun saved = run_grid(cfg, c.g, &saved_params);
    c.g.keep_going = false;
    c.g.state_bytes = &sizes;
    PipelineRun reloaded = run_grid(cfg, c.g, &reloaded_params);
    for (const Status& st : straight.statuses) ASSERT_TRUE(st.ok()) << c.what << ": " << st.to_string();
    for (const Status& st : saved.statuses) ASSERT_TRUE(st.ok()) << c.what << ": " << st.to_string();
    for (const Status& st : reloaded.statuses) ASSERT_TRUE(st.ok()) << c.what << ": " << st.to_string();
    ASSERT_EQ(reloaded.losses.size(), 6u) << c.what;
    EXPECT_EQ(reloaded.losses, straight.losses) << c.what;
    EXPECT_EQ(reloaded.grad_norms, straight.grad_norms) << c.what;
    EXPECT_EQ(reloaded_params, straight_params) << c.what;
    EXPECT_EQ(saved.losses, straight.losses) << c.what << ", saved and kept going";
    EXPECT_EQ(saved.grad_norms, straight.grad_norms) << c.what << ", saved and kept going";
    EXPECT_EQ(saved_params, straight_params) << c.what << ", saved and kept going";
    for (size_t r = 0; r < sizes.size(); ++r) EXPECT_GT(sizes[r], 0u) << c.what << " rank " << r;
  }
  // The reload is not a no-op: a runner that did not load the state would start over from its initial weights.
  GridSpec g;
  g.S = 2;
  g.steps = 2;
  PipelineRun two = run_grid(cfg, g);
  ASSERT_TRUE(two.statuses[0].ok());
  EXPECT_NE(two.losses[0], two.losses[1]);
}

TEST_F(StageRunnerTest, ABadOrForeignStateIsRefusedNamingWhy) {
  const TrainConfig cfg = tiny_config();
  auto fabric = std::make_shared<LocalFabric>();
  Topology one = value_of(Topology::pipeline(1));
  Topology two = value_of(Topology::pipeline(2));
  LocalDataPlane plane(fabric, 0, 2);
  CodecSchedule codecs1(one, value_of(CodecPlan::create(one, "none", "none", {})));
  CodecSchedule codecs2(two, value_of(CodecPlan::create(two, "none", "none", {})));
  StageRunnerOptions opts;
  opts.microbatches = 2;
  auto a =
      value_of(StageRunner::create(cfg, one, value_of(Partition::even(cfg.model.layers, 1)), 0, opts, plane, codecs1));
  const std::string bytes = value_of(a->save_state(Rng(cfg.seed)));
  auto b =
      value_of(StageRunner::create(cfg, one, value_of(Partition::even(cfg.model.layers, 1)), 0, opts, plane, codecs1));
  const std::vector<float> before = all_params(b->model());
  Result<Rng> bad = b->load_state(bytes.substr(0, bytes.size() / 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not decode"), std::string::npos) << bad.status().message();
  EXPECT_EQ(b->load_state("").status().code(), StatusCode::kCorrupt);
  auto other =
      value_of(StageRunner::create(cfg, two, value_of(Partition::even(cfg.model.layers, 2)), 0, opts, plane, codecs2));
  Result<Rng> foreign = other->load_state(bytes);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("pp 1"), std::string::npos) << foreign.status().message();
  EXPECT_EQ(all_params(b->model()), before);  // nothing was changed by the refused loads
  ASSERT_TRUE(b->load_state(bytes).ok());
  EXPECT_EQ(b->last_step(), 0);
}

// A --sync delayed state holds the averages in flight and the last update the weight prediction extrapolates: a
// runner whose --sync cannot take them refuses the bytes naming why and changes nothing; the same job's takes them.
TEST_F(StageRunnerTest, AForeignDelayedStateIsRefusedNamingWhy) {
  TrainConfig cfg = tiny_config();
  cfg.steps = 6;
  GridSpec g;
  g.dp = 2;
  g.M = 2;
  g.grad = "ef+int8";
  g.sync = value_of(parse_sync("delayed:D=2"));
  g.steps = 4;
  g.reload_after = 3;  // steps 2 and 3 in flight
  g.keep_going = true;
  std::vector<std::string> states(2);
  g.states = &states;
  PipelineRun run = run_grid(cfg, g);
  for (const Status& st : run.statuses) ASSERT_TRUE(st.ok()) << st.to_string();
  Topology topo = value_of(Topology::create(2, 1, 1, 2));
  Partition part = value_of(Partition::even(cfg.model.layers, 1));
  auto fabric = std::make_shared<LocalFabric>();
  LocalDataPlane plane(fabric, 0, 2);
  CodecSchedule codecs(topo, value_of(CodecPlan::create(topo, "none", "none", {})));
  auto runner_with = [&](const std::string& sync) {
    StageRunnerOptions opts;
    opts.microbatches = 2;
    opts.compress_grad = "ef+int8";
    opts.sync = value_of(parse_sync(sync));
    return value_of(StageRunner::create(cfg, topo, part, 0, opts, plane, codecs));
  };
  const std::pair<std::string, std::string> cases[] = {
      {"every-step", "last update of --sync delayed's weight prediction; this job runs --sync every-step"},
      {"delayed:D=2,predict=off", "this job runs --sync delayed:D=2,predict=off"},
      {"delayed:D=1", "2 steps' averages in flight, --sync delayed:D=1 has at most 1"},
  };
  for (const auto& [sync, why] : cases) {
    auto r = runner_with(sync);
    const std::vector<float> before = all_params(r->model());
    Result<Rng> bad = r->load_state(states[0]);
    ASSERT_FALSE(bad.ok()) << sync;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << sync << ": " << bad.status().message();
    EXPECT_EQ(all_params(r->model()), before) << sync;
    EXPECT_EQ(r->last_step(), 0) << sync;
  }
  auto same = runner_with("delayed:D=2");
  Result<Rng> good = same->load_state(states[0]);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(same->last_step(), 3);
}

TEST_F(StageRunnerTest, DilocoWithOneReplicaAndUnitOuterStepIsPlainTraining) {
  // H=1, outer_lr=1, momentum 0: θ_sync − (θ_sync − θ) = θ after every step, so the run must match the
  // single-process trainer; a sign or scale error in the outer step would not.
  const TrainConfig cfg = tiny_config();
  const int steps = 4;
  const std::vector<StepStats> ref = reference_steps(cfg, steps);
  for (int S : {1, 2}) {
    GridSpec g;
    g.S = S;
    g.steps = steps;
    g.sync = value_of(parse_sync("diloco:H=1,outer_lr=1,outer_momentum=0"));
    PipelineRun run = run_grid(cfg, g);
    for (const Status& st : run.statuses) ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(run.losses.size(), size_t(steps));
    for (int i = 0; i < steps; ++i) EXPECT_NEAR(run.losses[i], ref[i].loss, 1e-5 * ref[i].loss) << "S=" << S;
  }
  // With a different outer step the identity breaks: the test above can fail.
  GridSpec g;
  g.steps = steps;
  g.sync = value_of(parse_sync("diloco:H=1,outer_lr=0.5,outer_momentum=0"));
  PipelineRun half = run_grid(cfg, g);
  ASSERT_TRUE(half.statuses[0].ok());
  EXPECT_GT(std::fabs(half.losses[steps - 1] - ref[steps - 1].loss), 1e-3);
}

TEST_F(StageRunnerTest, DilocoReplicasTrainApartAndMeetAtEverySync) {
  TrainConfig cfg = tiny_config();
  cfg.steps = 40;
  cfg.lr = 1e-2f;
  GridSpec g;
  g.S = 1;
  g.dp = 2;
  g.M = 2;
  g.steps = 40;
  g.grad = "int4";
  g.sync = value_of(parse_sync("diloco:H=20,outer_lr=0.7,outer_momentum=0.9"));
  std::vector<std::vector<float>> params;
  PipelineRun run = run_grid(cfg, g, &params);
  for (const Status& st : run.statuses) ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(run.losses.size(), 40u);
  // It trains: the byte-level model starts near ln(256) ≈ 5.5 and must get well below it.
  EXPECT_GT(run.losses.front(), 5.0f);
  ASSERT_TRUE(run.val_loss.has_value());
  EXPECT_LT(*run.val_loss, 3.5f) << "first loss " << run.losses.front();
  // Step 40 is a sync: the replicas hold the same weights.
  EXPECT_EQ(params[0], params[1]);
  // Gradient bytes cross only at the two syncs, int4-compressed.
  MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
  auto [raw, wire] = grad_bytes(sum);
  ASSERT_GT(raw, 0u);
  EXPECT_LT(wire * 6, raw);
  int sync_steps = 0;
  for (const auto& [key, series] : sum.wire_bytes_per_step)
    if (std::get<2>(key) == "grad" && std::get<0>(key) == 0)
      for (const auto& point : series) sync_steps += point.value > 0 ? 1 : 0;
  EXPECT_EQ(sync_steps, 2);
}

// The single-process model trained with delayed updates, written out step by step: the gradient of step t is
// applied at step t + D with the learning rate of step t; during the warmup and at the last step every pending
// gradient is applied. With `predict`, step t's gradient is taken at the weights plus the last update times the
// number of updates pending, and the update goes to the weights themselves. Returns the loss per step; `val_loss`
// after the last.
std::vector<float> reference_delayed_losses(const TrainConfig& cfg, int steps, int D, bool predict, float* val_loss) {
  TextDataset data = value_of(TextDataset::from_file(cfg.data, cfg.model.seq));
  Gpt model = value_of(Gpt::create(cfg.model, Device::cpu, cfg.seed, GptParts{}));
  AdamW opt;
  EXPECT_TRUE(opt.init(model.param_groups(), Device::cpu).ok());
  BatchSampler sampler(&data, Split::train, cfg.batch, cfg.model.seq, cfg.seed);
  ActivationCache cache;
  std::vector<int32_t> tok, tgt;
  std::vector<std::pair<int, std::vector<std::vector<float>>>> pending;  // (step, grads per group)
  std::vector<float> losses;
  std::vector<ParamGroup*> groups = model.param_groups();
  auto weights = [&] {
    std::vector<std::vector<float>> w;
    for (ParamGroup* g : groups) w.push_back(g->params.to_vector());
    return w;
  };
  auto set_weights = [&](const std::vector<std::vector<float>>& w) {
    for (size_t i = 0; i < groups.size(); ++i)
      EXPECT_TRUE(groups[i]->params.copy_from(Tensor::from_vector(w[i], groups[i]->params.shape())).ok());
  };
  std::vector<std::vector<float>> last_update;
  auto apply = [&] {
    auto& [from, grads] = pending.front();
    for (size_t i = 0; i < groups.size(); ++i)
      EXPECT_TRUE(groups[i]->grads.copy_from(Tensor::from_vector(grads[i], groups[i]->grads.shape())).ok());
    AdamWConfig a;
    a.lr = lr_at(cfg, from);
    a.weight_decay = cfg.weight_decay;
    const auto before = weights();
    EXPECT_TRUE(opt.step(model.exec(), groups, a, cfg.grad_clip, from).ok());
    last_update = weights();
    for (size_t i = 0; i < groups.size(); ++i)
      for (size_t k = 0; k < before[i].size(); ++k) last_update[i][k] -= before[i][k];
    pending.erase(pending.begin());
  };
  for (int t = 1; t <= steps; ++t) {
    sampler.next(&tok, &tgt);
    EXPECT_TRUE(model.zero_grad().ok());
    const auto real = weights();
    if (predict && !pending.empty()) {
      auto w = real;
      for (size_t i = 0; i < w.size(); ++i)
        for (size_t k = 0; k < w[i].size(); ++k) w[i][k] += float(pending.size()) * last_update[i][k];
      set_weights(w);
    }
    losses.push_back(value_of(model.forward(cache, tok.data(), tgt.data(), cfg.batch, cfg.model.seq)));
    EXPECT_TRUE(model.backward(cache).ok());
    set_weights(real);
    std::vector<std::vector<float>> grads;
    for (ParamGroup* g : groups) grads.push_back(g->grads.to_vector());
    pending.emplace_back(t, std::move(grads));
    const bool all = t <= cfg.warmup || t == steps;
    while (!pending.empty() && (all || pending.front().first <= t - D)) apply();
  }
  *val_loss = reference_val_loss(cfg, data, model);
  return losses;
}

TEST_F(StageRunnerTest, DelayedAveragingAppliesEachStepsGradientDStepsLater) {
  TrainConfig cfg = tiny_config();
  const int steps = 6;
  cfg.steps = steps;
  cfg.warmup = 2;  // steps 1 and 2 apply their own averages
  for (auto [D, predict] : {std::pair{1, false}, std::pair{1, true}, std::pair{2, true}}) {
    float ref_val = 0;
    const std::vector<float> ref = reference_delayed_losses(cfg, steps, D, predict, &ref_val);
    for (auto [S, dp] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}}) {
      GridSpec g;
      g.S = S;
      g.dp = dp;
      g.M = 2;
      g.steps = steps;
      g.sync = value_of(parse_sync("delayed:D=" + std::to_string(D) + (predict ? "" : ",predict=off")));
      std::vector<std::vector<float>> params;
      PipelineRun run = run_grid(cfg, g, &params);
      const std::string what = "D=" + std::to_string(D) + (predict ? " predict" : "") + " pp " + std::to_string(S) +
                               " dp " + std::to_string(dp);
      ASSERT_EQ(ref.size(), size_t(steps));
      ASSERT_NO_FATAL_FAILURE(expect_reference_losses(run, ref, ref_val, what));
      // After the warmup, the first D steps apply nothing: their norms are reported as 0; the others are real.
      for (int t = 1; t <= steps; ++t)
        EXPECT_EQ(run.grad_norms[t - 1] == 0, t > cfg.warmup && t <= cfg.warmup + D) << what << " step " << t;
      Topology topo = value_of(Topology::create(S * dp, S, 1, dp));
      for (int r = 0; r < S * dp; ++r)
        EXPECT_EQ(params[r], params[topo.rank_of({topo.coord_of(r).stage, 0, 0})]) << what << " rank " << r;
    }
  }
  // The references differ from each other and from every-step training after the warmup, so the test above can tell
  // them apart.
  const std::vector<float> sync = reference_losses(cfg, steps);
  float unused = 0;
  const std::vector<float> plain = reference_delayed_losses(cfg, steps, 1, false, &unused),
                           predicted = reference_delayed_losses(cfg, steps, 1, true, &unused);
  for (int i = 0; i <= cfg.warmup; ++i) EXPECT_NEAR(plain[i], sync[i], 1e-5 * sync[i]) << "step " << i + 1;
  EXPECT_GT(std::fabs(sync[3] - plain[3]), 1e-4);
  EXPECT_GT(std::fabs(predicted[4] - plain[4]), 1e-4);
}

TEST_F(StageRunnerTest, DelayedCompressedAveragingSendsHalfTheBytesOverTheMesh) {
  // dp 4, `none`: every-step averages these small buckets directly (each replica sends its bucket to 3 others);
  // --sync delayed takes the mesh (2·3/4 of a bucket per replica). With ef+int4 it still trains and the replicas
  // stay bit-equal.
  TrainConfig cfg = tiny_config();
  cfg.steps = 4;
  auto run = [&](const std::string& sync, const std::string& grad, std::vector<std::vector<float>>* params) {
    GridSpec g;
    g.dp = 4;
    g.M = 2;
    g.steps = 4;
    g.grad = grad;
    g.sync = value_of(parse_sync(sync));
    PipelineRun r = run_grid(cfg, g, params);
    for (const Status& st : r.statuses) EXPECT_TRUE(st.ok()) << sync << " " << grad << ": " << st.to_string();
    return r;
  };
  std::vector<std::vector<float>> params;
  auto [raw_direct, wire_direct] =
      grad_bytes(value_of(summarize_step_metrics(run("every-step", "none", &params).metrics)));
  auto [raw_mesh, wire_mesh] =
      grad_bytes(value_of(summarize_step_metrics(run("delayed:D=1", "none", &params).metrics)));
  ASSERT_GT(wire_direct, 0u);
  EXPECT_NEAR(double(wire_mesh) / double(wire_direct), 0.5, 0.02);
  PipelineRun c = run("delayed:D=1", "ef+int4", &params);
  auto [raw_c, wire_c] = grad_bytes(value_of(summarize_step_metrics(c.metrics)));
  EXPECT_LT(wire_c * 6, wire_mesh);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(params[r], params[0]) << "replica " << r;
  float ref_val = 0;
  reference_delayed_losses(cfg, 4, 1, true, &ref_val);
  ASSERT_TRUE(c.val_loss.has_value());
  EXPECT_NEAR(*c.val_loss, ref_val, 0.05 * ref_val);
}

TEST(SyncConfigTest, ParsesAndNamesBadParts) {
  EXPECT_FALSE(value_of(parse_sync("every-step")).diloco());
  SyncConfig d = value_of(parse_sync("diloco"));
  EXPECT_TRUE(d.diloco());
  EXPECT_EQ(d.H, 50);
  SyncConfig e = value_of(parse_sync("diloco:H=20,outer_lr=0.5,outer_momentum=0"));
  EXPECT_EQ(e.H, 20);
  EXPECT_EQ(e.outer_lr, 0.5);
  EXPECT_EQ(e.outer_momentum, 0.0);
  EXPECT_EQ(e.to_string(), "diloco:H=20,outer_lr=0.5,outer_momentum=0");
  SyncConfig l = value_of(parse_sync("delayed"));
  EXPECT_TRUE(l.delayed());
  EXPECT_EQ(l.D, 1);
  EXPECT_TRUE(l.predict);
  EXPECT_EQ(value_of(parse_sync("delayed:D=3")).to_string(), "delayed:D=3");
  EXPECT_EQ(value_of(parse_sync("delayed:predict=off,D=2")).to_string(), "delayed:D=2,predict=off");
  EXPECT_FALSE(check_grad_codec_spec("powersgd:rank=4", l).ok());
  EXPECT_TRUE(check_grad_codec_spec("ef+int4", l).ok());
  for (auto [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"sometimes", "unknown kind 'sometimes'"},
           {"diloco:H=0", "H must be an integer >= 1"},
           {"diloco:H=x", "H must be an integer >= 1"},
           {"diloco:H=2.5", "H must be an integer >= 1"},
           {"diloco:outer_lr=-1", "outer_lr must be a number > 0"},
           {"diloco:outer_momentum=1", "outer_momentum must be in [0, 1)"},
           {"diloco:speed=3", "unknown key 'speed'"},
           {"diloco:H", "'H' is not KEY=VALUE"},
           {"delayed:D=0", "D must be an integer in 1..8"},
           {"delayed:D=9", "D must be an integer in 1..8"},
           {"delayed:H=2", "delayed has no key 'H'"},
           {"delayed:predict=yes", "predict is on or off"},
           {"diloco:D=2", "diloco has no key 'D'"},
       }) {
    auto r = parse_sync(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  }
}

TEST_F(StageRunnerTest, CompressedLinksCarryFewerBytesAndSwitchAtAStep) {
  const TrainConfig cfg = tiny_config();
  const int steps = 4;
  const std::vector<float> ref = reference_losses(cfg, steps);
  PipelineRun run = run_pipeline(cfg, 2, ScheduleKind::k1F1B, 4, "int8", "bf16", steps, /*change_at=*/3, "int4");
  for (const Status& s : run.statuses) ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(run.losses.size(), size_t(steps));
  for (int i = 0; i < steps; ++i) EXPECT_NEAR(run.losses[i], ref[i], 0.05 * ref[i]) << "step " << i + 1;
  MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
  const int64_t raw_per_step = 4LL * 2 * 16 * 32 * 4;  // M microbatches of [2, 16, 32] fp32
  bool saw_act = false, saw_grad = false;
  for (const LinkTotals& t : sum.links) {
    EXPECT_EQ(t.counted_by, "send");
    if (t.role == "other") {  // the gradient-norm exchange (a double per step each way) and evaluation
      if (t.src == 1)
        EXPECT_EQ(t.wire_bytes, uint64_t(8 * steps));
      else
        EXPECT_GT(t.wire_bytes, uint64_t(8 * steps));
      continue;
    }
    EXPECT_EQ(t.raw_bytes, uint64_t(raw_per_step * steps)) << t.role;
    if (t.role == "act") {
      saw_act = true;
      EXPECT_LT(t.wire_bytes * 3, t.raw_bytes);  // int8, then int4
      EXPECT_EQ(t.codecs, (std::vector<std::string>{"int8", "int4"}));
    }
    if (t.role == "act_grad") {
      saw_grad = true;
      EXPECT_LT(t.wire_bytes * 19 / 10, t.raw_bytes);  // bf16: about half
      EXPECT_EQ(t.codecs, (std::vector<std::string>{"bf16"}));
    }
  }
  EXPECT_TRUE(saw_act && saw_grad);
  ASSERT_EQ(sum.codec_switches.size(), 1u);
  EXPECT_EQ(sum.codec_switches[0].step, 3);
  // The activation link's wire bytes per step drop at step 3 (int4 packets are about half of int8).
  const auto& wire = sum.wire_bytes_per_step.at(LinkKey{0, 1, "act"});
  ASSERT_EQ(wire.size(), size_t(steps));
  EXPECT_EQ(wire[0].value, wire[1].value);
  EXPECT_LT(wire[2].value * 1.5, wire[1].value);
}

TEST_F(StageRunnerTest, RefusesBadSetups) {
  TrainConfig cfg = tiny_config();
  auto fabric = std::make_shared<LocalFabric>();
  LocalDataPlane plane(fabric, 0, 2);
  Topology two = value_of(Topology::pipeline(2));
  CodecSchedule codecs(two, value_of(CodecPlan::create(two, "none", "none", {})));
  StageRunnerOptions opts;
  auto expect = [&](Result<std::unique_ptr<StageRunner>> r, const std::string& says) {
    ASSERT_FALSE(r.ok()) << says;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  };
  expect(StageRunner::create(cfg, two, value_of(Partition::even(4, 3)), 0, opts, plane, codecs), "has 3 stages");
  expect(StageRunner::create(cfg, two, value_of(Partition::even(6, 2)), 0, opts, plane, codecs), "covers 6 blocks");
  expect(StageRunner::create(cfg, two, value_of(Partition::even(4, 2)), 2, opts, plane, codecs), "rank 2");
  opts.microbatches = 3;
  expect(StageRunner::create(cfg, two, value_of(Partition::even(4, 2)), 0, opts, plane, codecs),
         "does not split into 1 replicas × 3 equal microbatches");
  opts.microbatches = 4;
  Topology grid = value_of(Topology::create(4, 2, 2, 1));
  opts.tp_heads = {3, 1};  // the model has 2 heads
  expect(StageRunner::create(cfg, grid, value_of(Partition::even(4, 2)), 0, opts, plane, codecs),
         "does not give 2 shards at least one of the 2 heads");
  opts.tp_heads = {};
  opts.schedule = ScheduleKind::kEager;
  expect(StageRunner::create(cfg, grid, value_of(Partition::even(4, 2)), 0, opts, plane, codecs),
         "the eager schedule lets each tp shard choose its order");
  opts.schedule = ScheduleKind::k1F1B;
  Topology four = value_of(Topology::create(4, 1, 4, 1));
  expect(StageRunner::create(cfg, four, value_of(Partition::even(4, 1)), 0, opts, plane, codecs),
         "--tp 4 needs at least one head per shard, but the model has 2 heads");
  TrainConfig sub = cfg;
  sub.model.subspace_k = 8;
  expect(StageRunner::create(sub, grid, value_of(Partition::even(4, 2)), 0, opts, plane, codecs),
         "does not support a subspace model");
  opts.microbatches = 512;
  TrainConfig big = cfg;
  big.batch = 512;
  expect(StageRunner::create(big, grid, value_of(Partition::even(4, 2)), 0, opts, plane, codecs),
         "use fewer --microbatches or more stages");
  // A live gradient-codec switch is checked against the job's --sync, as the flags are: PowerSGD cannot follow
  // delayed averaging, so the switch is refused when it is asked for, not at the step it would apply.
  opts = StageRunnerOptions{};
  opts.microbatches = 2;
  opts.sync = value_of(parse_sync("delayed:D=1"));
  LocalDataPlane solo(fabric, 0, 1);
  Topology one = value_of(Topology::pipeline(1));
  CodecSchedule one_codecs(one, value_of(CodecPlan::create(one, "none", "none", {})));
  auto runner = value_of(StageRunner::create(cfg, one, value_of(Partition::even(4, 1)), 0, opts, solo, one_codecs));
  Status s = runner->schedule_grad_codec("powersgd:rank=4", 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--sync delayed does not wait for"), std::string::npos) << s.message();
  EXPECT_TRUE(runner->schedule_grad_codec("int8", 2).ok());
}

// A tp grid on threads: tiny_config with 4 heads.
TrainConfig tp_config() {
  TrainConfig cfg = tiny_config();
  cfg.model.heads = 4;
  return cfg;
}

TEST_F(StageRunnerTest, TensorShardsReproduceTheSingleProcessTrainer) {
  const TrainConfig cfg = tp_config();
  const int steps = 4;
  float ref_val = 0;
  const std::vector<StepStats> ref = reference_steps(cfg, steps, &ref_val);
  ASSERT_LT(ref.back().loss, ref.front().loss);
  ASSERT_GT(ref[0].grad_norm, cfg.grad_clip);  // clipping is active: the norm must be the whole model's
  struct Case {
    int S, tp, dp;
    std::vector<int> heads;
  };
  for (const Case& c :
       {Case{1, 2, 1, {}}, Case{1, 4, 1, {}}, Case{1, 2, 1, {3, 1}}, Case{2, 2, 1, {}}, Case{2, 2, 2, {}}}) {
    GridSpec g;
    g.S = c.S;
    g.tp = c.tp;
    g.dp = c.dp;
    g.tp_heads = c.heads;
    g.M = 2;
    g.steps = steps;
    PipelineRun run = run_grid(cfg, g);
    const std::string what = "pp " + std::to_string(c.S) + " tp " + std::to_string(c.tp) + " dp " +
                             std::to_string(c.dp) + (c.heads.empty() ? "" : " split " + tp_split_string(c.heads));
    for (size_t r = 0; r < run.statuses.size(); ++r)
      ASSERT_TRUE(run.statuses[r].ok()) << what << " rank " << r << ": " << run.statuses[r].to_string();
    ASSERT_EQ(run.losses.size(), size_t(steps)) << what;
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(run.losses[i], ref[i].loss, 1e-5 * ref[i].loss) << what << " step " << i + 1;
      EXPECT_NEAR(run.grad_norms[i], ref[i].grad_norm, 1e-5 * ref[i].grad_norm) << what << " step " << i + 1;
    }
    ASSERT_TRUE(run.val_loss.has_value()) << what;
    EXPECT_NEAR(*run.val_loss, ref_val, 1e-5 * ref_val) << what;
    Topology topo = value_of(Topology::create(c.S * c.tp * c.dp, c.S, c.tp, c.dp));
    for (int r = 0; r < topo.workers(); ++r) {
      const WorkerCoord w = topo.coord_of(r);
      // Shards hold the replicated parameters with the same bits, and every worker clips with one norm.
      EXPECT_EQ(run.replicated[r], run.replicated[topo.rank_of({w.stage, 0, 0})]) << what << " rank " << r;
      EXPECT_EQ(run.grad_norms_by_stage[r], run.grad_norms_by_stage[0]) << what << " rank " << r;
    }
    // Partial sums are metered as role tp, only between shards of one stage replica.
    MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
    uint64_t tp_bytes = 0;
    for (const LinkTotals& t : sum.links)
      if (t.role == "tp") {
        const WorkerCoord a = topo.coord_of(t.src), b = topo.coord_of(t.dst);
        EXPECT_TRUE(a.stage == b.stage && a.dp == b.dp && a.tp != b.tp) << what << " " << t.src << "->" << t.dst;
        tp_bytes += t.wire_bytes;
      }
    EXPECT_GT(tp_bytes, 0u) << what;
    // A pipeline link carries each activation once, in tp slices; the shards relay their slice to each other.
    uint64_t pipeline_raw = 0, relayed_raw = 0;
    for (const LinkTotals& t : sum.links) {
      if (t.role != "act") continue;
      const WorkerCoord a = topo.coord_of(t.src), b = topo.coord_of(t.dst);
      (a.stage == b.stage ? relayed_raw : pipeline_raw) += t.raw_bytes;
    }
    const uint64_t activations = uint64_t(steps) * cfg.batch * cfg.model.seq * cfg.model.d_model * 4 * (c.S - 1);
    EXPECT_EQ(pipeline_raw, activations) << what;
    EXPECT_EQ(relayed_raw, activations * (c.tp - 1)) << what;
  }
}

// int8 on the tp role trains within 2% of none at equal steps (validation loss after 40 steps).
TEST_F(StageRunnerTest, Int8PartialSumsTrainLikeUncompressed) {
  TrainConfig cfg = tp_config();
  cfg.steps = 40;
  GridSpec g;
  g.tp = 2;
  g.M = 2;
  g.steps = cfg.steps;
  PipelineRun none = run_grid(cfg, g);
  g.tp_codec = "int8";
  PipelineRun int8 = run_grid(cfg, g);
  for (const Status& st : none.statuses) ASSERT_TRUE(st.ok()) << st.to_string();
  for (const Status& st : int8.statuses) ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(none.val_loss && int8.val_loss);
  ASSERT_LT(*none.val_loss, 0.8 * none.losses.front());  // it trained, so the comparison means something
  EXPECT_NEAR(*int8.val_loss, *none.val_loss, 0.02 * *none.val_loss);
  EXPECT_NE(*int8.val_loss, *none.val_loss);  // the codec was really in the sums
}

TEST_F(StageRunnerTest, CompressedPartialSumsKeepShardsIdenticalAndSendFewerBytes) {
  const TrainConfig cfg = tp_config();
  const int steps = 4;
  const std::vector<float> ref = reference_losses(cfg, steps);
  for (const std::string spec : {"int8", "ef+int4", "bf16", "lowrank:rank=4+int8"}) {
    GridSpec g;
    g.S = 2;
    g.tp = 2;
    g.M = 2;
    g.tp_codec = spec;
    g.fwd = g.bwd = "int8";  // the pipeline's slices are compressed too; every shard decodes all of them alike
    g.steps = steps;
    PipelineRun run = run_grid(cfg, g);
    for (const Status& st : run.statuses) ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
    ASSERT_EQ(run.losses.size(), size_t(steps)) << spec;
    for (int i = 0; i < steps; ++i) EXPECT_NEAR(run.losses[i], ref[i], 0.05 * ref[i]) << spec << " step " << i + 1;
    // Every shard decoded the same bytes into the same sums, so the replicated parameters stay bit-equal.
    EXPECT_EQ(run.replicated[1], run.replicated[0]) << spec;
    EXPECT_EQ(run.replicated[3], run.replicated[2]) << spec;
    MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
    uint64_t raw = 0, wire = 0;
    for (const LinkTotals& t : sum.links)
      if (t.role == "tp") {
        raw += t.raw_bytes;
        wire += t.wire_bytes;
        EXPECT_EQ(t.codecs, std::vector<std::string>{spec});
      }
    EXPECT_GT(raw, 0u) << spec;
    EXPECT_LT(wire, raw) << spec;
    // The sums keep their [tokens, d_model] shape on the wire, so a matrix codec factors them.
    if (spec.rfind("lowrank", 0) == 0) {
      EXPECT_LT(wire * 8, raw) << spec;
    }
  }
}

TEST_F(StageRunnerTest, AMissingPeerIsAnErrorNamingIt) {
  TrainConfig cfg = tiny_config();
  auto fabric = std::make_shared<LocalFabric>();
  LocalDataPlane plane(fabric, 0, 2);
  Topology two = value_of(Topology::pipeline(2));
  CodecSchedule codecs(two, value_of(CodecPlan::create(two, "none", "none", {})));
  StageRunnerOptions opts;
  opts.microbatches = 2;
  auto runner = value_of(StageRunner::create(cfg, two, value_of(Partition::even(4, 2)), 0, opts, plane, codecs));
  // Stage 1 never runs; the control plane reports it dead while stage 0 waits for its gradient.
  std::thread reporter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    plane.fail_peer(1, "heartbeat timeout");
  });
  TextDataset data = value_of(TextDataset::from_file(cfg.data, cfg.model.seq));
  BatchSampler sampler(&data, Split::train, cfg.batch, cfg.model.seq, cfg.seed);
  std::vector<int32_t> tok, tgt;
  sampler.next(&tok, &tgt);
  auto r = runner->step(1, tok.data(), tgt.data());
  reporter.join();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("waiting for the activation gradient of microbatch 0 from rank 1"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("heartbeat timeout"), std::string::npos) << r.status().message();
}

TEST_F(StageRunnerTest, SubspaceCoordinatesRebuildTheResidualStream) {
  GptConfig cfg = tiny_config().model;
  cfg.subspace_k = 8;
  Gpt model = value_of(Gpt::create(cfg, Device::cpu, 5));
  SubspaceBoundary b = value_of(SubspaceBoundary::create(model));
  const int B = 2, T = cfg.seq;
  std::vector<int32_t> tok(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 37) % 256;
  Tensor tokens = Tensor::empty({B * T}, DType::i32);
  std::copy(tok.begin(), tok.end(), tokens.data<int32_t>());
  ActivationCache cache;
  Tensor x = value_of(model.embed_forward(cache, tok.data(), Device::cpu, B, T));
  x = value_of(model.blocks_forward(0, 2, cache, x));  // a stage boundary inside the subspace blocks
  Tensor c = value_of(b.to_coords(x, tokens));
  EXPECT_EQ(c.shape(), (Shape{B, T, 8}));
  Tensor back = value_of(b.from_coords(c, tokens));
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) worst = std::max(worst, double(std::fabs(back.at(i) - x.at(i))));
  EXPECT_LT(worst, 1e-5);
  // A tensor outside F + span(U) does not survive: the check above can fail.
  Tensor noise = Tensor::empty({B, T, cfg.d_model});
  Rng rng(3);
  for (int64_t i = 0; i < noise.numel(); ++i) noise.at(i) = rng.normal();
  Tensor lost = value_of(b.from_coords(value_of(b.to_coords(noise, tokens)), tokens));
  double diff = 0;
  for (int64_t i = 0; i < noise.numel(); ++i) diff = std::max(diff, double(std::fabs(lost.at(i) - noise.at(i))));
  EXPECT_GT(diff, 0.1);
  // Gradients: g·U then ·Uᵀ is the projection, idempotent.
  Tensor g1 = value_of(b.grad_from_coords(value_of(b.grad_to_coords(noise))));
  Tensor g2 = value_of(b.grad_from_coords(value_of(b.grad_to_coords(g1))));
  for (int64_t i = 0; i < g1.numel(); ++i) ASSERT_NEAR(g1.at(i), g2.at(i), 1e-5);
  EXPECT_FALSE(b.to_coords(c, tokens).ok());  // wrong width
  GptConfig plain = cfg;
  plain.subspace_k = 0;
  EXPECT_FALSE(SubspaceBoundary::create(value_of(Gpt::create(plain, Device::cpu, 5))).ok());
}

TEST_F(StageRunnerTest, SubspacePipelinesSendKValuesPerTokenAndMatchTheSingleProcessRun) {
  TrainConfig cfg = tiny_config();
  cfg.model.subspace_k = 8;
  const int steps = 3, M = 4;
  const std::vector<float> ref = reference_losses(cfg, steps);
  for (int S : {2, 4}) {
    PipelineRun run = run_pipeline(cfg, S, ScheduleKind::k1F1B, M, "none", "none", steps);
    for (const Status& s : run.statuses) ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(run.losses.size(), ref.size());
    for (int i = 0; i < steps; ++i)
      EXPECT_NEAR(run.losses[i], ref[i], 1e-5 * std::fabs(ref[i])) << "S=" << S << " step " << i + 1;
    MetricsSummary sum = value_of(summarize_step_metrics(run.metrics));
    const uint64_t tokens = uint64_t(steps) * cfg.batch * cfg.model.seq;
    for (const LinkTotals& t : sum.links) {
      if (t.role == "other") continue;
      // K fp32 values per token plus one packet header per microbatch, instead of d_model values.
      EXPECT_EQ(t.raw_bytes, tokens * cfg.model.d_model * 4) << t.role;
      EXPECT_GE(t.wire_bytes, tokens * 8 * 4) << t.role;
      EXPECT_LE(t.wire_bytes, tokens * 8 * 4 + uint64_t(steps) * M * 256) << t.role;
    }
  }
}

}  // namespace
}  // namespace lh
