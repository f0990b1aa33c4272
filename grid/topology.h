// defines: lh::Topology — the pp × tp × dp grid of workers (rank ↔ stage, tensor shard, replica),
// pipeline neighbours and the names of pipeline links ("1-2"). Used by the planner, StageRunner, ctl.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

// Where one worker sits in the grid. All indices are 0-based.
struct WorkerCoord {
  int stage = 0;  // pipeline stage, 0 .. pp-1
  int tp = 0;     // tensor-parallel shard, 0 .. tp-1
  int dp = 0;     // data-parallel replica, 0 .. dp-1
  bool operator==(const WorkerCoord& o) const { return stage == o.stage && tp == o.tp && dp == o.dp; }
};

// A pipeline link joins stage `from` to stage `from + 1`; activations flow forward over it and
// activation gradients backward. Its name is "from-to", e.g. "1-2" (stage numbers, 0-based). With
// tp or dp > 1 one pipeline link stands for every worker pair (stage s, t, d) → (stage s+1, t, d).
struct PipelineLink {
  int from = 0;
  int to = 1;
  std::string name() const;
  bool operator==(const PipelineLink& o) const { return from == o.from && to == o.to; }
  bool operator<(const PipelineLink& o) const { return from < o.from; }
};

class Topology {
 public:
  // Validates workers == pp·tp·dp with every factor ≥ 1; the error names the factor or the mismatch.
  static Result<Topology> create(int workers, int pp, int tp = 1, int dp = 1);
  // A pipeline-only grid of `pp` workers.
  static Result<Topology> pipeline(int pp) { return create(pp, pp, 1, 1); }

  int workers() const { return pp_ * tp_ * dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int dp() const { return dp_; }

  // Ranks order tp fastest, then dp, then stage: the shards of one stage replica are neighbours
  // (they exchange partial sums every layer, so they belong on one machine when possible).
  // Both functions assert on out-of-grid input (our own invariant); use checked_* for user input.
  int rank_of(const WorkerCoord& c) const;
  WorkerCoord coord_of(int rank) const;
  // The rank formula itself, (stage · dp + replica) · tp + shard, for a pp × tp × dp grid not (yet) made a Topology
  // (the planner's candidate grids); rank_of() is this with its bounds asserted.
  static int rank_in_grid(int tp, int dp, const WorkerCoord& c) { return (c.stage * dp + c.dp) * tp + c.tp; }
  Result<int> checked_rank_of(const WorkerCoord& c) const;
  Result<WorkerCoord> checked_coord_of(int rank) const;

  // The worker that feeds `rank` activations (stage − 1, same tp and dp), or none on stage 0.
  std::optional<int> prev_stage_rank(int rank) const;
  // The worker `rank` sends activations to (stage + 1, same tp and dp), or none on the last stage.
  std::optional<int> next_stage_rank(int rank) const;
  // All ranks of rank's stage replica (same stage and dp), in tp order; includes rank.
  std::vector<int> tp_group(int rank) const;
  // All replicas of rank's stage shard (same stage and tp), in dp order; includes rank.
  std::vector<int> dp_group(int rank) const;
  // Ranks of one stage, in rank order.
  std::vector<int> stage_ranks(int stage) const;

  // The pp − 1 pipeline links, in stage order.
  std::vector<PipelineLink> pipeline_links() const;
  // "1-2" → the link; errors name the text and list the links this grid has.
  Result<PipelineLink> parse_link(const std::string& text) const;
  // The pipeline link between two worker ranks, if they are pipeline neighbours (either order).
  std::optional<PipelineLink> link_between(int rank_a, int rank_b) const;

  std::string describe() const;  // "8 workers = pp 4 × tp 2 × dp 1"

 private:
  Topology(int pp, int tp, int dp) : pp_(pp), tp_(tp), dp_(dp) {}
  int pp_ = 1, tp_ = 1, dp_ = 1;
};

// "0-1, 1-2, 2-3" (or "none" for a single stage): for error messages and status lines.
std::string link_list_string(const std::vector<PipelineLink>& links);

}  // namespace lh
