// The planner: a step-time model of a GPT job on a Cluster, and a search over grids, placements, partitions,
// microbatches, schedules and pipeline codecs.
#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include "comm/collective_algo.h"
#include "comm/sync_config.h"
#include "compress/codec_chain.h"
#include "grid/link_name.h"
#include "grid/link_shapes.h"
#include "grid/pipeline_sim.h"
#include "grid/topology.h"
#include "plan/auto_codec.h"

namespace lh {
namespace {

// AdamW touches each parameter's value, gradient and two moments: memory-bound. Counted as this many FLOPs per
// parameter at the worker's GFLOP/s (`bench train` on this kind of machine: the optimizer takes about as long as
// 100 FLOPs per parameter of the step's GEMMs).
constexpr double kOptimizerFlopsPerParam = 100;

struct ModelCosts {
  double C = 0, T = 0, V = 0, heads = 0;
  double block_params = 0, embed_params = 0, head_params = 0;
  double block_fwd_flops = 0, head_fwd_flops = 0;  // per token
};

ModelCosts model_costs(const GptConfig& m) {
  ModelCosts c;
  c.C = m.d_model;
  c.T = m.seq;
  c.V = m.vocab;
  c.heads = m.heads;
  c.block_params = 12 * c.C * c.C + 13 * c.C;
  c.embed_params = c.V * c.C + c.T * c.C;
  c.head_params = (m.tied_head ? 0 : c.V * c.C) + 2 * c.C;
  // Matmuls 2 FLOPs per weight; causal attention QKᵀ and att·V over T/2 keys on average (as Gpt counts them).
  c.block_fwd_flops = 2 * (12 * c.C * c.C) + 2 * c.T * c.C;
  c.head_fwd_flops = 2 * c.V * c.C;
  return c;
}

// Packet sizes by (spec, values per row, rows); specs are parsed once.
class PacketSizes {
 public:
  Result<double> bytes(const std::string& spec, int64_t rows, int64_t cols) {
    auto key = std::make_tuple(spec, rows, cols);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    auto chain = compress::parse_codec_spec(spec);
    if (!chain.ok()) return invalid_argument("codec '" + spec + "': " + chain.status().message());
    LH_ASSIGN_OR_RETURN(size_t b, chain->packet_bytes(Shape{rows, cols}));
    cache_[key] = double(b);
    return double(b);
  }

 private:
  std::map<std::tuple<std::string, int64_t, int64_t>, double> cache_;
};

// Everything an evaluation holds fixed.
struct Setup {
  int pp = 1, tp = 1, dp = 1, M = 1;
  ScheduleKind kind = ScheduleKind::k1F1B;
  std::vector<int> counts;
  std::vector<std::string> fwd, bwd;
  std::string grad = "none", tpc = "none";
  std::vector<int> worker_of_rank;
  std::vector<double> slowdown;  // per rank; compute takes this many times as long
  std::vector<int> dp_rows;      // --dp-split: sequences per replica (empty: equal)
  int sync_every = 1;            // DiLoCo: the replicas exchange every H steps
  bool delayed = false;          // delayed sync: the all-reduce overlaps the next step
};

struct Model {
  const Cluster& cluster;
  const TrainConfig& train;
  ModelCosts mc;
  PacketSizes sizes;

  int rank_of(const Setup& s, int stage, int d, int t) const {
    return Topology::rank_in_grid(s.tp, s.dp, {stage, t, d});
  }
  int w(const Setup& s, int rank) const { return s.worker_of_rank[size_t(rank)]; }

  // Slowest pair (bandwidth) and latest pair (latency) among the directed pairs (rank a → rank b), remembered by the
  // cluster workers they name: a search asks again for the same groups under every partition, codec and microbatch.
  std::map<std::vector<int>, std::pair<double, double>> worst_cache;
  std::pair<double, double> worst(const Setup& s, const std::vector<std::pair<int, int>>& pairs) {
    std::vector<int> key{-1};
    for (const auto& [a, b] : pairs) key.insert(key.end(), {w(s, a), w(s, b)});
    auto it = worst_cache.find(key);
    if (it != worst_cache.end()) return it->second;
    double bw = 1e300, lat = 0;
    for (const auto& [a, b] : pairs) {
      bw = std::min(bw, cluster.bandwidth(w(s, a), w(s, b)));
      lat = std::max(lat, cluster.latency(w(s, a), w(s, b)));
    }
    return worst_cache[key] = {bw, lat};
  }
  // The same over every ordered pair of a group of ranks.
  std::pair<double, double> worst_in_group(const Setup& s, const std::vector<int>& ranks) {
    std::vector<int> key{-2};
    for (int r : ranks) key.push_back(w(s, r));
    auto it = worst_cache.find(key);
    if (it != worst_cache.end()) return it->second;
    double bw = 1e300, lat = 0;
    for (int a : ranks)
      for (int b : ranks)
        if (a != b) {
          bw = std::min(bw, cluster.bandwidth(w(s, a), w(s, b)));
          lat = std::max(lat, cluster.latency(w(s, a), w(s, b)));
        }
    return worst_cache[key] = {bw, lat};
  }
  // All-reduce of `bytes` (one member's whole tensor on the wire) among n members, each pair its own link.
  static double all_reduce_s(double bytes, int n, double bw, double lat) {
    if (n <= 1) return 0;
    if (auto_picks_direct(n, bytes)) return bytes * 8 / bw + lat;
    return 2 * (bytes / n) * 8 / bw + 2 * lat;
  }

  // What step()'s parts compute and hand on.
  struct StepWork {
    int64_t rows_max = 0;  // tokens of the largest replica's microbatch
    PipelineCosts costs;
    double wire = 0;
    std::vector<double> stage_params, stage_speed;
    double worst_dp = 0;
    int worst_dp_stage = -1;
  };

  // The predicted step of setup `s`: compute and tp collectives per stage, pipeline links, the simulated schedule,
  // the replicas' all-reduce, the gradient norm, memory, and the bottleneck.
  Result<JobPlan> step(const Setup& s) {
    JobPlan p = plan_of(s);
    const int S = s.pp;
    StepWork work;
    for (int d = 0; d < s.dp; ++d) work.rows_max = std::max(work.rows_max, rows_of(s, d));
    work.costs.stage_forward.assign(S, 0);
    work.costs.stage_backward.assign(S, 0);
    work.costs.fwd_transfer.assign(size_t(std::max(0, S - 1)), 0);
    work.costs.bwd_transfer = work.costs.fwd_transfer;
    work.costs.fwd_latency = work.costs.fwd_transfer;
    work.costs.bwd_latency = work.costs.fwd_transfer;
    work.stage_params.assign(S, 0);
    work.stage_speed.assign(S, 0);
    for (int st = 0; st < S; ++st) LH_RETURN_IF_ERROR(stage_compute(s, st, work));
    LH_RETURN_IF_ERROR(pipeline_link_costs(s, work));
    work.costs.optimizer = 0;
    LH_ASSIGN_OR_RETURN(PipelineSchedule sched, PipelineSchedule::build(s.kind, S, s.M));
    LH_ASSIGN_OR_RETURN(PipelineSimResult sim, simulate_pipeline(sched, work.costs));
    p.pipeline_s = sim.makespan;
    p.bubble = sim.bubble_fraction;
    p.stage_forward_s = work.costs.stage_forward;
    p.stage_backward_s = work.costs.stage_backward;
    p.fwd_transfer_s = work.costs.fwd_transfer;
    p.bwd_transfer_s = work.costs.bwd_transfer;
    LH_ASSIGN_OR_RETURN(double end, replica_sync_end(s, sim, work, p));
    p.norm_s = grad_norm_s(s);
    p.step_s = end + p.norm_s + p.optimizer_s;
    p.tokens_per_s = double(train.batch) * mc.T / p.step_s;
    p.wire_bytes = work.wire;
    p.memory_gb = memory_gb(s, work);
    p.bottleneck = bottleneck(s, work, p.step_s);
    return p;
  }

  // The plan's description of setup `s` (its grid, partition, schedule and codecs), before any cost.
  static JobPlan plan_of(const Setup& s) {
    JobPlan p;
    p.pp = s.pp;
    p.tp = s.tp;
    p.dp = s.dp;
    p.worker_of_rank = s.worker_of_rank;
    p.partition = s.counts;
    p.microbatches = s.M;
    p.schedule = s.kind;
    p.fwd_codec = s.fwd;
    p.bwd_codec = s.bwd;
    p.grad_codec = s.grad;
    p.tp_codec = s.tpc;
    return p;
  }

  // Tokens of one microbatch of replica d (--dp-split: its share).
  int64_t rows_of(const Setup& s, int d) const {
    const int seqs = s.dp_rows.empty() ? train.batch / s.dp : s.dp_rows[size_t(d)];
    return int64_t(seqs / s.M) * int64_t(mc.T);
  }

  // Stage st's forward and backward per microbatch: its slowest replica, each paced by its slowest shard (a shard does
  // 1/tp of the work), with its tp collectives; its parameters per shard and the speed its optimizer runs at.
  Status stage_compute(const Setup& s, int st, StepWork& work) {
    const int S = s.pp;
    const int blocks = s.counts[size_t(st)];
    double fwd_flops = blocks * mc.block_fwd_flops;
    double params = blocks * mc.block_params;
    if (st == 0) params += mc.embed_params;
    if (st == S - 1) {
      fwd_flops += mc.head_fwd_flops;
      params += mc.head_params;
    }
    work.stage_params[size_t(st)] = params / s.tp;
    double fwd = 0, bwd = 0, slowest_all = 1e300, slowdown_all = 1;
    for (int d = 0; d < s.dp; ++d) {
      const int64_t rows_mb = rows_of(s, d);
      double slowest = 1e300;
      for (int t = 0; t < s.tp; ++t) {
        const int r = rank_of(s, st, d, t);
        const double g = cluster.worker(w(s, r)).gflops / s.slowdown[size_t(r)];
        slowest = std::min(slowest, g);
        if (g < slowest_all) {
          slowest_all = g;
          slowdown_all = s.slowdown[size_t(r)];
        }
      }
      const double f = fwd_flops / s.tp * double(rows_mb) / (slowest * 1e9);
      double tp_fwd = 0, tp_bwd = 0;
      if (s.tp > 1) LH_RETURN_IF_ERROR(tp_costs(s, st, d, blocks, rows_mb, &tp_fwd, &tp_bwd, &work.wire));
      fwd = std::max(fwd, f + tp_fwd);
      bwd = std::max(bwd, 2 * f + tp_bwd);
    }
    work.stage_speed[size_t(st)] = slowest_all * slowdown_all;  // without --slowdown: the optimizer is not slowed
    work.costs.stage_forward[size_t(st)] = fwd;
    work.costs.stage_backward[size_t(st)] = bwd;
    return Status::Ok();
  }

  // Two all-reduces of the partial sums per block forward and two backward, on the critical path, and the relay of
  // each received pipeline slice to the shard's tp peers (stage st, replica d); their bytes are added to `wire`.
  Status tp_costs(const Setup& s, int st, int d, int blocks, int64_t rows_mb, double* tp_fwd, double* tp_bwd,
                  double* wire) {
    const int S = s.pp;
    const int64_t C = int64_t(mc.C);
    std::vector<int> group;
    for (int t = 0; t < s.tp; ++t) group.push_back(rank_of(s, st, d, t));
    auto [bw, lat] = worst_in_group(s, group);
    LH_ASSIGN_OR_RETURN(double bytes, sizes.bytes(s.tpc, rows_mb, C));
    const double ar = all_reduce_s(bytes, s.tp, bw, lat);
    double relay_f = 0, relay_b = 0;
    if (st > 0) {
      LH_ASSIGN_OR_RETURN(double sb, sizes.bytes(s.fwd[size_t(st - 1)], (rows_mb + s.tp - 1) / s.tp, C));
      relay_f = sb * 8 / bw + lat;
    }
    if (st < S - 1) {
      LH_ASSIGN_OR_RETURN(double sb, sizes.bytes(s.bwd[size_t(st)], (rows_mb + s.tp - 1) / s.tp, C));
      relay_b = sb * 8 / bw + lat;
    }
    *tp_fwd = 2 * blocks * ar + relay_f;
    *tp_bwd = 2 * blocks * ar + relay_b;
    // Per microbatch: each member sends its tensor to every other (direct) or 2(n−1)/n of it (mesh).
    const double per_ar = auto_picks_direct(s.tp, bytes) ? bytes * (s.tp - 1) : 2 * bytes * (s.tp - 1) / s.tp;
    *wire += s.M * (4 * blocks * per_ar * s.tp);
    return Status::Ok();
  }

  // Pipeline links: each shard of each replica sends its slice to the same shard of the next stage.
  Status pipeline_link_costs(const Setup& s, StepWork& work) {
    const int S = s.pp;
    const int64_t C = int64_t(mc.C);
    PipelineCosts& costs = work.costs;
    for (int st = 0; st + 1 < S; ++st) {
      std::vector<std::pair<int, int>> fw, bw_pairs;
      for (int d = 0; d < s.dp; ++d)
        for (int t = 0; t < s.tp; ++t) {
          fw.push_back({rank_of(s, st, d, t), rank_of(s, st + 1, d, t)});
          bw_pairs.push_back({rank_of(s, st + 1, d, t), rank_of(s, st, d, t)});
        }
      const int64_t rows = (work.rows_max + s.tp - 1) / s.tp;  // the largest replica's slice
      LH_ASSIGN_OR_RETURN(double fb, sizes.bytes(s.fwd[size_t(st)], rows, C));
      LH_ASSIGN_OR_RETURN(double bb, sizes.bytes(s.bwd[size_t(st)], rows, C));
      auto [fbw, flat] = worst(s, fw);
      auto [bbw, blat] = worst(s, bw_pairs);
      costs.fwd_transfer[size_t(st)] = fb * 8 / fbw;
      costs.fwd_latency[size_t(st)] = flat;
      costs.bwd_transfer[size_t(st)] = bb * 8 / bbw;
      costs.bwd_latency[size_t(st)] = blat;
      work.wire += double(s.M) * (fb + bb) * s.dp * s.tp;
    }
    return Status::Ok();
  }

  // The replicas' all-reduce per stage shard, bucketed during the last backward: what outlasts it is exposed. Sets
  // p's dp_exposed_s and optimizer_s and work's worst_dp; returns when the last stage is done with both.
  Result<double> replica_sync_end(const Setup& s, const PipelineSimResult& sim, StepWork& work, JobPlan& p) {
    const int S = s.pp;
    const int64_t C = int64_t(mc.C);
    double end = 0;
    for (int st = 0; st < S; ++st) {
      double exposed = 0;
      if (s.dp > 1) {
        const int64_t n = int64_t(std::ceil(work.stage_params[size_t(st)]));
        const int64_t rows = std::max<int64_t>(1, (n + C - 1) / C);
        LH_ASSIGN_OR_RETURN(double bytes, sizes.bytes(s.grad, rows, C));
        double ar = 0;
        for (int t = 0; t < s.tp; ++t) {
          std::vector<int> group;
          for (int d = 0; d < s.dp; ++d) group.push_back(rank_of(s, st, d, t));
          auto [bw, lat] = worst_in_group(s, group);
          ar = std::max(ar, all_reduce_s(bytes, s.dp, bw, lat));
        }
        const double per_member = auto_picks_direct(s.dp, bytes) ? bytes * (s.dp - 1) : 2 * bytes * (s.dp - 1) / s.dp;
        work.wire += per_member * s.dp * s.tp / s.sync_every;
        if (s.delayed) {
          exposed = std::max(0.0, ar - sim.makespan);
        } else {
          exposed = std::max(0.0, ar - work.costs.stage_backward[size_t(st)]) / s.sync_every;
        }
        if (ar / s.sync_every > work.worst_dp) {
          work.worst_dp = ar / s.sync_every;
          work.worst_dp_stage = st;
        }
      }
      end = std::max(end, sim.finish[size_t(st)] + exposed);
      p.dp_exposed_s = std::max(p.dp_exposed_s, exposed);
      p.optimizer_s = std::max(p.optimizer_s, work.stage_params[size_t(st)] * kOptimizerFlopsPerParam /
                                                  (work.stage_speed[size_t(st)] * 1e9));
    }
    return end;
  }

  // The gradient norm: every worker of a replica sends its partial square sum to every other (one hop).
  double grad_norm_s(const Setup& s) {
    double norm = 0;
    if (s.pp * s.tp > 1 && train.grad_clip > 0) {
      for (int d = 0; d < s.dp; ++d) {
        std::vector<int> group;
        for (int st = 0; st < s.pp; ++st)
          for (int t = 0; t < s.tp; ++t) group.push_back(rank_of(s, st, d, t));
        norm = std::max(norm, worst_in_group(s, group).second);
      }
    }
    return norm;
  }

  // Memory: weights, gradients and AdamW's two moments (fp32), and the activations of the microbatches in flight.
  double memory_gb(const Setup& s, const StepWork& work) const {
    const int S = s.pp;
    double gb = 0;
    for (int st = 0; st < S; ++st) {
      const double in_flight = s.kind == ScheduleKind::k1F1B ? std::min(S - st, s.M) : s.M;  // gpipe, eager: all M
      double act = s.counts[size_t(st)] * double(work.rows_max) * (16 * mc.C / s.tp + 2 * (mc.heads / s.tp) * mc.T);
      if (st == S - 1) act += 2 * double(work.rows_max) * mc.V;
      gb = std::max(gb, (16 * work.stage_params[size_t(st)] + 4 * in_flight * act) / 1e9);
    }
    return gb;
  }

  // The bottleneck: the resource busiest over the step.
  static std::string bottleneck(const Setup& s, const StepWork& work, double step_s) {
    const int S = s.pp;
    const PipelineCosts& costs = work.costs;
    std::string out;
    double busiest = 0;
    for (int st = 0; st < S; ++st) {
      const double b = s.M * (costs.stage_forward[size_t(st)] + costs.stage_backward[size_t(st)]);
      if (b > busiest) busiest = b, out = "stage " + std::to_string(st) + " compute";
    }
    for (int st = 0; st + 1 < S; ++st) {
      const std::string name = std::to_string(st) + "-" + std::to_string(st + 1);
      if (s.M * costs.fwd_transfer[size_t(st)] > busiest)
        busiest = s.M * costs.fwd_transfer[size_t(st)], out = "link " + name + " fwd";
      if (s.M * costs.bwd_transfer[size_t(st)] > busiest)
        busiest = s.M * costs.bwd_transfer[size_t(st)], out = "link " + name + " bwd";
    }
    if (work.worst_dp > busiest)
      busiest = work.worst_dp, out = "dp all-reduce of stage " + std::to_string(work.worst_dp_stage);
    if (busiest < 0.5 * step_s) out = "latency and the pipeline's fill and drain (" + out + " busiest)";
    return out;
  }
};

// Moves single blocks across stage boundaries while the predicted step gets shorter; s.counts ends at the best found.
Result<JobPlan> improve_partition(Model& m, Setup& s) {
  LH_ASSIGN_OR_RETURN(JobPlan best, m.step(s));
  int layers = 0;
  for (int c : s.counts) layers += c;
  for (int iter = 0; iter < 4 * layers; ++iter) {
    bool moved = false;
    for (int b = 0; b + 1 < s.pp && !moved; ++b)
      for (int dir : {-1, 1}) {
        Setup t = s;
        t.counts[size_t(b)] += dir;
        t.counts[size_t(b + 1)] -= dir;
        if (t.counts[size_t(b)] < 1 || t.counts[size_t(b + 1)] < 1) continue;
        LH_ASSIGN_OR_RETURN(JobPlan cand, m.step(t));
        if (cand.step_s < best.step_s * (1 - 1e-9)) {
          best = std::move(cand);
          s.counts = t.counts;
          moved = true;
          break;
        }
      }
    if (!moved) break;
  }
  return best;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string join(const std::vector<int>& v, char sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? std::string(1, sep) : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

std::string JobPlan::describe() const {
  std::ostringstream o;
  o << "pp " << pp << " · tp " << tp << " · dp " << dp << ", partition " << join(partition, ',') << ", " << microbatches
    << " microbatches (" << schedule_kind_name(schedule) << ")";
  if (!fwd_codec.empty()) {
    o << ", codecs";
    for (size_t l = 0; l < fwd_codec.size(); ++l)
      o << " " << l << "-" << l + 1 << " " << fwd_codec[l] << (fwd_codec[l] == bwd_codec[l] ? "" : "/" + bwd_codec[l]);
  }
  if (dp > 1) o << ", grad " << grad_codec;
  if (tp > 1) o << ", tp " << tp_codec;
  return o.str();
}

namespace {

// The cluster with the job's --link rules on top, as the emulation does: a rate caps the link, a delay adds to it.
Result<Cluster> cluster_with_link_rules(const Cluster& cluster, const JobConfig& job, const Topology& topo) {
  Cluster c = cluster;
  if (!job.links.empty())
    for (int r = 0; r < job.workers; ++r) {
      LH_ASSIGN_OR_RETURN(RankShapes sh, shapes_of(topo, r, job.links));
      for (int peer = 0; peer < job.workers; ++peer) {
        if (peer == r) continue;
        auto it = sh.per_peer.find(peer);
        const LinkShape& shape = it != sh.per_peer.end() ? it->second : sh.default_shape;
        double bw = cluster.bandwidth(r, peer), lat = cluster.latency(r, peer);
        if (shape.rate_bps > 0) bw = std::min(bw, shape.rate_bps);
        lat += std::chrono::duration<double>(shape.delay).count();
        c.set_link(r, peer, bw, lat);
      }
    }
  return c;
}

// The job's setup as it asks for it: grid, slowdowns, partition (by speed when auto_partition), replica rows, codecs
// (`autos`: the pipeline links whose codec is auto) and sync.
Result<Setup> setup_of(const Cluster& c, const JobConfig& job, bool auto_partition,
                       std::vector<std::pair<PipelineLink, LinkDir>>* autos) {
  Setup s;
  s.pp = job.pp;
  s.tp = job.tp;
  s.dp = job.dp;
  s.M = job.microbatches;
  s.kind = job.schedule;
  s.slowdown.assign(size_t(job.workers), 1.0);
  LH_ASSIGN_OR_RETURN(auto slow, parse_slowdowns(job.slowdown, job.workers));
  for (const auto& [rank, f] : slow) s.slowdown[size_t(rank)] = f;
  for (int r = 0; r < job.workers; ++r) s.worker_of_rank.push_back(r);
  if (job.partition == "speed" || auto_partition) {
    std::vector<double> speeds;
    for (int r = 0; r < job.workers; ++r) speeds.push_back(c.worker(r).gflops / s.slowdown[size_t(r)]);
    JobConfig by_speed = job;
    by_speed.partition = "speed";
    LH_ASSIGN_OR_RETURN(std::string planned, by_speed.planned_partition(speeds));
    LH_ASSIGN_OR_RETURN(Partition part, Partition::parse(planned, job.train.model.layers, job.pp));
    s.counts = part.counts();
  } else {
    LH_ASSIGN_OR_RETURN(Partition part, job.make_partition());
    s.counts = part.counts();
  }
  if (job.tp > 1 && job.tp_split != "" && job.tp_split != "even")
    return invalid_argument("plan: --tp-split " + job.tp_split +
                            " is not modelled yet (the planner splits heads evenly)");
  if (job.dp_split == "speed") {
    std::vector<double> speeds;
    for (int r = 0; r < job.workers; ++r) speeds.push_back(c.worker(r).gflops / s.slowdown[size_t(r)]);
    JobConfig planned = job;
    LH_ASSIGN_OR_RETURN(planned.dp_split, job.planned_dp_split(speeds));
    LH_ASSIGN_OR_RETURN(s.dp_rows, planned.dp_rows());
  } else {
    LH_ASSIGN_OR_RETURN(s.dp_rows, job.dp_rows());
  }
  LH_ASSIGN_OR_RETURN(std::vector<std::string> grad, job.grad_specs());
  s.grad = grad.empty() ? job.compress_grad : grad[0];
  LH_ASSIGN_OR_RETURN(s.tpc, job.tp_spec());
  LH_ASSIGN_OR_RETURN(SyncConfig sync, parse_sync(job.sync));
  if (sync.diloco()) s.sync_every = sync.H;
  s.delayed = sync.delayed();
  if (job.dp > 1 && s.grad.rfind("powersgd", 0) == 0)
    return invalid_argument(
        "plan: --compress-grad powersgd is not modelled yet (its two rounds are not a codec chain)");
  // Codecs: the plan's, with "auto" links settled as auto settles.
  LH_ASSIGN_OR_RETURN(*autos, job.auto_links());
  LH_ASSIGN_OR_RETURN(CodecPlan codecs, job.codec_plan());
  for (const PipelineLink& l : codecs.links()) {
    s.fwd.push_back(codecs.spec(l, LinkDir::kFwd));
    s.bwd.push_back(codecs.spec(l, LinkDir::kBwd));
  }
  return s;
}

// The auto links chosen together by the predicted step, as auto decides in a running job: the fastest codecs, then
// each link on the least lossy codec that keeps the step within --auto-tolerance of the fastest's.
Status settle_auto_links(Model& m, Setup& s, const JobConfig& job,
                         const std::vector<std::pair<PipelineLink, LinkDir>>& autos) {
  LH_ASSIGN_OR_RETURN(std::vector<std::string> ladder, parse_auto_ladder(job.auto_ladder));
  auto apply = [&](const std::vector<int>& choice) {
    for (size_t k = 0; k < autos.size(); ++k)
      (autos[k].second == LinkDir::kFwd ? s.fwd : s.bwd)[size_t(autos[k].first.from)] = ladder[size_t(choice[k])];
  };
  auto step_of = [&](const std::vector<int>& choice) -> Result<double> {
    apply(choice);
    LH_ASSIGN_OR_RETURN(JobPlan p, m.step(s));
    return p.step_s;
  };
  LH_ASSIGN_OR_RETURN(JointChoice jc,
                      choose_jointly(std::vector<int>(autos.size(), int(ladder.size())),
                                     std::vector<int>(autos.size(), 0), step_of, 1.0, job.auto_tolerance));
  apply(jc.index);
  return Status::Ok();
}

// An auto gradient codec settles like auto links: the least lossy of its ladder whose exchange (the slowest stage
// group's) fits under --auto-fit of the pace; one codec for every group here.
Status settle_auto_grad(Model& m, Setup& s, const JobConfig& job) {
  LH_ASSIGN_OR_RETURN(std::vector<std::string> ladder, parse_auto_grad_ladder(job.auto_grad_ladder));
  LH_ASSIGN_OR_RETURN(JobPlan base, m.step(s));
  double pace = 0;
  for (int st = 0; st < s.pp; ++st)
    pace = std::max(pace, base.stage_forward_s[size_t(st)] + base.stage_backward_s[size_t(st)]);
  std::vector<uint64_t> bytes(ladder.size(), 0);
  double bw = 1e300;
  for (int st = 0; st < s.pp; ++st) {
    LH_ASSIGN_OR_RETURN(double params, stage_parameters(job, st));
    std::vector<int> group;
    for (int d = 0; d < s.dp; ++d) group.push_back(m.rank_of(s, st, d, 0));
    bw = std::min(bw, m.worst_in_group(s, group).first);
    for (size_t i = 0; i < ladder.size(); ++i) {
      LH_ASSIGN_OR_RETURN(
          double b, m.sizes.bytes(ladder[i], std::max<int64_t>(1, int64_t(params) / int64_t(m.mc.C)), int64_t(m.mc.C)));
      const double per_pair = auto_picks_direct(s.dp, b) ? b : 2 * b / s.dp;
      bytes[i] = std::max(bytes[i], uint64_t(per_pair));
    }
  }
  s.grad = ladder[size_t(choose_auto_codec(bytes, 0, bw, pace, 1.0, job.auto_fit).index)];
  return Status::Ok();
}

// An auto tp codec: the least lossy of its ladder whose step is within 5% of the fastest's (as auto decides).
Status settle_auto_tp(Model& m, Setup& s, const JobConfig& job) {
  LH_ASSIGN_OR_RETURN(std::vector<std::string> ladder, parse_auto_tp_ladder(job.auto_tp_ladder));
  std::vector<double> steps;
  for (const std::string& spec : ladder) {
    s.tpc = spec;
    LH_ASSIGN_OR_RETURN(JobPlan p, m.step(s));
    steps.push_back(p.step_s);
  }
  const double fastest = *std::min_element(steps.begin(), steps.end());
  for (size_t i = 0; i < ladder.size(); ++i)
    if (steps[i] <= 1.05 * fastest) {
      s.tpc = ladder[i];
      break;
    }
  return Status::Ok();
}

Result<JobPlan> evaluate_job(const Cluster& cluster, const JobConfig& job, bool auto_partition) {
  LH_RETURN_IF_ERROR(job.validate());
  if (job.train.model.subspace_k > 0)
    return invalid_argument("plan: --subspace-k models are not modelled yet (their boundary carries K values)");
  if (job.workers > cluster.size())
    return invalid_argument("plan: the job has " + std::to_string(job.workers) + " workers, the cluster " +
                            std::to_string(cluster.size()));
  LH_ASSIGN_OR_RETURN(Topology topo, job.topology());
  LH_ASSIGN_OR_RETURN(Cluster c, cluster_with_link_rules(cluster, job, topo));
  std::vector<std::pair<PipelineLink, LinkDir>> autos;
  LH_ASSIGN_OR_RETURN(Setup s, setup_of(c, job, auto_partition, &autos));
  Model m{c, job.train, model_costs(job.train.model), {}, {}};
  if (auto_partition) LH_RETURN_IF_ERROR(improve_partition(m, s).status());
  if (!autos.empty()) LH_RETURN_IF_ERROR(settle_auto_links(m, s, job, autos));
  LH_ASSIGN_OR_RETURN(std::vector<int> auto_grad, job.auto_grad_stages());
  if (!auto_grad.empty() && s.dp > 1) LH_RETURN_IF_ERROR(settle_auto_grad(m, s, job));
  if (job.compress_tp == "auto" && s.tp > 1) LH_RETURN_IF_ERROR(settle_auto_tp(m, s, job));
  if (auto_partition) return improve_partition(m, s);
  return m.step(s);
}

}  // namespace

Result<JobPlan> evaluate_plan(const Cluster& cluster, const JobConfig& job) {
  return evaluate_job(cluster, job, job.partition == "auto");
}

Result<std::string> plan_partition(const Cluster& cluster, const JobConfig& job) {
  LH_ASSIGN_OR_RETURN(JobPlan p, evaluate_job(cluster, job, true));
  return join(p.partition, ',');
}

namespace {

// One search of search_plans: every grid, placement, schedule and microbatch count, keeping each grid's best plan.
struct PlanSearch {
  const Cluster& cluster;
  const TrainConfig& train;
  const PlanOptions& options;
  Model m;
  std::vector<int> by_speed;  // the cluster's workers, fastest first
  std::map<int, std::vector<int>> chains;
  std::map<std::tuple<int, int, int>, JobPlan> best_of_grid;
  std::string why_none = "no grid fits";
  int grids = 0;

  PlanSearch(const Cluster& c, const TrainConfig& t, const PlanOptions& o)
      : cluster(c), train(t), options(o), m{c, t, model_costs(t.model), {}, {}} {
    by_speed.resize(static_cast<size_t>(c.size()));
    std::iota(by_speed.begin(), by_speed.end(), 0);
    std::stable_sort(by_speed.begin(), by_speed.end(),
                     [&](int a, int b) { return cluster.worker(a).gflops > cluster.worker(b).gflops; });
  }

  // Candidate workers, fastest first; a grid of N workers takes the N fastest, ordered into a chain in which each
  // next worker is the one the previous reaches fastest, so that neighbours in rank order share fast links.
  const std::vector<int>& chain_of(int n) {
    auto it = chains.find(n);
    if (it != chains.end()) return it->second;
    std::vector<int> pool(by_speed.begin(), by_speed.begin() + n), chain;
    std::vector<char> used(size_t(n), 0);
    int cur = 0;
    used[0] = 1;
    chain.push_back(pool[0]);
    for (int k = 1; k < n; ++k) {
      int best = -1;
      double best_score = -1;
      for (int j = 0; j < n; ++j) {
        if (used[size_t(j)]) continue;
        const double bw = cluster.bandwidth(pool[size_t(cur)], pool[size_t(j)]);
        const double score = bw / (1 + 1e3 * cluster.latency(pool[size_t(cur)], pool[size_t(j)]));
        if (score > best_score) best_score = score, best = j;
      }
      used[size_t(best)] = 1;
      chain.push_back(pool[size_t(best)]);
      cur = best;
    }
    return chains.emplace(n, std::move(chain)).first->second;
  }

  // The best plan of each grid (pp, tp, dp), so the list shows alternatives, not one grid's variants; between plans
  // within 0.1% of each other, the one that needs less memory (fewer microbatches in flight).
  static bool better(const JobPlan& a, const JobPlan& b) {
    if (a.step_s < b.step_s * (1 - 1e-3)) return true;
    if (b.step_s < a.step_s * (1 - 1e-3)) return false;
    return a.memory_gb < b.memory_gb;
  }
  void keep(JobPlan p) {
    auto key = std::make_tuple(p.pp, p.tp, p.dp);
    auto it = best_of_grid.find(key);
    if (it == best_of_grid.end())
      best_of_grid.emplace(key, std::move(p));
    else if (better(p, it->second))
      it->second = std::move(p);
  }

  // Every grid that fits the cluster, the model's heads and the batch.
  Status run() {
    const GptConfig& g = train.model;
    const int W = cluster.size();
    const int max_pp = std::min(g.layers, options.max_pp > 0 ? options.max_pp : g.layers);
    for (int pp = 1; pp <= std::min(max_pp, W); ++pp)
      for (int tp : divisors(g.heads)) {
        if (options.max_tp > 0 && tp > options.max_tp) continue;
        if (pp * tp > W) continue;
        for (int dp : divisors(train.batch)) {
          if (options.max_dp > 0 && dp > options.max_dp) continue;
          const int n = pp * tp * dp;
          if (n > W) continue;
          ++grids;
          for (int placement = 0; placement < (dp > 1 ? 2 : 1); ++placement)
            LH_RETURN_IF_ERROR(try_placement(pp, tp, dp, placement));
        }
      }
    return Status::Ok();
  }

  // The grid's ranks on the chain of its workers. 0: stage-major (a stage's replicas side by side); 1: replica-major
  // (each replica's pipeline side by side).
  Setup placed(int pp, int tp, int dp, int placement) {
    const int n = pp * tp * dp;
    const std::vector<int>& chain = chain_of(n);
    Setup s;
    s.pp = pp;
    s.tp = tp;
    s.dp = dp;
    s.grad = options.grad_codec;
    s.tpc = options.tp_codec;
    s.slowdown.assign(size_t(n), 1.0);
    s.worker_of_rank.assign(size_t(n), 0);
    for (int st = 0; st < pp; ++st)
      for (int d = 0; d < dp; ++d)
        for (int t = 0; t < tp; ++t) {
          const int rank = Topology::rank_in_grid(tp, dp, {st, t, d});
          const int pos = placement == 0 ? rank : (d * pp + st) * tp + t;
          s.worker_of_rank[size_t(rank)] = chain[size_t(pos)];
        }
    return s;
  }

  // One placement of one grid: each schedule and microbatch count from a partition proportional to stage speed.
  Status try_placement(int pp, int tp, int dp, int placement) {
    const GptConfig& g = train.model;
    const int n = pp * tp * dp;
    Setup s = placed(pp, tp, dp, placement);
    std::vector<double> speeds(size_t(pp), 1e300);
    for (int r = 0; r < n; ++r) {
      const int st = r / (dp * tp);
      speeds[size_t(st)] = std::min(speeds[size_t(st)], cluster.worker(s.worker_of_rank[size_t(r)]).gflops);
    }
    LH_ASSIGN_OR_RETURN(Partition start, Partition::proportional(g.layers, speeds));
    const int local = train.batch / dp;
    for (size_t k = 0; k < (pp > 1 ? options.schedules.size() : 1); ++k)  // one stage: no schedule to choose
      for (int M : divisors(local)) {
        const ScheduleKind kind = options.schedules[k];
        if (M > options.max_microbatches) continue;
        if (kind == ScheduleKind::kEager && tp > 1) continue;  // a stage's shards must share one order
        s.kind = kind;
        s.M = M;
        s.counts = start.counts();
        LH_RETURN_IF_ERROR(try_schedule(s));
      }
    return Status::Ok();
  }

  // One schedule and microbatch count: the partition and codecs settled, kept when it fits the workers' memory.
  Status try_schedule(Setup& s) {
    const int pp = s.pp, n = s.pp * s.tp * s.dp;
    s.fwd.assign(size_t(pp - 1), options.ladder.back());
    s.bwd = s.fwd;
    LH_ASSIGN_OR_RETURN(JobPlan lossiest, improve_partition(m, s));
    // Codecs: per link and direction, the least lossy within the tolerance of the lossiest there.
    for (int l = 0; l + 1 < pp; ++l)
      for (int dirn = 0; dirn < 2; ++dirn) {
        std::vector<std::string>& slot = dirn == 0 ? s.fwd : s.bwd;
        for (const std::string& spec : options.ladder) {
          slot[size_t(l)] = spec;
          LH_ASSIGN_OR_RETURN(JobPlan cand, m.step(s));
          if (cand.step_s <= lossiest.step_s * (1 + options.codec_tolerance)) break;
        }
      }
    LH_ASSIGN_OR_RETURN(JobPlan best, improve_partition(m, s));
    bool fits = true;
    for (int r = 0; r < n; ++r) {
      const double mem = cluster.worker(s.worker_of_rank[size_t(r)]).memory_gb;
      if (mem > 0 && best.memory_gb > mem) fits = false;
    }
    if (!fits) {
      why_none = "no grid fits the workers' memory (the smallest need found: " + std::to_string(best.memory_gb) +
                 " GB per worker)";
      return Status::Ok();
    }
    keep(std::move(best));
    return Status::Ok();
  }
};

// search_plans' refusals before any search: a model it cannot price, an empty or bad ladder, no schedule.
Status check_search(const TrainConfig& train, const PlanOptions& options) {
  LH_RETURN_IF_ERROR(train.validate());
  if (train.model.subspace_k > 0)
    return invalid_argument("plan: --subspace-k models are not modelled yet (their boundary carries K values)");
  if (options.ladder.empty()) return invalid_argument("plan: --ladder names no codec");
  for (const auto& spec : options.ladder) {
    Status st = check_codec_spec(spec);
    if (!st.ok()) return invalid_argument("plan: --ladder entry '" + spec + "': " + st.message());
  }
  if (options.schedules.empty()) return invalid_argument("plan: no schedule to try");
  return Status::Ok();
}

}  // namespace

Result<std::vector<JobPlan>> search_plans(const Cluster& cluster, const TrainConfig& train,
                                          const PlanOptions& options) {
  LH_RETURN_IF_ERROR(check_search(train, options));
  PlanSearch search(cluster, train, options);
  LH_RETURN_IF_ERROR(search.run());
  std::vector<JobPlan> top;
  for (auto& [key, p] : search.best_of_grid) top.push_back(std::move(p));
  std::sort(top.begin(), top.end(), [](const JobPlan& a, const JobPlan& b) { return a.step_s < b.step_s; });
  if (int(top.size()) > std::max(1, options.top)) top.resize(size_t(std::max(1, options.top)));
  if (top.empty())
    return invalid_argument("plan: " + (search.grids == 0 ? std::string("no grid of the cluster's ") +
                                                                std::to_string(cluster.size()) +
                                                                " workers fits the model (layers, heads) and --batch"
                                                          : search.why_none));
  return top;
}

Result<std::vector<double>> train_flops_per_step(const JobConfig& job) {
  LH_RETURN_IF_ERROR(job.validate());
  LH_ASSIGN_OR_RETURN(Partition part, job.make_partition());
  const ModelCosts mc = model_costs(job.train.model);
  const double tokens = double(job.train.batch) / job.slices() * mc.T;  // one replica's share of the step
  std::vector<double> flops;
  for (int r = 0; r < job.workers; ++r) {
    const int st = r / (job.dp * job.tp);
    double f = part.counts()[size_t(st)] * mc.block_fwd_flops;
    if (st == job.pp - 1) f += mc.head_fwd_flops;
    flops.push_back(3 * f * tokens / job.tp);
  }
  return flops;
}

Result<double> stage_parameters(const JobConfig& job, int stage) {
  LH_ASSIGN_OR_RETURN(Partition part, job.make_partition());
  if (stage < 0 || stage >= part.stages())
    return invalid_argument("stage " + std::to_string(stage) + " is not in the job");
  const ModelCosts mc = model_costs(job.train.model);
  double params = part.counts()[size_t(stage)] * mc.block_params;
  if (stage == 0) params += mc.embed_params;
  if (stage == part.stages() - 1) params += mc.head_params;
  return params / job.tp;
}

std::string launch_command(const JobPlan& p, const TrainConfig& train) {
  std::ostringstream o;
  const GptConfig& g = train.model;
  o << "longhaul launch --workers " << p.pp * p.tp * p.dp << " --pp " << p.pp;
  if (p.tp > 1) o << " --tp " << p.tp;
  if (p.dp > 1) o << " --dp " << p.dp;
  o << " --layers " << g.layers << " --d-model " << g.d_model << " --heads " << g.heads << " --seq " << g.seq;
  if (g.tied_head) o << " --tied-head";
  o << " --batch " << train.batch << " --steps " << train.steps;
  if (p.pp > 1) o << " --partition " << join(p.partition, ',');
  o << " --microbatches " << p.microbatches << " --schedule " << schedule_kind_name(p.schedule);
  for (size_t l = 0; l < p.fwd_codec.size(); ++l) {
    const std::string name = std::to_string(l) + "-" + std::to_string(l + 1);
    if (p.fwd_codec[l] != "none") o << " --compress-link " << name << ":fwd=" << p.fwd_codec[l];
    if (p.bwd_codec[l] != "none") o << " --compress-link " << name << ":bwd=" << p.bwd_codec[l];
  }
  if (p.dp > 1 && p.grad_codec != "none") o << " --compress-grad " << p.grad_codec;
  if (p.tp > 1 && p.tp_codec != "none") o << " --compress-tp " << p.tp_codec;
  return o.str();
}

std::string placement_table(const JobPlan& p, const Cluster& cluster) {
  std::ostringstream o;
  for (int r = 0; r < int(p.worker_of_rank.size()); ++r) {
    const int st = r / (p.dp * p.tp), d = (r / p.tp) % p.dp, t = r % p.tp;
    const ClusterWorker& w = cluster.worker(p.worker_of_rank[size_t(r)]);
    o << "  rank " << r << " (stage " << st;
    if (p.dp > 1) o << ", replica " << d;
    if (p.tp > 1) o << ", shard " << t;
    o << "): " << w.name << (w.site.empty() ? "" : " (site " + w.site + ")") << ", " << w.gflops << " GFLOP/s\n";
  }
  return o.str();
}

}  // namespace lh
