// defines: how a stage's heads (and the MLP units that follow them) split across its tensor-parallel shards —
// --tp-split "" (even), "3:1" (weights) or "speed" (the workers' measured compute speed) — and the TpShard of
// each shard. Used by the job config, the coordinator's plan and StageRunner.
#pragma once

#include <string>
#include <vector>

#include "core/gpt.h"
#include "core/status.h"

namespace lh {

// Heads per shard for --tp-split `text` with `tp` shards of a model with `heads` heads: "" gives each shard
// heads/tp; "W0:W1:…" (tp positive integers) gives shard t heads·Wt/ΣW. "speed" is the coordinator's to settle
// (tp_heads_by_speed), and is refused here. Errors name the flag and say how to fix the split: heads must divide.
Result<std::vector<int>> tp_heads(const std::string& text, int tp, int heads);

// Heads per shard in proportion to `speeds` (one per shard, e.g. the slowest worker holding each shard index),
// each at least 1, rounded by largest remainder; an even split when any speed is unknown (≤ 0 or not finite).
Result<std::vector<int>> tp_heads_by_speed(const std::vector<double>& speeds, int heads);

// "3:1": the split as --tp-split writes it.
std::string tp_split_string(const std::vector<int>& heads_per_shard);

// The tp all-reduces one step of a stage runs — training's four per block and microbatch, then evaluation's two
// per block and batch — each named by its sequence number in the tag's 12-bit slot.
inline int64_t tp_all_reduces_per_step(int blocks, int microbatches, int eval_batches) {
  return int64_t(kTpSitesPerBlock) * blocks * microbatches + int64_t(kTpSitesPerBlock / 2) * blocks * eval_batches;
}

// Shard t's heads [Σ_{u<t} h_u, Σ_{u≤t} h_u) of the split.
TpShard tp_shard(const std::vector<int>& heads_per_shard, int t);

}  // namespace lh
