// Pipeline job settings: validation, JSON for the Plan, and codec plan/change ↔ control messages.
// Used by launch, coordinator, worker and ctl.
#include "plan/job_config.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>

#include "comm/sync_config.h"
#include "core/json_fields.h"
#include "core/json_limits.h"
#include "grid/link_name.h"
#include "grid/link_shapes.h"
#include "plan/auto_codec.h"
#include "transport/packet_auth.h"

namespace lh {
namespace {

// Reads required fields of one JSON object with errors naming "job config: field 'x'".

}  // namespace

JobConfig::DataPlaneBounds JobConfig::data_plane_bounds() const {
  const GptConfig& m = train.model;
  const uint64_t d = uint64_t(std::max(m.d_model, 1)), v = uint64_t(std::max(m.vocab, 1));
  const uint64_t seq = uint64_t(std::max(m.seq, 1)), layers = uint64_t(std::max(m.layers, 0));
  // Each block: attention (4 d² + 4 d), MLP (8 d² + 5 d), two norms (4 d); embeddings, positions, head, final norm.
  const uint64_t params = layers * (12 * d * d + 16 * d) + 2 * v * d + seq * d + 4 * d + v;
  const uint64_t activations = uint64_t(std::max(train.batch, 1)) * seq * d * 4;  // every row at one boundary
  const uint64_t burst = uint64_t(4) << 20;                                       // ProbeOptions::max_burst_bytes
  const uint64_t largest = std::max({activations, params * 4, burst});
  DataPlaneBounds b;
  b.max_packet_bytes = 2 * largest + (uint64_t(1) << 20);
  b.max_unexpected_bytes = 2 * (activations + params * 4) + (uint64_t(16) << 20);
  b.max_unexpected_bytes = std::max(b.max_unexpected_bytes, b.max_packet_bytes);
  return b;
}

Result<Topology> JobConfig::topology() const {
  return Topology::create(workers, pp, tp, dp);
}

Result<Partition> JobConfig::make_partition() const {
  if (partition.empty() || partition == "speed" || partition == "auto") return Partition::even(train.model.layers, pp);
  auto p = Partition::parse(partition, train.model.layers, pp);
  if (!p.ok()) return Status(p.status()).prepend("--partition");
  return p;
}

namespace {

Result<std::vector<double>> slowest_at_each(const Topology& t, const std::vector<double>& speeds,
                                            int (*index_of)(const WorkerCoord&), const std::string& flag);

// `units` (of --microbatches sequences each) over replicas of these weights, at least one each, each next unit to
// the replica whose share would take least long (units / weight): the split that minimises the slowest replica.
std::vector<int> units_by_weight(const std::vector<double>& weights, int units) {
  std::vector<int> n(weights.size(), 1);
  for (int u = int(weights.size()); u < units; ++u) {
    size_t best = 0;
    for (size_t d = 1; d < n.size(); ++d)
      if ((n[d] + 1) / weights[d] < (n[best] + 1) / weights[best]) best = d;
    ++n[best];
  }
  return n;
}

}  // namespace

Result<std::vector<int>> JobConfig::dp_rows() const {
  if (dp_split.empty() || dp_split == "speed") return std::vector<int>{};
  const std::string what = "--dp-split '" + dp_split + "'";
  std::vector<double> weights;
  size_t pos = 0;
  while (true) {
    const size_t colon = dp_split.find(':', pos);
    const std::string item = dp_split.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    char* end = nullptr;
    const double w = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(w > 0) || !std::isfinite(w))
      return invalid_argument(what + ": entry " + std::to_string(weights.size() + 1) + " '" + item +
                              "' is not a positive weight (expected one weight per replica, e.g. 3:1, or speed)");
    weights.push_back(w);
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  if (int(weights.size()) != dp)
    return invalid_argument(what + " has " + std::to_string(weights.size()) + " weights for --dp " +
                            std::to_string(dp));
  if (microbatches < 1 || train.batch % microbatches != 0 || train.batch / microbatches < dp)
    return invalid_argument(what + ": --batch " + std::to_string(train.batch) + " must split into at least --dp " +
                            std::to_string(dp) + " shares of whole --microbatches " + std::to_string(microbatches));
  std::vector<int> rows = units_by_weight(weights, train.batch / microbatches);
  for (int& r : rows) r *= microbatches;
  return rows;
}

Result<std::string> JobConfig::planned_dp_split(const std::vector<double>& speeds) const {
  if (dp_split != "speed") return dp_split;
  LH_ASSIGN_OR_RETURN(Topology t, topology());
  LH_ASSIGN_OR_RETURN(std::vector<double> replica_speed,
                      slowest_at_each(
                          t, speeds, [](const WorkerCoord& c) { return c.dp; }, "--dp-split speed"));
  std::string out;
  JobConfig c = *this;
  for (size_t d = 0; d < replica_speed.size(); ++d) out += (d ? ":" : "") + std::to_string(replica_speed[d]);
  c.dp_split = out;
  LH_ASSIGN_OR_RETURN(std::vector<int> rows, c.dp_rows());
  out.clear();
  for (size_t d = 0; d < rows.size(); ++d) out += (d ? ":" : "") + std::to_string(rows[d]);
  return out;
}

namespace {

// The slowest of `speeds` (one per worker of t, in rank order) at each value of index_of(coord) — a stage, a shard
// index — for the speed plans; `flag` names the plan in the count error.
Result<std::vector<double>> slowest_at_each(const Topology& t, const std::vector<double>& speeds,
                                            int (*index_of)(const WorkerCoord&), const std::string& flag) {
  if (static_cast<int>(speeds.size()) != t.workers())
    return invalid_argument(flag + ": " + std::to_string(speeds.size()) + " speeds for " + std::to_string(t.workers()) +
                            " workers");
  std::vector<double> slowest;
  for (int r = 0; r < t.workers(); ++r) {
    const size_t i = size_t(index_of(t.coord_of(r)));
    if (slowest.size() <= i) slowest.resize(i + 1, std::numeric_limits<double>::infinity());
    slowest[i] = std::min(slowest[i], speeds[r]);
  }
  return slowest;
}

}  // namespace

Result<std::string> JobConfig::planned_partition(const std::vector<double>& speeds) const {
  if (partition != "speed") {  // "auto" is planned by the coordinator (plan/planner.h plan_partition)
    LH_ASSIGN_OR_RETURN(Partition p, make_partition());
    return partition.empty() ? std::string() : p.to_string();
  }
  // A stage is as fast as its slowest worker (its shards and replicas wait for each other).
  LH_ASSIGN_OR_RETURN(Topology t, topology());
  LH_ASSIGN_OR_RETURN(std::vector<double> stage_speed,
                      slowest_at_each(
                          t, speeds, [](const WorkerCoord& c) { return c.stage; }, "--partition speed"));
  bool known = true;
  for (double v : speeds) known &= v > 0 && std::isfinite(v);
  LH_ASSIGN_OR_RETURN(Partition p, known ? Partition::proportional(train.model.layers, stage_speed)
                                         : Partition::even(train.model.layers, pp));
  return p.to_string();
}

Result<std::vector<int>> JobConfig::tp_heads_split() const {
  return tp_heads(tp_split == "speed" ? "" : tp_split, tp, train.model.heads);
}

Result<std::string> JobConfig::planned_tp_split(const std::vector<double>& speeds) const {
  if (tp_split != "speed") return tp_split;
  // Shard t's heads run on every stage and replica at index t: the slowest of them sets its pace.
  LH_ASSIGN_OR_RETURN(Topology t, topology());
  LH_ASSIGN_OR_RETURN(std::vector<double> shard_speed,
                      slowest_at_each(
                          t, speeds, [](const WorkerCoord& c) { return c.tp; }, "--tp-split speed"));
  LH_ASSIGN_OR_RETURN(std::vector<int> heads, tp_heads_by_speed(shard_speed, train.model.heads));
  return tp_split_string(heads);
}

namespace {

// The selection a --compress-link entry's LINK[:DIR] makes, when it parses as a selector (else the pipeline
// parser reports what is wrong with it).
std::optional<LinkSelection> selection_of(const Topology& t, const std::string& entry) {
  const size_t eq = entry.find('=');
  if (eq == std::string::npos) return std::nullopt;
  auto sel = parse_link_selector(t, entry.substr(0, eq));
  if (!sel.ok()) return std::nullopt;
  return *sel;
}

}  // namespace

namespace {
// `spec` with "auto" replaced: by `if_auto`, and any other spec by `otherwise` when that is not empty.
std::string resolve_auto(const std::string& spec, const std::string& if_auto, const std::string& otherwise) {
  return spec == "auto" ? if_auto : otherwise.empty() ? spec : otherwise;
}

// The job's pipeline codec plan (--compress-fwd/--compress-bwd and the --compress-link entries naming pipeline
// links) with every spec put through resolve_auto.
Result<CodecPlan> plan_resolving_auto(const JobConfig& c, const Topology& t, const std::string& if_auto,
                                      const std::string& otherwise) {
  std::vector<std::string> pipeline;
  for (const std::string& e : c.compress_link) {
    auto sel = selection_of(t, e);
    const size_t eq = e.find('=');
    if (!sel || sel->kind == "pipeline")
      pipeline.push_back(
          eq == std::string::npos ? e : e.substr(0, eq + 1) + resolve_auto(e.substr(eq + 1), if_auto, otherwise));
  }
  return CodecPlan::create(t, resolve_auto(c.compress_fwd, if_auto, otherwise),
                           resolve_auto(c.compress_bwd, if_auto, otherwise), pipeline);
}
}  // namespace

Result<CodecPlan> JobConfig::codec_plan() const {
  LH_ASSIGN_OR_RETURN(Topology t, topology());
  LH_ASSIGN_OR_RETURN(std::vector<std::string> ladder, parse_auto_ladder(auto_ladder));
  return plan_resolving_auto(*this, t, ladder[0], "");
}

Result<std::vector<std::pair<PipelineLink, LinkDir>>> JobConfig::auto_links() const {
  LH_ASSIGN_OR_RETURN(Topology t, topology());
  // The same plan with "auto" as bf16 and every other spec as none: the links that come out bf16 are auto.
  LH_ASSIGN_OR_RETURN(CodecPlan marker, plan_resolving_auto(*this, t, "bf16", "none"));
  std::vector<std::pair<PipelineLink, LinkDir>> out;
  for (const PipelineLink& l : marker.links())
    for (LinkDir d : {LinkDir::kFwd, LinkDir::kBwd})
      if (marker.spec(l, d) == "bf16") out.push_back({l, d});
  return out;
}

Result<std::string> JobConfig::tp_spec() const {
  if (compress_tp != "auto") return compress_tp;
  LH_ASSIGN_OR_RETURN(std::vector<std::string> ladder, parse_auto_tp_ladder(auto_tp_ladder));
  return ladder.front();
}

Result<std::vector<int>> JobConfig::auto_grad_stages() const {
  LH_ASSIGN_OR_RETURN(std::vector<std::string> specs, grad_specs(true));
  std::vector<int> out;
  for (size_t s = 0; s < specs.size(); ++s)
    if (specs[s] == "auto") out.push_back(int(s));
  return out;
}

Result<std::vector<std::string>> JobConfig::grad_specs(bool keep_auto) const {
  LH_ASSIGN_OR_RETURN(Topology t, topology());
  std::vector<std::string> specs(size_t(t.pp()), compress_grad);
  for (const std::string& e : compress_link) {
    auto sel = selection_of(t, e);
    if (!sel || sel->kind == "pipeline") continue;
    const std::string where = "--compress-link '" + e + "'";
    const size_t eq = e.find('=');
    if (sel->kind == "cross")
      return invalid_argument(where + ": a cross pair carries no codec (pipeline and replica links do)");
    if (sel->kind == "tp")
      return invalid_argument(where +
                              ": a tp group's sums use one codec, --compress-tp; per-link tp codecs are not "
                              "supported");
    if (e.substr(0, eq).find(':') != std::string::npos)
      return invalid_argument(where + ": a replica group's all-reduce uses one codec both ways; drop the :fwd/:bwd");
    const std::string spec = e.substr(eq + 1);
    if (spec != "auto") {
      Status s = check_grad_codec_spec(spec);
      if (!s.ok()) return s.prepend(where);
    }
    for (const auto& [src, dst] : sel->pairs) specs[size_t(t.coord_of(src).stage)] = spec;
  }
  if (!keep_auto)
    for (std::string& spec : specs)
      if (spec == "auto") {
        LH_ASSIGN_OR_RETURN(std::vector<std::string> ladder, parse_auto_grad_ladder(auto_grad_ladder));
        spec = ladder.front();
      }
  return specs;
}

Status JobConfig::validate() const {
  LH_RETURN_IF_ERROR(train.validate());
  if (checkpoint_every < 0)
    return invalid_argument("--checkpoint-every " + std::to_string(checkpoint_every) + ": expected 0 or more steps");
  LH_RETURN_IF_ERROR(topology().status());
  LH_ASSIGN_OR_RETURN(Partition part, make_partition());
  if (tp_split != "" && tp_split != "speed" && tp == 1)
    return invalid_argument("--tp-split " + tp_split + " needs --tp > 1");
  LH_RETURN_IF_ERROR(tp_heads_split().status());
  if (tp > 1) LH_RETURN_IF_ERROR(check_tp(part));
  if (microbatches < 1)
    return invalid_argument("--microbatches must be at least 1, got " + std::to_string(microbatches));
  if (auto p = parse_packet_protection(data_protection); !p.ok()) return Status(p.status()).prepend("job config");
  {
    LH_ASSIGN_OR_RETURN(Topology t, topology());
    Status l = check_link_rules(t, links);
    if (!l.ok()) return l.prepend("--link");
    LH_RETURN_IF_ERROR(parse_slowdowns(slowdown, workers).status());
  }
  if (batch_slices != 0 || !replica_slices.empty()) {
    // An --elastic job that lost replicas (set by the coordinator, never by a flag).
    if (batch_slices < dp || int(replica_slices.size()) != dp)
      return invalid_argument("job config: " + std::to_string(replica_slices.size()) + " replica slices of " +
                              std::to_string(batch_slices) + " for --dp " + std::to_string(dp));
    for (size_t i = 0; i < replica_slices.size(); ++i)
      if (replica_slices[i] < 0 || replica_slices[i] >= batch_slices ||
          (i > 0 && replica_slices[i] <= replica_slices[i - 1]))
        return invalid_argument("job config: replica slices must rise within 0.." + std::to_string(batch_slices - 1));
  }
  if (!dp_split.empty()) {
    if (dp < 2) return invalid_argument("--dp-split " + dp_split + " needs --dp > 1");
    if (batch_slices != 0 || !replica_slices.empty())
      return invalid_argument("--dp-split " + dp_split + " with --elastic is not supported (a lost replica's share)");
    LH_ASSIGN_OR_RETURN(SyncConfig sc, parse_sync(sync));
    if (sc.diloco())
      return invalid_argument("--dp-split " + dp_split +
                              " with --sync diloco is not supported: replicas of unequal shares take local steps of "
                              "unequal noise, and their average is not the whole batch's");
    // "speed" is planned into weights; its check is that any split can be made.
    JobConfig c = *this;
    if (c.dp_split == "speed") {
      c.dp_split = "1";
      for (int d = 1; d < dp; ++d) c.dp_split += ":1";
    }
    LH_RETURN_IF_ERROR(c.dp_rows().status());
  } else if (train.batch % (slices() * microbatches) != 0) {
    return invalid_argument("--batch " + std::to_string(train.batch) + " does not split into --dp " +
                            std::to_string(slices()) + " replicas × --microbatches " + std::to_string(microbatches) +
                            " equal parts");
  }
  if (auto_every < 1 || auto_every > 1000000)
    return invalid_argument("--auto-every " + std::to_string(auto_every) + ": expected 1 or more steps");
  if (!(auto_fit > 0 && auto_fit <= 4))
    return invalid_argument("--auto-fit " + std::to_string(auto_fit) + ": expected a share of the compute in (0, 4]");
  if (!(auto_tolerance > 0 && auto_tolerance <= 1))
    return invalid_argument("--auto-tolerance " + std::to_string(auto_tolerance) +
                            ": expected a share of the step in (0, 1]");
  LH_RETURN_IF_ERROR(codec_plan().status());
  LH_RETURN_IF_ERROR(check_grad_codecs());
  return Status::Ok();
}

// validate() with tp > 1: a model tp can split, the --compress-tp codec, and each stage's tp all-reduces per step
// within the tag's 12-bit sequence (docs/grid.md §2).
Status JobConfig::check_tp(const Partition& part) const {
  if (train.model.subspace_k > 0)
    return invalid_argument("--tp " + std::to_string(tp) +
                            " with --subspace-k: tensor parallelism does not "
                            "support a subspace model; use --subspace-k 0 or --tp 1");
  Status s = compress_tp == "auto" ? tp_spec().status() : check_codec_spec(compress_tp);
  if (!s.ok()) return s.prepend("--compress-tp '" + compress_tp + "'");
  // Each step's tp all-reduces are named by a 12-bit sequence in the tag (docs/grid.md §2).
  for (int st = 0; st < part.stages(); ++st) {
    const int blocks = part.stage(st).num_blocks;
    const int64_t ops = tp_all_reduces_per_step(blocks, microbatches, train.eval_batches);
    if (ops >= 4095)
      return invalid_argument("--tp with " + std::to_string(blocks) + " blocks on stage " + std::to_string(st) +
                              ", --microbatches " + std::to_string(microbatches) + " and " +
                              std::to_string(train.eval_batches) + " evaluation batches needs " + std::to_string(ops) +
                              " all-reduces per step; at most 4094 fit: use fewer --microbatches or more stages");
  }
  return Status::Ok();
}

// validate()'s gradient codecs: --compress-grad, the groups' overrides and the auto ladder, each suiting --sync.
Status JobConfig::check_grad_codecs() const {
  if (compress_grad != "auto") {
    Status g = check_grad_codec_spec(compress_grad);
    if (!g.ok()) return g.prepend("--compress-grad '" + compress_grad + "'");
  }
  LH_ASSIGN_OR_RETURN(SyncConfig sc, parse_sync(sync));
  LH_ASSIGN_OR_RETURN(std::vector<std::string> grad, grad_specs());
  // Refused with DiLoCo even where every group overrides it; auto: every codec it may choose.
  if (compress_grad != "auto") grad.push_back(compress_grad);
  LH_ASSIGN_OR_RETURN(std::vector<int> auto_grad, auto_grad_stages());
  if (!auto_grad.empty()) {
    auto ladder = parse_auto_grad_ladder(auto_grad_ladder);
    if (!ladder.ok()) return ladder.status();
    for (const std::string& g : *ladder) {
      if (g.rfind("powersgd", 0) == 0)
        return invalid_argument("--auto-grad-ladder entry '" + g +
                                "': auto chooses among codec chains (PowerSGD's two rounds are not one); set it with "
                                "--compress-grad");
      grad.push_back(g);
    }
  }
  for (const std::string& g : grad) {
    Status s = check_grad_codec_spec(g, sc);
    if (!s.ok()) return s.prepend("--compress-grad / --compress-link for replicas with --sync " + sync);
  }
  return Status::Ok();
}

nlohmann::json JobConfig::to_json() const {
  const GptConfig& m = train.model;
  nlohmann::json model = {{"vocab", m.vocab},          {"seq", m.seq},     {"layers", m.layers},
                          {"d_model", m.d_model},      {"heads", m.heads}, {"tied_head", m.tied_head},
                          {"subspace_k", m.subspace_k}};
  nlohmann::json tr = {{"data", train.data},
                       {"steps", train.steps},
                       {"batch", train.batch},
                       {"lr", train.lr},
                       {"warmup", train.warmup},
                       {"min_lr_frac", train.min_lr_frac},
                       {"weight_decay", train.weight_decay},
                       {"grad_clip", train.grad_clip},
                       {"seed", train.seed},
                       {"device", device_name(train.device)},
                       {"eval_every", train.eval_every},
                       {"eval_batches", train.eval_batches}};
  return {{"model", model},
          {"train", tr},
          {"workers", workers},
          {"pp", pp},
          {"tp", tp},
          {"dp", dp},
          {"partition", partition},
          {"schedule", schedule_kind_name(schedule)},
          {"microbatches", microbatches},
          {"compress_fwd", compress_fwd},
          {"auto_ladder", auto_ladder},
          {"auto_every", auto_every},
          {"auto_fit", auto_fit},
          {"auto_tolerance", auto_tolerance},
          {"compress_bwd", compress_bwd},
          {"compress_link", compress_link},
          {"compress_grad", compress_grad},
          {"auto_grad_ladder", auto_grad_ladder},
          {"sync", sync},
          {"tp_split", tp_split},
          {"dp_split", dp_split},
          {"compress_tp", compress_tp},
          {"auto_tp_ladder", auto_tp_ladder},
          {"checkpoint_every", checkpoint_every},
          {"data_protection", data_protection},
          {"links", links},
          {"slowdown", slowdown},
          {"batch_slices", batch_slices},
          {"replica_slices", replica_slices}};
}

Result<JobConfig> JobConfig::without_replica(int replica) const {
  if (dp < 2) return invalid_argument("the job has one replica; it cannot go on without it");
  if (replica < 0 || replica >= dp)
    return invalid_argument("replica " + std::to_string(replica) + " outside 0.." + std::to_string(dp - 1));
  JobConfig c = *this;
  c.batch_slices = slices();
  c.replica_slices.clear();
  for (int d = 0; d < dp; ++d)
    if (d != replica) c.replica_slices.push_back(slice_of(d));
  c.dp = dp - 1;
  c.workers = pp * tp * c.dp;
  LH_RETURN_IF_ERROR(c.validate());
  return c;
}

std::string JobConfig::resume_hash() const {
  nlohmann::json j = to_json();
  j["train"].erase("steps");
  j["train"].erase("eval_every");
  j.erase("checkpoint_every");
  // How packets travel and how fast machines are, not what is trained.
  for (const char* f : {"data_protection", "links", "slowdown"}) j.erase(f);
  // The codecs auto chose are the job's codec changes, which a checkpoint holds on its own.
  for (const char* f :
       {"auto_ladder", "auto_every", "auto_fit", "auto_tolerance", "auto_grad_ladder", "auto_tp_ladder"})
    j.erase(f);
  // Resolved at planning time ("speed"); a resumed worker's state checks its own blocks and heads.
  j.erase("partition");
  j.erase("tp_split");
  j.erase("dp_split");  // the update is the whole batch's, however it is shared
  for (const char* f : {"dp", "workers", "batch_slices", "replica_slices"}) j.erase(f);
  const std::string text = j.dump();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
  return hex;
}

Result<JobConfig> JobConfig::from_json(const std::string& text) {
  // A plan's configuration holds the job's link rules (up to 4096) and dp split: well under 4 MiB.
  LH_ASSIGN_OR_RETURN(nlohmann::json j, parse_json_bounded(text, JsonLimits{size_t(4) << 20}, "job config"));
  if (!j.is_object()) return invalid_argument("job config: expected a JSON object");
  JobConfig c;
  JsonFields r(j, "job config");
  for (const char* obj : {"model", "train"}) {
    const nlohmann::json* v = r.find(obj);
    if (!v) return r.error(obj, "missing");
    if (!v->is_object()) return r.error(obj, "expected an object");
  }
  JsonFields m(j["model"], "job config", "model."), t(j["train"], "job config", "train.");
  GptConfig& g = c.train.model;
  LH_RETURN_IF_ERROR(m.integer("vocab", g.vocab));
  LH_RETURN_IF_ERROR(m.integer("seq", g.seq));
  LH_RETURN_IF_ERROR(m.integer("layers", g.layers));
  LH_RETURN_IF_ERROR(m.integer("d_model", g.d_model));
  LH_RETURN_IF_ERROR(m.integer("heads", g.heads));
  LH_RETURN_IF_ERROR(m.boolean("tied_head", g.tied_head));
  LH_RETURN_IF_ERROR(m.integer("subspace_k", g.subspace_k));
  LH_RETURN_IF_ERROR(t.string("data", c.train.data));
  LH_RETURN_IF_ERROR(t.integer("steps", c.train.steps));
  LH_RETURN_IF_ERROR(t.integer("batch", c.train.batch));
  LH_RETURN_IF_ERROR(t.number("lr", c.train.lr));
  LH_RETURN_IF_ERROR(t.integer("warmup", c.train.warmup));
  LH_RETURN_IF_ERROR(t.number("min_lr_frac", c.train.min_lr_frac));
  LH_RETURN_IF_ERROR(t.number("weight_decay", c.train.weight_decay));
  LH_RETURN_IF_ERROR(t.number("grad_clip", c.train.grad_clip));
  LH_RETURN_IF_ERROR(t.uint("seed", c.train.seed));
  std::string device;
  LH_RETURN_IF_ERROR(t.string("device", device));
  if (device == "cpu")
    c.train.device = Device::cpu;
  else if (device == "cuda")
    c.train.device = Device::cuda;
  else
    return t.error("device", "expected cpu or cuda, got '" + device + "'");
  LH_RETURN_IF_ERROR(t.integer("eval_every", c.train.eval_every));
  LH_RETURN_IF_ERROR(t.integer("eval_batches", c.train.eval_batches));
  LH_RETURN_IF_ERROR(r.integer("workers", c.workers));
  LH_RETURN_IF_ERROR(r.integer("pp", c.pp));
  LH_RETURN_IF_ERROR(r.integer("tp", c.tp));
  LH_RETURN_IF_ERROR(r.integer("dp", c.dp));
  LH_RETURN_IF_ERROR(r.string("partition", c.partition));
  std::string schedule;
  LH_RETURN_IF_ERROR(r.string("schedule", schedule));
  auto kind = parse_schedule_kind(schedule);
  if (!kind.ok()) return r.error("schedule", kind.status().message());
  c.schedule = *kind;
  LH_RETURN_IF_ERROR(r.integer("microbatches", c.microbatches));
  LH_RETURN_IF_ERROR(r.string("compress_fwd", c.compress_fwd));
  LH_RETURN_IF_ERROR(r.string("compress_bwd", c.compress_bwd));
  LH_RETURN_IF_ERROR(r.strings("compress_link", c.compress_link));
  LH_RETURN_IF_ERROR(r.string("compress_grad", c.compress_grad));
  LH_RETURN_IF_ERROR(r.string("sync", c.sync));
  LH_RETURN_IF_ERROR(r.string("tp_split", c.tp_split));
  LH_RETURN_IF_ERROR(r.string("compress_tp", c.compress_tp));
  LH_RETURN_IF_ERROR(r.integer("checkpoint_every", c.checkpoint_every));
  LH_RETURN_IF_ERROR(r.integer("batch_slices", c.batch_slices));
  LH_RETURN_IF_ERROR(r.integers("replica_slices", c.replica_slices));
  if (r.find("data_protection")) LH_RETURN_IF_ERROR(r.string("data_protection", c.data_protection));
  if (r.find("links")) LH_RETURN_IF_ERROR(r.strings("links", c.links));
  if (r.find("auto_ladder")) LH_RETURN_IF_ERROR(r.string("auto_ladder", c.auto_ladder));
  if (r.find("auto_every")) LH_RETURN_IF_ERROR(r.integer("auto_every", c.auto_every));
  if (r.find("auto_fit")) LH_RETURN_IF_ERROR(r.number("auto_fit", c.auto_fit));
  if (r.find("auto_tolerance")) LH_RETURN_IF_ERROR(r.number("auto_tolerance", c.auto_tolerance));
  if (r.find("auto_grad_ladder")) LH_RETURN_IF_ERROR(r.string("auto_grad_ladder", c.auto_grad_ladder));
  if (r.find("auto_tp_ladder")) LH_RETURN_IF_ERROR(r.string("auto_tp_ladder", c.auto_tp_ladder));
  if (r.find("slowdown")) LH_RETURN_IF_ERROR(r.strings("slowdown", c.slowdown));
  if (r.find("dp_split")) LH_RETURN_IF_ERROR(r.string("dp_split", c.dp_split));
  LH_RETURN_IF_ERROR(c.validate());
  return c;
}

std::vector<LinkCodec> link_codecs_of(const CodecPlan& plan, const Topology& topology) {
  std::vector<LinkCodec> out;
  for (int r = 0; r < topology.workers(); ++r) {
    auto next = topology.next_stage_rank(r);
    if (!next) continue;
    const PipelineLink link = *topology.link_between(r, *next);
    LinkCodec f;
    f.src = r;
    f.dst = *next;
    f.dir = "fwd";
    f.spec = plan.spec(link, LinkDir::kFwd);
    LinkCodec b;
    b.src = *next;
    b.dst = r;
    b.dir = "bwd";
    b.spec = plan.spec(link, LinkDir::kBwd);
    out.push_back(f);
    out.push_back(b);
  }
  return out;
}

namespace {

// The pipeline link and direction of one directed (src → dst, dir) entry.
Result<std::pair<PipelineLink, LinkDir>> directed_link(int src, int dst, const std::string& dir_text,
                                                       const Topology& topology, const std::string& what) {
  if (src < 0 || src >= topology.workers() || dst < 0 || dst >= topology.workers())
    return invalid_argument(what + ": ranks " + std::to_string(src) + "→" + std::to_string(dst) + " are outside 0.." +
                            std::to_string(topology.workers() - 1));
  auto link = topology.link_between(src, dst);
  if (!link)
    return invalid_argument(what + ": ranks " + std::to_string(src) + " and " + std::to_string(dst) +
                            " are not pipeline neighbours");
  auto dir = parse_link_dir(dir_text);
  if (!dir.ok()) return Status(dir.status()).prepend(what);
  const bool forward = topology.coord_of(dst).stage > topology.coord_of(src).stage;
  if (forward != (*dir == LinkDir::kFwd))
    return invalid_argument(what + ": " + dir_text + " traffic does not flow from rank " + std::to_string(src) +
                            " to rank " + std::to_string(dst));
  return std::make_pair(*link, *dir);
}

}  // namespace

Result<CodecPlan> codec_plan_from_link_codecs(const std::vector<LinkCodec>& codecs, const Topology& topology,
                                              const CodecSpecCheck& check) {
  std::map<std::pair<int, int>, std::string> seen;  // (link.from, dir) → spec
  std::vector<std::string> overrides;
  for (size_t i = 0; i < codecs.size(); ++i) {
    const LinkCodec& c = codecs[i];
    const std::string what = "plan codec " + std::to_string(i) + " (" + std::to_string(c.src) + "→" +
                             std::to_string(c.dst) + " " + c.dir + ")";
    LH_ASSIGN_OR_RETURN(auto ld, directed_link(c.src, c.dst, c.dir, topology, what));
    const auto key = std::make_pair(ld.first.from, int(ld.second));
    auto it = seen.find(key);
    if (it != seen.end() && it->second != c.spec)
      return invalid_argument(what + ": spec '" + c.spec + "' disagrees with '" + it->second +
                              "' on another pair of link " + ld.first.name());
    seen[key] = c.spec;
    overrides.push_back(ld.first.name() + ":" + c.dir + "=" + c.spec);
  }
  for (const PipelineLink& l : topology.pipeline_links())
    for (LinkDir d : {LinkDir::kFwd, LinkDir::kBwd})
      if (!seen.count({l.from, int(d)}))
        return invalid_argument("plan codecs: no " + std::string(link_dir_name(d)) + " codec for link " + l.name());
  // Every link direction is overridden, so the defaults never show; "none" is always valid.
  return CodecPlan::create(topology, "none", "none", overrides, check);
}

Result<CodecChange> codec_change_of(const SetCodec& message, const Topology& topology, const CodecSchedule& schedule) {
  LH_ASSIGN_OR_RETURN(auto ld, directed_link(message.src, message.dst, message.dir, topology, "set-codec"));
  if (message.apply_at_step < -1)
    return invalid_argument("set-codec: apply_at_step " + std::to_string(message.apply_at_step) + " is invalid");
  CodecChange c;
  c.link = ld.first;
  c.dir = ld.second;
  c.spec = message.spec;
  c.from_step = message.apply_at_step == -1 ? schedule.current_step() + 1 : message.apply_at_step;
  return c;
}

SetCodec set_codec_message(const CodecChange& change, const Topology& topology) {
  SetCodec m;
  const int a = topology.rank_of({change.link.from, 0, 0}), b = topology.rank_of({change.link.to, 0, 0});
  m.src = change.dir == LinkDir::kFwd ? a : b;
  m.dst = change.dir == LinkDir::kFwd ? b : a;
  m.dir = link_dir_name(change.dir);
  m.spec = change.spec;
  m.apply_at_step = change.from_step;
  return m;
}

}  // namespace lh
