// Tests for the emulated network's rules (`--link`, `ctl set-link`): parsing, the order in which they apply to one
// rank's links (later wins; a rule without a selector names every link), directions, dp links, errors naming the
// rule; and `--slowdown` entries. Label `grid`.
#include <gtest/gtest.h>

#include "grid/link_shapes.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

TEST(LinkShapes, RulesParse) {
  auto all = value_of(parse_link_rule("20M,30ms"));
  EXPECT_EQ(all.selector, "");
  EXPECT_DOUBLE_EQ(all.shape.rate_bps, 20e6);
  EXPECT_EQ(all.shape.delay, std::chrono::milliseconds(30));
  auto one = value_of(parse_link_rule("1-2:bwd=5M,80ms"));
  EXPECT_EQ(one.selector, "1-2:bwd");
  EXPECT_DOUBLE_EQ(one.shape.rate_bps, 5e6);
  EXPECT_NE(parse_link_rule("=5M").status().message().find("nothing before '='"), std::string::npos);
  EXPECT_NE(parse_link_rule("0-1=fast").status().message().find("0-1=fast"), std::string::npos);
}

TEST(LinkShapes, LaterRulesWinOnTheLinksTheyName) {
  Topology t = value_of(Topology::pipeline(3));
  const std::vector<std::string> rules = {"100M,5ms", "0-1=5M,80ms", "1-2:bwd=1M"};
  RankShapes r0 = value_of(shapes_of(t, 0, rules));
  EXPECT_DOUBLE_EQ(r0.default_shape.rate_bps, 100e6);
  ASSERT_EQ(r0.per_peer.size(), 1u);
  EXPECT_DOUBLE_EQ(r0.per_peer.at(1).rate_bps, 5e6);  // 0 → 1 is 0-1:fwd
  RankShapes r1 = value_of(shapes_of(t, 1, rules));
  EXPECT_DOUBLE_EQ(r1.per_peer.at(0).rate_bps, 5e6);  // 1 → 0 is 0-1:bwd: both ways
  EXPECT_FALSE(r1.per_peer.count(2));                 // 1 → 2 is 1-2:fwd: the default
  RankShapes r2 = value_of(shapes_of(t, 2, rules));
  EXPECT_DOUBLE_EQ(r2.per_peer.at(1).rate_bps, 1e6);  // 2 → 1 is 1-2:bwd
  // A rule for every link, later, replaces what came before it.
  RankShapes again = value_of(shapes_of(t, 0, {"0-1=5M", "2M"}));
  EXPECT_TRUE(again.per_peer.empty());
  EXPECT_DOUBLE_EQ(again.default_shape.rate_bps, 2e6);
  // A worker's own --link is the base the rules start from.
  LinkShape base;
  base.rate_bps = 7e6;
  EXPECT_DOUBLE_EQ(value_of(shapes_of(t, 1, {"0-1=5M"}, base)).default_shape.rate_bps, 7e6);
  EXPECT_EQ(describe_link_rules({"20M,20ms", "0-1=5M"}), "20 Mbit/s, 20 ms; 0-1 5 Mbit/s, 0 ms");
}

TEST(LinkShapes, ReplicaLinksHaveTheirNames) {
  Topology t = value_of(Topology::create(4, 2, 1, 2));  // 2 stages × 2 replicas
  RankShapes r = value_of(shapes_of(t, t.rank_of({0, 0, 0}), {"s0d0-s0d1=3M"}));
  ASSERT_EQ(r.per_peer.size(), 1u);
  EXPECT_DOUBLE_EQ(r.per_peer.at(t.rank_of({0, 0, 1})).rate_bps, 3e6);
}

TEST(LinkShapes, BadRulesAreNamed) {
  Topology t = value_of(Topology::pipeline(3));
  Status s = check_link_rules(t, {"10M", "0-2=1M"});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("0-2=1M"), std::string::npos) << s.to_string();
  EXPECT_FALSE(check_link_rules(t, {"1-2:up=1M"}).ok());
  EXPECT_TRUE(check_link_rules(t, {"1-2:fwd=1M,3ms"}).ok());
}

TEST(LinkShapes, SlowdownsParseAndNameBadEntries) {
  auto s = value_of(parse_slowdowns({"1=2.5", "0=1"}, 3));
  EXPECT_DOUBLE_EQ(s.at(1), 2.5);
  EXPECT_DOUBLE_EQ(s.at(0), 1);
  for (const char* bad : {"1", "3=2", "-1=2", "1=0.5", "1=x", "1=2000"}) {
    auto r = parse_slowdowns({bad}, 3);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().to_string();
  }
  EXPECT_NE(parse_slowdowns({"1=2", "1=3"}, 3).status().message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace lh
