// Tests for link_name / link_kind: the names of docs/grid.md §1 for pipeline, dp, tp and cross pairs, with the
// axes of size 1 left out (a pipeline-only job keeps "0-1"). Label `grid`.
#include <gtest/gtest.h>

#include "grid/link_name.h"
#include "tests/common/result_value.h"

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

using Pairs = std::vector<std::pair<int, int>>;

TEST(LinkSelector, ExpandsTheGridTableOfTheDesign) {
  Topology f = value_of(Topology::create(8, 2, 2, 2));  // pp2 · tp2 · dp2
  auto sel = [&](const std::string& text) { return value_of(parse_link_selector(f, text)); };
  EXPECT_EQ(sel("0-1:fwd").kind, "pipeline");
  EXPECT_EQ(sel("0-1:fwd").pairs, (Pairs{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(sel("s0d1t0-s1d1t0:fwd").pairs, (Pairs{{2, 6}}));
  EXPECT_EQ(sel("s0d0-s0d1:fwd").kind, "dp");
  EXPECT_EQ(sel("s0d0-s0d1:fwd").pairs, (Pairs{{0, 2}, {1, 3}}));
  EXPECT_EQ(sel("d0-d1:fwd").pairs, (Pairs{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(sel("s1t0-s1t1:fwd").kind, "tp");
  EXPECT_EQ(sel("s1t0-s1t1:fwd").pairs, (Pairs{{4, 5}, {6, 7}}));
  EXPECT_EQ(sel("s0d0t1-s1d0t0:fwd").kind, "cross");
  EXPECT_EQ(sel("s0d0t1-s1d0t0:fwd").pairs, (Pairs{{1, 4}}));
  EXPECT_EQ(sel("s0d0t1-s1d0t0:bwd").pairs, (Pairs{{4, 1}}));
  EXPECT_EQ(sel("s0d0-s0d1").pairs, (Pairs{{0, 2}, {1, 3}, {2, 0}, {3, 1}}));  // no DIR: both ways
  // Every name link_name prints parses back to exactly its pair.
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b)
      if (a != b) EXPECT_EQ(sel(link_name(f, a, b)).pairs, (Pairs{{a, b}})) << link_name(f, a, b);
}

TEST(LinkSelector, ErrorsNameTheProblem) {
  Topology g = value_of(Topology::create(4, 2, 1, 2));
  for (auto [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"1-0", "write the low end first"},
           {"s0d1-s0d0", "write the low end first"},
           {"0-2", "stage 2 is outside"},
           {"s0d0-s0d5", "replica 5 is outside"},
           {"s0d0-s1", "same axes"},
           {"d0-d0", "the same workers"},
           {"x0-x1", "is not STAGE or [sN][dN][tN]"},
           {"d0s0-d1s0", "is not STAGE or [sN][dN][tN]"},
           {"s-s1", "needs a number"},
           {"0-1:up", "direction 'up'"},
           {"01", "expected END-END"},
       }) {
    auto r = parse_link_selector(g, text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << text << ": " << r.status().message();
  }
  // A cross pair is one pair: with tp > 1 its ends must say which shard.
  EXPECT_EQ(value_of(parse_link_selector(g, "s0d0-s1d1:fwd")).pairs, (Pairs{{0, 3}}));
  auto wild = parse_link_selector(value_of(Topology::create(8, 2, 2, 2)), "s0d0-s1d1");
  ASSERT_FALSE(wild.ok());
  EXPECT_NE(wild.status().message().find("must name every axis"), std::string::npos) << wild.status().message();
}

}  // namespace
}  // namespace lh
