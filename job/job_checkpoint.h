// defines: lh::JobCheckpointStore — the coordinator's side of distributed checkpoints: each worker's shard is
// written durably as it arrives; a step's manifest (step, grid, the job's resume hash, each shard's size and
// xxHash64, the live codec changes) is committed only once every shard of that step is on disk; old steps are
// pruned; loading takes the newest committed step whose shards verify, falling back with a warning naming why.
// Used by JobCoordinator (`longhaul coordinator` / `launch` --checkpoint-dir, --resume).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

// Layout: DIR/step_00000100/rank_0003.shard for each worker and DIR/step_00000100/manifest.json, written last
// (atomically) — a step directory without a manifest is an unfinished checkpoint and is never loaded.
struct JobCheckpoint {
  int64_t step = 0;
  nlohmann::json manifest;          // as committed
  std::vector<std::string> shards;  // by rank
};

class JobCheckpointStore {
 public:
  // `workers` shards make a checkpoint; `resume_hash` is the job's (JobConfig::resume_hash); `keep` ≥ 1
  // committed checkpoints are kept. Creates the directory.
  static Result<std::unique_ptr<JobCheckpointStore>> open(const std::string& dir, int workers,
                                                          const std::string& resume_hash, int keep);

  // Worker `rank`'s shard of `step`, written durably. Returns true when it completed the step's set (the caller
  // then commits). A step at or before the last committed one, a rank out of range or a second shard of a rank
  // is refused.
  // A rank with shards in kMaxPendingStepsPerRank unfinished steps is refused one for another (replicas of a DiLoCo
  // round may run a few checkpoints apart; a member parking shards may not fill the disk).
  Result<bool> add_shard(int64_t step, int rank, const std::string& bytes);
  static constexpr int kMaxPendingStepsPerRank = 8;
  // Writes the manifest of `step` (every shard present) with `extra` fields merged in, then prunes: committed
  // steps beyond the newest `keep`, and unfinished steps older than the newest committed one.
  Status commit(int64_t step, const nlohmann::json& extra);
  // A committed checkpoint a worker could not load (its shard verifies but does not parse there): moved aside as
  // DIR/step_N.unusable with `why` in its why.txt, so the next load_latest takes an older one.
  Status set_aside(int64_t step, const std::string& why);
  // Forgets (and deletes) shards of steps after `step` that were never committed (a rollback abandons them).
  void discard_uncommitted_after(int64_t step);
  int64_t last_committed() const;  // 0 when none

  // The newest committed checkpoint that verifies (manifest parses, same grid size and resume hash, every shard
  // present with its recorded size and hash). Each one skipped adds a warning naming the step and why; kNotFound
  // when none is usable. Becomes the store's last committed step.
  // `fits` (when set) judges a manifest's grid instead of "the same number of workers": an --elastic job's grid
  // shrinks, and a checkpoint of its bigger grid still fits. The checkpoint then has the manifest's worker count.
  using GridCheck = std::function<Status(const nlohmann::json& manifest)>;
  Result<JobCheckpoint> load_latest(std::vector<std::string>* warnings, const GridCheck& fits = nullptr);
  // The job now has `workers` workers (an --elastic job that lost replicas): shards of steps not yet committed go.
  void set_workers(int workers);
  const std::string& dir() const { return dir_; }

  static std::string step_dir_name(int64_t step);  // "step_00000100"

 private:
  JobCheckpointStore() = default;
  std::string step_dir(int64_t step) const { return dir_ + "/" + step_dir_name(step); }
  std::vector<int64_t> steps_on_disk(bool committed) const;
  Result<JobCheckpoint> load(int64_t step, const GridCheck& fits) const;

  std::string dir_, hash_;
  int workers_ = 0, keep_ = 3;
  mutable std::mutex mu_;
  int64_t committed_ = 0;
  std::map<int64_t, std::map<int, std::pair<uint64_t, uint64_t>>> pending_;  // step → rank → (bytes, xxh64)
};

}  // namespace lh
