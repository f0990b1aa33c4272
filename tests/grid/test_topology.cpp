// Tests for lh::Topology (grid validation, rank mapping, neighbours, link names) and Partition.
// Run by ctest with label `grid`.
#include <gtest/gtest.h>

#include <set>

#include "grid/parse_number.h"
#include "grid/partition.h"
#include "grid/topology.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

TEST(ParseNumber, AcceptsWholeIntegersOnly) {
  EXPECT_EQ(value_of(parse_int("42", "x")), 42);
  EXPECT_EQ(value_of(parse_int("-3", "x")), -3);
  for (const char* bad : {"", " 1", "1 ", "1x", "0x10", "1.5", "abc", "99999999999"}) {
    auto r = parse_int(bad, "the thing");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("the thing"), std::string::npos) << r.status().message();
  }
  EXPECT_DOUBLE_EQ(value_of(parse_double("2.5e3", "x")), 2500.0);
  for (const char* bad : {"", "nan", "inf", "1e999", "0x1p3", "2.5 "}) EXPECT_FALSE(parse_double(bad, "x").ok()) << bad;
}

TEST(Topology, ValidatesFactors) {
  EXPECT_TRUE(Topology::create(8, 2, 2, 2).ok());
  auto zero = Topology::create(4, 0, 1, 1);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("--pp"), std::string::npos);
  auto neg = Topology::create(4, 4, -1, 1);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("--tp"), std::string::npos);
  auto mismatch = Topology::create(6, 2, 2, 1);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("2 × 2 × 1 = 4"), std::string::npos) << mismatch.status().message();
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Topology::create(0, 1, 1, 1).ok());
}

TEST(Topology, RankCoordinateRoundTripAndOrder) {
  auto t = value_of(Topology::create(24, 4, 3, 2));
  std::set<int> seen;
  for (int r = 0; r < t.workers(); ++r) {
    WorkerCoord c = t.coord_of(r);
    EXPECT_EQ(t.rank_of(c), r);
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 24u);
  // tp fastest: the shards of a replica are consecutive ranks.
  EXPECT_EQ(t.tp_group(7), (std::vector<int>{6, 7, 8}));
  EXPECT_EQ(t.coord_of(7), (WorkerCoord{1, 1, 0}));
  EXPECT_EQ(t.dp_group(7), (std::vector<int>{7, 10}));
  EXPECT_EQ(t.stage_ranks(3), (std::vector<int>{18, 19, 20, 21, 22, 23}));
  EXPECT_FALSE(t.checked_coord_of(24).ok());
  EXPECT_FALSE(t.checked_coord_of(-1).ok());
  EXPECT_FALSE(t.checked_rank_of({4, 0, 0}).ok());
  EXPECT_FALSE(t.checked_rank_of({0, 3, 0}).ok());
  EXPECT_FALSE(t.checked_rank_of({0, 0, 2}).ok());
  EXPECT_EQ(value_of(t.checked_rank_of({3, 2, 1})), 23);
}

TEST(Topology, PipelineNeighboursKeepShardAndReplica) {
  auto t = value_of(Topology::create(12, 3, 2, 2));
  for (int r = 0; r < t.workers(); ++r) {
    WorkerCoord c = t.coord_of(r);
    auto next = t.next_stage_rank(r), prev = t.prev_stage_rank(r);
    EXPECT_EQ(next.has_value(), c.stage < 2);
    EXPECT_EQ(prev.has_value(), c.stage > 0);
    if (next) {
      WorkerCoord n = t.coord_of(*next);
      EXPECT_EQ(n, (WorkerCoord{c.stage + 1, c.tp, c.dp}));
      EXPECT_EQ(t.prev_stage_rank(*next), std::optional<int>(r));
      auto link = t.link_between(r, *next);
      ASSERT_TRUE(link.has_value());
      EXPECT_EQ(link->name(), std::to_string(c.stage) + "-" + std::to_string(c.stage + 1));
      EXPECT_EQ(t.link_between(*next, r)->name(), link->name());
    }
  }
  EXPECT_FALSE(t.link_between(0, 1).has_value());  // tp peers are not pipeline neighbours
  EXPECT_FALSE(t.link_between(0, 8).has_value());  // two stages apart
}

TEST(Topology, LinkNamesParseAndRejectWithTheList) {
  auto t = value_of(Topology::pipeline(4));
  ASSERT_EQ(t.pipeline_links().size(), 3u);
  EXPECT_EQ(t.pipeline_links()[2].name(), "2-3");
  auto l = t.parse_link("1-2");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->from, 1);
  EXPECT_EQ(l->to, 2);
  for (const char* bad : {"3-4", "0-2", "1", "", "a-b", "1-", "-1-0", "1-2-3"}) {
    auto r = t.parse_link(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().message();
  }
  EXPECT_NE(t.parse_link("3-4").status().message().find("0-1, 1-2, 2-3"), std::string::npos);
  EXPECT_NE(t.parse_link("2-1").status().message().find("forward order (1-2)"), std::string::npos)
      << t.parse_link("2-1").status().message();
  auto single = value_of(Topology::pipeline(1));
  EXPECT_TRUE(single.pipeline_links().empty());
  EXPECT_NE(single.parse_link("0-1").status().message().find("single stage"), std::string::npos);
}

TEST(Partition, EvenSplitsWithRemainderFirst) {
  auto p = value_of(Partition::even(8, 3));
  EXPECT_EQ(p.to_string(), "3,3,2");
  EXPECT_EQ(p.layers(), 8);
  StageSpan s0 = p.stage(0), s2 = p.stage(2);
  EXPECT_TRUE(s0.has_embedding);
  EXPECT_FALSE(s0.has_head);
  EXPECT_EQ(s0.first_block, 0);
  EXPECT_EQ(p.stage(1).first_block, 3);
  EXPECT_EQ(s2.first_block, 6);
  EXPECT_EQ(s2.end_block(), 8);
  EXPECT_TRUE(s2.has_head);
  EXPECT_FALSE(s2.has_embedding);
  EXPECT_EQ(p.stage_of_block(5), 1);
  EXPECT_EQ(p.stage_of_block(7), 2);
  auto one = value_of(Partition::even(4, 1));
  EXPECT_TRUE(one.stage(0).has_embedding && one.stage(0).has_head);
  EXPECT_FALSE(Partition::even(2, 3).ok());
  EXPECT_FALSE(Partition::even(4, 0).ok());
  EXPECT_FALSE(Partition::even(0, 1).ok());
}

TEST(Partition, ParsesUserStringsAndNamesTheProblem) {
  auto p = Partition::parse("2, 3,3", 8, 3);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->to_string(), "2,3,3");
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b : {Bad{"3,3", "has 2 entries"}, Bad{"3,3,3", "sums to 9"}, Bad{"4,0,4", "entry 2 is 0"},
                       Bad{"3,-1,6", "entry 2 is -1"}, Bad{"3,,5", "entry 2 is empty"}, Bad{"3,x,5", "entry 2"},
                       Bad{"", "entry 1 is empty"}, Bad{"3,3,2,", "entry 4 is empty"}}) {
    auto r = Partition::parse(b.text, 8, 3);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << b.text << " → " << r.status().message();
  }
}

TEST(Partition, ProportionalToSpeed) {
  // Twice as fast gets twice the blocks.
  EXPECT_EQ(Partition::proportional(12, {2, 1, 1})->to_string(), "6,3,3");
  EXPECT_EQ(Partition::proportional(8, {1, 1, 1, 1})->to_string(), "2,2,2,2");
  // A very slow worker still holds one block.
  EXPECT_EQ(Partition::proportional(6, {100, 0.01})->to_string(), "5,1");
  // The result minimises the slowest stage's time: check against every split of 7 blocks.
  std::vector<double> speeds{1.0, 2.5, 1.5};
  auto p = value_of(Partition::proportional(7, speeds));
  auto worst = [&](const std::vector<int>& n) {
    double w = 0;
    for (size_t i = 0; i < n.size(); ++i) w = std::max(w, n[i] / speeds[i]);
    return w;
  };
  double best = 1e9;
  for (int a = 1; a <= 5; ++a)
    for (int b = 1; a + b <= 6; ++b) best = std::min(best, worst({a, b, 7 - a - b}));
  EXPECT_DOUBLE_EQ(worst(p.counts()), best);
  EXPECT_EQ(p.layers(), 7);
  auto bad = Partition::proportional(4, {1, 0, 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stage 1"), std::string::npos);
  EXPECT_FALSE(Partition::proportional(2, {1, 1, 1}).ok());
  EXPECT_FALSE(Partition::proportional(4, {}).ok());
}

}  // namespace
}  // namespace lh
