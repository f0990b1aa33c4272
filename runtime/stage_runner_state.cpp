// StageRunner::save_state / load_state: one worker's shard of a job checkpoint — its parameters and AdamW moments,
// every codec stream state it holds (pipeline links, the dp reducer's, the tp group's), the codecs in force and
// scheduled, --sync delayed's averages in flight and last update, and the data sampler's position. Used by
// `longhaul worker` (job checkpoints and rollbacks).
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/vector.hpp>
#include <sstream>

#include "core/checkpoint.h"
#include "runtime/stage_runner.h"

namespace lh {
namespace {

// 2: --sync delayed's averages in flight (in the reducer's bytes) and last update.
constexpr uint32_t kShardVersion = 2;

struct StageShard {
  uint32_t version = kShardVersion;
  int64_t step = 0;
  int32_t rank = -1, pp = 0, tp = 0, dp = 0;
  int32_t first_block = 0, end_block = 0;
  Rng data_rng;
  std::vector<CheckpointGroup> groups;
  BoundaryStreams links;
  bool has_reducer = false;
  std::string reducer;
  std::map<ProcessGroup::StreamKey, compress::StreamState> tp_streams;
  std::string tp_spec;
  std::map<int64_t, std::string> grad_changes, tp_changes;  // scheduled, not yet applied
  std::vector<std::vector<float>> last_update;              // --sync delayed with predict, per group
  template <class Archive>
  void serialize(Archive& ar) {
    ar(version);
    if (version != kShardVersion) return;  // another layout: load_state names the version
    ar(step, rank, pp, tp, dp, first_block, end_block, data_rng, groups, links, has_reducer, reducer, tp_streams,
       tp_spec, grad_changes, tp_changes, last_update);
  }
};

}  // namespace

Result<std::string> StageRunner::save_state(const Rng& data_rng) {
  if (async_)
    return invalid_argument(
        "the async schedule keeps two steps in flight; its state is not saved (yet): run it "
        "without --checkpoint-dir");
  if (predicted_) return internal_error("stage state: saved while the weights are predicted ones");
  StageShard sh;
  sh.step = last_.step;
  sh.rank = rank_;
  sh.pp = topology_.pp();
  sh.tp = topology_.tp();
  sh.dp = topology_.dp();
  sh.first_block = span_.first_block;
  sh.end_block = span_.end_block();
  sh.data_rng = data_rng;
  sh.groups = opt_.save_groups(model_.param_groups());
  sh.links = boundary_.streams();
  if (reducer_) {
    sh.has_reducer = true;
    LH_ASSIGN_OR_RETURN(sh.reducer, reducer_->save_state());
  }
  if (tp_group_) sh.tp_streams = tp_group_->stream_states();
  sh.tp_spec = tp_spec_;
  sh.grad_changes = grad_changes_;
  sh.tp_changes = tp_changes_;
  // The weight prediction of the steps after this one extrapolates the last update.
  sh.last_update = last_update_;
  return to_portable_bytes(sh);
}

Result<Rng> StageRunner::load_state(const std::string& bytes) {
  StageShard sh;
  LH_RETURN_IF_ERROR(from_portable_bytes(bytes, &sh, "stage state"));
  const std::string where = "stage state of rank " + std::to_string(sh.rank) + ": ";
  if (sh.version != kShardVersion)
    return corrupt(where + "format version " + std::to_string(sh.version) + ", this build reads " +
                   std::to_string(kShardVersion));
  // An --elastic job that lost replicas starts from a shard of its bigger grid: the same stage and tp shard of a
  // replica still in the job (the coordinator picks it). Its collectives' codec streams are the old group's: they
  // start afresh (below).
  bool regrid = false;
  if (sh.pp == topology_.pp() && sh.tp == topology_.tp() && sh.dp > topology_.dp() && slices_ > topology_.dp() &&
      sh.dp <= slices_) {
    auto old = Topology::create(sh.pp * sh.tp * sh.dp, sh.pp, sh.tp, sh.dp);
    auto was = old.ok() ? old->checked_coord_of(sh.rank) : Result<WorkerCoord>(old.status());
    const WorkerCoord me = topology_.coord_of(rank_);
    regrid = was.ok() && was->stage == me.stage && was->tp == me.tp;
  }
  if (!regrid && (sh.rank != rank_ || sh.pp != topology_.pp() || sh.tp != topology_.tp() || sh.dp != topology_.dp()))
    return invalid_argument(where + "saved for rank " + std::to_string(sh.rank) + " of a pp " + std::to_string(sh.pp) +
                            " × tp " + std::to_string(sh.tp) + " × dp " + std::to_string(sh.dp) +
                            " grid; this is rank " + std::to_string(rank_) + " of pp " +
                            std::to_string(topology_.pp()) + " × tp " + std::to_string(topology_.tp()) + " × dp " +
                            std::to_string(topology_.dp()));
  if (sh.first_block != span_.first_block || sh.end_block != span_.end_block())
    return invalid_argument(where + "holds blocks [" + std::to_string(sh.first_block) + ", " +
                            std::to_string(sh.end_block) + "), this stage [" + std::to_string(span_.first_block) +
                            ", " + std::to_string(span_.end_block()) + ")");
  if (sh.step < 0 || sh.step >= (int64_t(1) << Tag::kStepBits))
    return corrupt(where + "step " + std::to_string(sh.step) + " is out of range");
  if (sh.has_reducer != bool(reducer_) && !(regrid && !reducer_))
    return invalid_argument(where + (sh.has_reducer ? "has" : "lacks") + " a dp reducer's state; this job " +
                            (reducer_ ? "has" : "has no") + " reducer");
  auto groups = model_.param_groups();
  if (sh.groups.size() != groups.size())
    return invalid_argument(where + std::to_string(sh.groups.size()) + " parameter groups, this stage has " +
                            std::to_string(groups.size()));
  for (size_t i = 0; i < groups.size(); ++i) {
    const CheckpointGroup& g = sh.groups[i];
    const size_t n = size_t(groups[i]->numel);
    if (g.name != groups[i]->name || g.params.size() != n || g.adam_m.size() != n || g.adam_v.size() != n)
      return invalid_argument(where + "group '" + g.name + "' (" + std::to_string(g.params.size()) +
                              " values) does not match this stage's '" + groups[i]->name + "' (" + std::to_string(n) +
                              " values)");
  }
  if (!sh.last_update.empty()) {
    if (!options_.sync.delayed() || !options_.sync.predict)
      return invalid_argument(where + "holds the last update of --sync delayed's weight prediction; this job runs " +
                              "--sync " + options_.sync.to_string());
    if (sh.last_update.size() != groups.size())
      return corrupt(where + "the last update has " + std::to_string(sh.last_update.size()) +
                     " parameter groups, this stage has " + std::to_string(groups.size()));
    for (size_t i = 0; i < groups.size(); ++i)
      if (sh.last_update[i].size() != size_t(groups[i]->numel))
        return corrupt(where + "the last update of group '" + groups[i]->name + "' has " +
                       std::to_string(sh.last_update[i].size()) + " values, the group " +
                       std::to_string(groups[i]->numel));
  }
  Status links_ok = boundary_.check_streams(sh.links);
  if (!links_ok.ok()) return links_ok.prepend(where.substr(0, where.size() - 2));
  // Everything is checked (the reducer checks its own state and changes nothing when it refuses it); from here on
  // the state is replaced.
  if (reducer_) {
    std::map<int, ParamGroup*> buckets;
    for (ParamGroup* g : groups) buckets[bucket_of(*g)] = g;
    Status s = reducer_->load_state(sh.reducer, buckets, sh.step, /*keep_streams=*/!regrid);
    if (!s.ok()) return s.prepend(where.substr(0, where.size() - 2));
  }
  LH_RETURN_IF_ERROR(opt_.load_groups(sh.groups, groups, model_.device()));
  boundary_.set_streams(std::move(sh.links));
  if (tp_group_) tp_group_->set_stream_states(std::move(sh.tp_streams));
  tp_spec_ = sh.tp_spec;
  grad_changes_ = sh.grad_changes;
  tp_changes_ = sh.tp_changes;
  last_update_ = std::move(sh.last_update);
  last_ = StageStepResult{};
  last_.step = sh.step;
  return sh.data_rng;
}

}  // namespace lh
