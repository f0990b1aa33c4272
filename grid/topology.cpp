// The pp × tp × dp worker grid: validation, rank ↔ coordinate mapping, neighbours and link names.
// Used by the planner, StageRunner, codec plans and ctl.
#include "grid/topology.h"

#include <algorithm>

#include "grid/link_name.h"

namespace lh {

std::string PipelineLink::name() const {
  return std::to_string(from) + "-" + std::to_string(to);
}

std::string link_list_string(const std::vector<PipelineLink>& links) {
  if (links.empty()) return "none (a single stage has no pipeline links)";
  std::string out;
  for (size_t i = 0; i < links.size(); ++i) out += (i ? ", " : "") + links[i].name();
  return out;
}

Result<Topology> Topology::create(int workers, int pp, int tp, int dp) {
  auto factor = [](const char* name, int v) -> Status {
    if (v < 1)
      return invalid_argument(std::string("topology: --") + name + " must be at least 1, got " + std::to_string(v));
    return Status::Ok();
  };
  LH_RETURN_IF_ERROR(factor("pp", pp));
  LH_RETURN_IF_ERROR(factor("tp", tp));
  LH_RETURN_IF_ERROR(factor("dp", dp));
  if (workers < 1) return invalid_argument("topology: --workers must be at least 1, got " + std::to_string(workers));
  const int64_t product = int64_t(pp) * tp * dp;
  if (product != workers)
    return invalid_argument("topology: --workers " + std::to_string(workers) +
                            " does not equal pp × tp × dp = " + std::to_string(pp) + " × " + std::to_string(tp) +
                            " × " + std::to_string(dp) + " = " + std::to_string(product));
  return Topology(pp, tp, dp);
}

int Topology::rank_of(const WorkerCoord& c) const {
  LH_ASSERT(c.stage >= 0 && c.stage < pp_ && c.tp >= 0 && c.tp < tp_ && c.dp >= 0 && c.dp < dp_,
            "coordinate outside " + describe());
  return rank_in_grid(tp_, dp_, c);
}

WorkerCoord Topology::coord_of(int rank) const {
  LH_ASSERT(rank >= 0 && rank < workers(), "rank " + std::to_string(rank) + " outside " + describe());
  WorkerCoord c;
  c.tp = rank % tp_;
  c.dp = (rank / tp_) % dp_;
  c.stage = rank / (tp_ * dp_);
  return c;
}

Result<int> Topology::checked_rank_of(const WorkerCoord& c) const {
  if (c.stage < 0 || c.stage >= pp_)
    return out_of_range("stage " + std::to_string(c.stage) + " is outside 0.." + std::to_string(pp_ - 1));
  if (c.tp < 0 || c.tp >= tp_)
    return out_of_range("tp index " + std::to_string(c.tp) + " is outside 0.." + std::to_string(tp_ - 1));
  if (c.dp < 0 || c.dp >= dp_)
    return out_of_range("dp index " + std::to_string(c.dp) + " is outside 0.." + std::to_string(dp_ - 1));
  return rank_of(c);
}

Result<WorkerCoord> Topology::checked_coord_of(int rank) const {
  if (rank < 0 || rank >= workers())
    return out_of_range("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(workers() - 1) + " (" +
                        describe() + ")");
  return coord_of(rank);
}

std::optional<int> Topology::prev_stage_rank(int rank) const {
  WorkerCoord c = coord_of(rank);
  if (c.stage == 0) return std::nullopt;
  --c.stage;
  return rank_of(c);
}

std::optional<int> Topology::next_stage_rank(int rank) const {
  WorkerCoord c = coord_of(rank);
  if (c.stage == pp_ - 1) return std::nullopt;
  ++c.stage;
  return rank_of(c);
}

std::vector<int> Topology::tp_group(int rank) const {
  WorkerCoord c = coord_of(rank);
  std::vector<int> out;
  for (int t = 0; t < tp_; ++t) out.push_back(rank_of({c.stage, t, c.dp}));
  return out;
}

std::vector<int> Topology::dp_group(int rank) const {
  WorkerCoord c = coord_of(rank);
  std::vector<int> out;
  for (int d = 0; d < dp_; ++d) out.push_back(rank_of({c.stage, c.tp, d}));
  return out;
}

std::vector<int> Topology::stage_ranks(int stage) const {
  LH_ASSERT(stage >= 0 && stage < pp_, "stage outside " + describe());
  std::vector<int> out;
  for (int r = 0; r < workers(); ++r)
    if (coord_of(r).stage == stage) out.push_back(r);
  return out;
}

std::vector<PipelineLink> Topology::pipeline_links() const {
  std::vector<PipelineLink> out;
  for (int s = 0; s + 1 < pp_; ++s) out.push_back({s, s + 1});
  return out;
}

Result<PipelineLink> Topology::parse_link(const std::string& text) const {
  // One grammar for every link a user names (grid/link_name.h); here it must name one whole pipeline link, all
  // its replicas and shards, with no direction.
  const std::string links = link_list_string(pipeline_links());
  auto fail = [&](const std::string& why) { return invalid_argument(why + "; links of this job: " + links); };
  if (text.find(':') != std::string::npos)
    return fail("link '" + text + "': expected STAGE-STAGE such as 0-1, without a direction");
  auto sel = parse_link_selector(*this, text);
  if (!sel.ok()) {
    std::string why = sel.status().message();  // "link 'TEXT': why"
    const std::string where = "link '" + text + "': ";
    if (why.rfind(where, 0) == 0) why = why.substr(where.size());
    const std::string grid = why.find(describe()) == std::string::npos ? " (" + describe() + ")" : "";
    return fail("link '" + text + "' is not a pipeline link of this job" + grid + ": " + why);
  }
  const WorkerCoord lo = coord_of(sel->pairs.front().first), hi = coord_of(sel->pairs.front().second);
  const size_t whole_link = size_t(2) * tp_ * dp_;  // both directions of every replica's and shard's pair
  if (sel->kind != "pipeline" || sel->pairs.size() != whole_link)
    return fail("link '" + text + "' is not a pipeline link of this job (" + describe() +
                "): name it by its stages, such as 0-1");
  return PipelineLink{std::min(lo.stage, hi.stage), std::max(lo.stage, hi.stage)};
}

std::optional<PipelineLink> Topology::link_between(int rank_a, int rank_b) const {
  WorkerCoord a = coord_of(rank_a), b = coord_of(rank_b);
  if (a.tp != b.tp || a.dp != b.dp) return std::nullopt;
  if (b.stage == a.stage + 1) return PipelineLink{a.stage, b.stage};
  if (a.stage == b.stage + 1) return PipelineLink{b.stage, a.stage};
  return std::nullopt;
}

std::string Topology::describe() const {
  return std::to_string(workers()) + (workers() == 1 ? " worker" : " workers") + " = pp " + std::to_string(pp_) +
         " × tp " + std::to_string(tp_) + " × dp " + std::to_string(dp_);
}

}  // namespace lh
