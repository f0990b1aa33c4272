// The whole model's squared gradient norm from every stage's and shard's part, summed in rank order on every worker.
// Used by runtime/stage_runner.cpp.
#include "comm/grad_norm.h"

#include <cstring>

namespace lh {

AllPairsGradNorm::AllPairsGradNorm(const Topology& topology, int rank, DataPlane& plane,
                                   std::chrono::milliseconds receive_timeout)
    : rank_(rank), plane_(&plane), receive_timeout_(receive_timeout) {
  const WorkerCoord me = topology.coord_of(rank);
  for (int s = 0; s < topology.pp(); ++s)
    for (int t = 0; t < topology.tp(); ++t) stage_ranks_.push_back(topology.rank_of({s, t, me.dp}));
}

Result<double> AllPairsGradNorm::total_sq(int64_t step, double local_sq) {
  LH_RETURN_IF_ERROR(post(step, local_sq));
  return collect(step);
}

Status AllPairsGradNorm::post(int64_t step, double local_sq) {
  // The sends of an earlier exchange: long done by now; a failure surfaces here.
  std::vector<Transfer> still;
  for (const Transfer& t : sent_) {
    if (!t.done()) {
      still.push_back(t);
      continue;
    }
    Status st = t.status();
    if (!st.ok())
      return st.prepend("sending the gradient norm of step " + std::to_string(sent_step_) + " to rank " +
                        std::to_string(t.peer()));
  }
  sent_ = std::move(still);
  const Tag tag = make_tag(uint32_t(step), kSlot, Role::kOther);
  Bytes mine(sizeof(double));
  std::memcpy(mine.data(), &local_sq, sizeof(double));
  Posted& p = posted_[step];
  p.local_sq = local_sq;
  p.in.assign(stage_ranks_.size(), Transfer());
  for (size_t s = 0; s < stage_ranks_.size(); ++s) {
    if (stage_ranks_[s] == rank_) continue;
    sent_.push_back(plane_->send(stage_ranks_[s], tag, mine));
    p.in[s] = plane_->recv(stage_ranks_[s], tag);
  }
  sent_step_ = step;
  return Status::Ok();
}

Transfer AllPairsGradNorm::pending(int64_t step) const {
  auto it = posted_.find(step);
  if (it == posted_.end()) return Transfer();
  for (const Transfer& t : it->second.in)
    if (t.valid() && !t.done()) return t;
  return Transfer();
}

Result<double> AllPairsGradNorm::collect(int64_t step) {
  auto it = posted_.find(step);
  if (it == posted_.end()) return internal_error("gradient norm of step " + std::to_string(step) + " was not posted");
  Posted p = std::move(it->second);
  posted_.erase(it);
  // One order on every worker (stage 0's shards first), so every worker clips with the same bits.
  double total = 0;
  for (size_t s = 0; s < stage_ranks_.size(); ++s) {
    const int peer = stage_ranks_[s];
    if (peer == rank_) {
      total += p.local_sq;
      continue;
    }
    Status st = p.in[s].wait(receive_timeout_);
    if (!st.ok()) return st.prepend("waiting for the gradient norm of rank " + std::to_string(peer));
    Bytes b = p.in[s].take();
    if (b.size() != sizeof(double))
      return corrupt("gradient norm from rank " + std::to_string(peer) + " has " + std::to_string(b.size()) +
                     " bytes, expected 8");
    double v = 0;
    std::memcpy(&v, b.data(), sizeof(double));
    total += v;
  }
  return total;
}

}  // namespace lh
