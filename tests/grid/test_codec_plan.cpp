// Tests for CodecPlan (--compress-fwd/--compress-bwd/--compress-link) and CodecSchedule (live
// set-codec at a step boundary). Run by ctest with label `grid`.
#include <gtest/gtest.h>

#include "grid/codec_plan.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

TEST(CodecPlan, DefaultsAndOverrides) {
  Topology t = value_of(Topology::pipeline(4));
  CodecPlan p = value_of(CodecPlan::create(t, "int8", "bf16", {"1-2:fwd=int4", "0-1:bwd=topk:ratio=0.1+int8"}));
  EXPECT_EQ(p.spec({0, 1}, LinkDir::kFwd), "int8");
  EXPECT_EQ(p.spec({0, 1}, LinkDir::kBwd), "topk:ratio=0.1+int8");
  EXPECT_EQ(p.spec({1, 2}, LinkDir::kFwd), "int4");
  EXPECT_EQ(p.spec({1, 2}, LinkDir::kBwd), "bf16");
  EXPECT_EQ(p.spec({2, 3}, LinkDir::kFwd), "int8");
  EXPECT_EQ(p.describe(), "0-1 fwd=int8 bwd=topk:ratio=0.1+int8; 1-2 fwd=int4 bwd=bf16; 2-3 fwd=int8 bwd=bf16");
  // A later override of the same link direction wins.
  CodecPlan q = value_of(CodecPlan::create(t, "none", "none", {"1-2:fwd=int4", "1-2:fwd=int2"}));
  EXPECT_EQ(q.spec({1, 2}, LinkDir::kFwd), "int2");
  EXPECT_EQ(value_of(CodecPlan::create(value_of(Topology::pipeline(1)), "none", "none", {})).describe(),
            "no pipeline links");
}

TEST(CodecPlan, BadOverridesNameTheProblem) {
  Topology t = value_of(Topology::pipeline(3));
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"1-2fwd=int4", "expected LINK:DIR=SPEC"}, Case{"1-2:fwd", "no '='"},
                        Case{"2-3:fwd=int4", "'2-3' is not a pipeline link"}, Case{"1-2:up=int4", "direction 'up'"},
                        Case{"1-2:fwd=", "codec spec is empty"}, Case{"1-2:fwd=int8++int4", "empty stage"},
                        Case{"x:fwd=int8", "'x'"}, Case{"1-2:fwd=int3", "unknown codec 'int3'"}}) {
    auto r = parse_link_override(c.text, t);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.text << " → " << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("--compress-link '") + c.text + "'"), std::string::npos);
  }
  expect_error(CodecPlan::create(t, "", "none", {}).status(), "--compress-fwd");
  expect_error(CodecPlan::create(t, "none", "int8+", {}).status(), "--compress-bwd");
  expect_error(CodecPlan::create(t, "none", "none", {"0-1:fwd=int8", "5-6:bwd=int8"}).status(), "'5-6'");
}

TEST(CodecPlan, UsesTheInjectedSpecCheck) {
  Topology t = value_of(Topology::pipeline(2));
  CodecSpecCheck only_known = [](const std::string& s) {
    return s == "int8" || s == "none" ? Status::Ok() : invalid_argument("unknown codec '" + s + "'");
  };
  EXPECT_TRUE(CodecPlan::create(t, "int8", "none", {}, only_known).ok());
  expect_error(CodecPlan::create(t, "int8", "none", {"0-1:fwd=int3"}, only_known).status(), "unknown codec 'int3'");
  expect_error(CodecPlan::create(t, "int3", "none", {}, only_known).status(), "--compress-fwd: unknown codec");
}

TEST(CodecSchedule, ChangesApplyFromTheirStepOnBothEnds) {
  Topology t = value_of(Topology::pipeline(3));
  CodecPlan plan = value_of(CodecPlan::create(t, "int8", "int8", {}));
  // Two ends of link 1-2 (stage 1 and stage 2) each hold a schedule fed the same messages.
  CodecSchedule coordinator(t, plan), sender(t, plan), receiver(t, plan);
  ASSERT_TRUE(coordinator.begin_step(0).ok());
  ASSERT_TRUE(coordinator.begin_step(4).ok());
  CodecChange c = value_of(coordinator.request_change("1-2", "fwd", "int4"));
  EXPECT_EQ(c.from_step, 5);
  for (CodecSchedule* end : {&sender, &receiver}) ASSERT_TRUE(end->schedule_change(c).ok());
  for (int64_t step = 0; step < 10; ++step) {
    const std::string want = step < 5 ? "int8" : "int4";
    EXPECT_EQ(sender.spec_at({1, 2}, LinkDir::kFwd, step), want);
    EXPECT_EQ(receiver.spec_at({1, 2}, LinkDir::kFwd, step), want);
    EXPECT_EQ(sender.spec_at({1, 2}, LinkDir::kBwd, step), "int8");
    EXPECT_EQ(sender.spec_at({0, 1}, LinkDir::kFwd, step), "int8");
  }
  ASSERT_EQ(coordinator.changes_at(5).size(), 1u);
  EXPECT_TRUE(coordinator.changes_at(4).empty());
  // A later change, then a second one at the same step replaces it.
  ASSERT_TRUE(coordinator.schedule_change({{1, 2}, LinkDir::kFwd, "int2", 8}).ok());
  ASSERT_TRUE(coordinator.schedule_change({{1, 2}, LinkDir::kFwd, "bf16", 8}).ok());
  EXPECT_EQ(coordinator.spec_at({1, 2}, LinkDir::kFwd, 7), "int4");
  EXPECT_EQ(coordinator.spec_at({1, 2}, LinkDir::kFwd, 8), "bf16");
  auto all = coordinator.changes();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].from_step, 5);
  EXPECT_EQ(all[1].spec, "bf16");
}

TEST(CodecSchedule, RefusesChangesThatWouldSplitTheEnds) {
  Topology t = value_of(Topology::pipeline(2));
  CodecSchedule s(t, value_of(CodecPlan::create(t, "none", "none", {})));
  ASSERT_TRUE(s.begin_step(10).ok());
  expect_error(s.schedule_change({{0, 1}, LinkDir::kFwd, "int8", 10}), "step 10 has already begun");
  expect_error(s.schedule_change({{0, 1}, LinkDir::kFwd, "int8", 3}), "earliest step a change can take effect is 11");
  ASSERT_TRUE(s.schedule_change({{0, 1}, LinkDir::kFwd, "int8", 20}).ok());
  expect_error(s.schedule_change({{0, 1}, LinkDir::kFwd, "int4", 15}), "already scheduled at step 20");
  expect_error(s.schedule_change({{1, 2}, LinkDir::kFwd, "int4", 15}), "not a pipeline link");
  expect_error(s.schedule_change({{0, 1}, LinkDir::kBwd, "", 15}), "codec spec is empty");
  expect_error(s.request_change("0-1", "sideways", "int8").status(), "direction 'sideways'");
  expect_error(s.request_change("1-0", "fwd", "int8").status(), "forward order");
  expect_error(s.begin_step(9), "steps only go forward");
  expect_error(s.begin_step(-1), "negative");
  EXPECT_EQ(s.spec_at({0, 1}, LinkDir::kFwd, 19), "none");
  EXPECT_EQ(s.spec_at({0, 1}, LinkDir::kFwd, 20), "int8");
}

}  // namespace
}  // namespace lh
