// defines: CollectiveAlgo (how a process group all-reduces) and the one direct-vs-mesh rule of kAuto, which the
// collectives (comm/process_group.cpp) follow and the planner's cost model (plan/planner.cpp) prices.
#pragma once

#include <cstdint>

namespace lh {

enum class CollectiveAlgo : uint8_t {
  kAuto,    // direct for 2 members or a compressed tensor under 256 KiB (latency-bound on a WAN), else mesh
  kRing,    // bytes per rank 2(n−1)/n of the tensor, all on one link; 2(n−1) hops of latency
  kDirect,  // every rank sends its whole (compressed) tensor to every other; 1 hop of latency
  // Reduce-scatter to chunk owners, then all-gather from them, each phase one hop over every pair: bytes per rank
  // 2(n−1)/n of the tensor as in a ring (the same on a shared uplink), but only 2/n of it on each pair's link and
  // 2 hops of latency instead of 2(n−1). Direct for 2 members (it would send as much) or fewer values than members.
  kMesh,
};
const char* collective_algo_name(CollectiveAlgo a);

// Below this many packet bytes a WAN all-reduce is bound by latency (256 KiB is 100 ms at 20 Mbit/s, about two
// hops of a long link): one hop (direct) beats the mesh's two although each pair link carries the whole packet
// instead of 2/n of it (at 50 ms and 20 Mbit/s the two break even near 250 KiB for n = 4).
constexpr int64_t kDirectBelowBytes = 256 * 1024;

// kAuto's choice for `members` ranks all-reducing a packet of `packet_bytes`: direct (true) or mesh (false).
inline bool auto_picks_direct(int members, double packet_bytes) {
  return members <= 2 || packet_bytes < double(kDirectBelowBytes);
}

}  // namespace lh
