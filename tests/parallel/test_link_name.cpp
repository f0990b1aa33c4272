// Tests for link_name / link_kind: the names of docs/grid.md §1 for pipeline, dp, tp and cross pairs, with the
// axes of size 1 left out (a pipeline-only job keeps "0-1"). Label `parallel`.
#include <gtest/gtest.h>

#include "parallel/link_name.h"
#include "tests/parallel/result_value.h"

namespace lh {
namespace {

TEST(LinkName, PipelineOnlyJobsKeepStageNumbers) {
  Topology t = value_of(Topology::pipeline(4));
  EXPECT_EQ(link_name(t, 1, 2), "1-2:fwd");
  EXPECT_EQ(link_name(t, 2, 1), "1-2:bwd");
  EXPECT_EQ(link_name(t, 0, 3), "0-3:fwd");
  EXPECT_EQ(link_kind(t, 1, 2), "pipeline");
  EXPECT_EQ(link_kind(t, 0, 3), "cross");  // the norm between non-neighbours
}

TEST(LinkName, ReplicasAndShardsAreNamedByTheirCoordinates) {
  // pp2 × dp2: ranks 0, 1 are stage 0's replicas, 2, 3 stage 1's.
  Topology g = value_of(Topology::create(4, 2, 1, 2));
  EXPECT_EQ(link_name(g, 0, 1), "s0d0-s0d1:fwd");
  EXPECT_EQ(link_name(g, 1, 0), "s0d0-s0d1:bwd");
  EXPECT_EQ(link_kind(g, 0, 1), "dp");
  EXPECT_EQ(link_name(g, 0, 2), "s0d0-s1d0:fwd");
  EXPECT_EQ(link_name(g, 3, 1), "s0d1-s1d1:bwd");
  EXPECT_EQ(link_kind(g, 3, 1), "pipeline");
  EXPECT_EQ(link_kind(g, 0, 3), "cross");
  // dp only: no stage axis.
  Topology d = value_of(Topology::create(4, 1, 1, 4));
  EXPECT_EQ(link_name(d, 3, 0), "d0-d3:bwd");  // the ring's wrap pair
  EXPECT_EQ(link_name(d, 2, 3), "d2-d3:fwd");
  // pp2 · tp2 · dp2 (the table of docs/grid.md §1).
  Topology f = value_of(Topology::create(8, 2, 2, 2));
  EXPECT_EQ(link_name(f, 4, 5), "s1d0t0-s1d0t1:fwd");
  EXPECT_EQ(link_kind(f, 4, 5), "tp");
  EXPECT_EQ(link_name(f, 2, 6), "s0d1t0-s1d1t0:fwd");
  EXPECT_EQ(link_name(f, 1, 4), "s0d0t1-s1d0t0:fwd");
  EXPECT_EQ(link_kind(f, 1, 4), "cross");
}

}  // namespace
}  // namespace lh
