// Tests of the pre-flight probe (comm/peer_probe.h) over in-process planes on threads: which pairs a grid
// probes, a shaped link's round trip and rate read back, an unreachable peer named within the timeout, and a
// cancelled probe.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "comm/peer_probe.h"
#include "tests/common/local_data_plane.h"
#include "tests/common/result_value.h"
#include "transport/link_shaper.h"

namespace lh {
namespace {

using namespace std::chrono_literals;

TEST(PeerProbe, TalkingPairsAreEachReplicasMembersAndEachStagesReplicas) {
  // pp 3: every two stages (neighbours carry activations, all carry the gradient norm).
  EXPECT_EQ(talking_pairs(value_of(Topology::create(3, 3))),
            (std::vector<std::pair<int, int>>{{0, 1}, {0, 2}, {1, 2}}));
  // pp 2 × dp 2: rank = stage·dp + d. Replica 0 = {0, 2}, replica 1 = {1, 3}; stage 0's dp group {0, 1}, stage 1's
  // {2, 3}. 0-3 and 1-2 (other replica, other stage) never talk.
  EXPECT_EQ(talking_pairs(value_of(Topology::create(4, 2, 1, 2))),
            (std::vector<std::pair<int, int>>{{0, 1}, {0, 2}, {1, 3}, {2, 3}}));
  EXPECT_TRUE(talking_pairs(value_of(Topology::create(1, 1))).empty());
}

// Runs every rank's probe on its own thread; rank r's plane is shaped by shapes[r] (one shape for all its sends).
std::vector<Result<std::vector<PeerProbe>>> run_probes(const Topology& t, const std::vector<LinkShape>& shapes,
                                                       const ProbeOptions& o, int absent = -1) {
  auto fabric = std::make_shared<LocalFabric>();
  const int n = t.workers();
  std::vector<std::unique_ptr<DataPlane>> planes;
  for (int r = 0; r < n; ++r) {
    std::unique_ptr<DataPlane> p = std::make_unique<LocalDataPlane>(fabric, r, n);
    if (shapes[size_t(r)].rate_bps > 0 || shapes[size_t(r)].delay.count() > 0)
      p = std::make_unique<LinkShaper>(std::move(p), shapes[size_t(r)]);
    planes.push_back(std::move(p));
  }
  std::vector<Result<std::vector<PeerProbe>>> out(size_t(n), invalid_argument("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    if (r != absent) threads.emplace_back([&, r] { out[size_t(r)] = probe_peers(*planes[size_t(r)], t, r, o); });
  for (auto& th : threads) th.join();
  return out;
}

TEST(PeerProbe, AShapedLinkReadsBackItsRoundTripAndRate) {
  const Topology t = value_of(Topology::create(2, 2));
  // Both ways 8 Mbit/s with 15 ms one-way delay: a round trip of 30 ms plus an 8-byte message's time.
  const LinkShape slow{8e6, std::chrono::microseconds(15000)};
  auto r = run_probes(t, {slow, slow}, ProbeOptions{});
  for (int rank = 0; rank < 2; ++rank) {
    const auto& probes = value_of(r[size_t(rank)]);
    ASSERT_EQ(probes.size(), 1u);
    const PeerProbe& p = probes[0];
    EXPECT_EQ(p.peer, 1 - rank);
    EXPECT_TRUE(p.ok) << p.error;
    EXPECT_GE(p.rtt_ms, 29.f);
    EXPECT_LT(p.rtt_ms, 80.f);
    // The rate comes from two bursts' difference, which takes out the round trip; loose bounds for a loaded host.
    EXPECT_GT(p.send_mbps, 8 * 0.6f);
    EXPECT_LT(p.send_mbps, 8 * 1.5f);
    EXPECT_GT(p.probe_bytes, 4096u);
  }
}

TEST(PeerProbe, NonNeighboursGetARoundTripOnly) {
  const Topology t = value_of(Topology::create(3, 3));
  auto r = run_probes(t, std::vector<LinkShape>(3), ProbeOptions{});
  const auto& p0 = value_of(r[0]);
  ASSERT_EQ(p0.size(), 2u);
  EXPECT_EQ(p0[0].peer, 1);
  EXPECT_GT(p0[0].send_mbps, 0.f);  // pipeline neighbours: a burst
  EXPECT_EQ(p0[1].peer, 2);
  EXPECT_TRUE(p0[1].ok);
  EXPECT_EQ(p0[1].send_mbps, 0.f);  // stages 0 and 2 only exchange the gradient norm
  EXPECT_GT(p0[1].rtt_ms, 0.f);
}

TEST(PeerProbe, AnAbsentPeerIsNamedWithinTheTimeout) {
  const Topology t = value_of(Topology::create(3, 3));
  ProbeOptions o;
  o.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_probes(t, std::vector<LinkShape>(3), o, /*absent=*/1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Rank 0's first pair is 0-1: it fails there and stops (the coordinator ends the job on the first failure).
  const auto& p0 = value_of(r[0]);
  ASSERT_EQ(p0.size(), 1u);
  EXPECT_EQ(p0[0].peer, 1);
  EXPECT_FALSE(p0[0].ok);
  EXPECT_NE(p0[0].error.find("rank 1: no answer within 300 ms"), std::string::npos) << p0[0].error;
  const auto& p2 = value_of(r[2]);
  ASSERT_FALSE(p2.empty());
  EXPECT_FALSE(p2.back().ok);
}

TEST(PeerProbe, ACancelledProbeReturnsAborted) {
  const Topology t = value_of(Topology::create(2, 2));
  ProbeOptions o;
  o.cancelled = [] { return true; };
  auto r = run_probes(t, std::vector<LinkShape>(2), o, /*absent=*/1);
  EXPECT_EQ(r[0].status().code(), StatusCode::kAborted) << r[0].status().to_string();
}

}  // namespace
}  // namespace lh
