// The whole model's squared gradient norm from every stage's and shard's part, summed in rank order on every worker.
// Used by parallel/stage_runner.cpp.
#include "parallel/grad_norm.h"

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
  for (const Transfer& t : sent_) {
    Status st = t.wait(receive_timeout_);
    if (!st.ok())
      return st.prepend("sending the gradient norm of step " + std::to_string(sent_step_) + " to rank " +
                        std::to_string(t.peer()));
  }
  sent_.clear();
  const Tag tag = make_tag(uint32_t(step), kSlot, Role::kOther);
  Bytes mine(sizeof(double));
  std::memcpy(mine.data(), &local_sq, sizeof(double));
  const size_t n = stage_ranks_.size();
  std::vector<Transfer> out(n), in(n);
  for (size_t s = 0; s < n; ++s) {
    if (stage_ranks_[s] == rank_) continue;
    out[s] = plane_->send(stage_ranks_[s], tag, mine);
    in[s] = plane_->recv(stage_ranks_[s], tag);
  }
  // One order on every worker (stage 0's shards first), so every worker clips with the same bits.
  double total = 0;
  for (size_t s = 0; s < n; ++s) {
    const int peer = stage_ranks_[s];
    if (peer == rank_) {
      total += local_sq;
      continue;
    }
    Status st = in[s].wait(receive_timeout_);
    if (!st.ok()) return st.prepend("waiting for the gradient norm of rank " + std::to_string(peer));
    Bytes b = in[s].take();
    if (b.size() != sizeof(double))
      return corrupt("gradient norm from rank " + std::to_string(peer) + " has " + std::to_string(b.size()) +
                     " bytes, expected 8");
    double v = 0;
    std::memcpy(&v, b.data(), sizeof(double));
    total += v;
  }
  for (size_t s = 0; s < n; ++s)
    if (out[s].valid()) sent_.push_back(out[s]);
  sent_step_ = step;
  return total;
}

}  // namespace lh
