// Tests for PipelineSchedule (GPipe, 1F1B) and the discrete-event pipeline simulator.
// Run by ctest with label `grid`.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "grid/pipeline_schedule.h"
#include "grid/pipeline_sim.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

const ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kEager, ScheduleKind::kAsync,
                               ScheduleKind::kAsyncPredict};

int count(const std::vector<Action>& list, Action a) {
  int n = 0;
  for (const Action& x : list) n += x == a;
  return n;
}

TEST(PipelineSchedule, EveryForwardAndBackwardOncePerStage) {
  for (ScheduleKind kind : kKinds)
    for (int S : {1, 2, 3, 4, 8})
      for (int M = 1; M <= 8; ++M) {
        auto sched = PipelineSchedule::build(kind, S, M);
        ASSERT_TRUE(sched.ok()) << sched.status().to_string();
        for (int s = 0; s < S; ++s) {
          const auto& list = sched->actions(s);
          for (int mb = 0; mb < M; ++mb) {
            EXPECT_EQ(count(list, forward(mb)), 1);
            EXPECT_EQ(count(list, backward(mb)), 1);
            EXPECT_EQ(count(list, recv_act(mb)), s > 0 ? 1 : 0);
            EXPECT_EQ(count(list, send_grad(mb)), s > 0 ? 1 : 0);
            EXPECT_EQ(count(list, send_act(mb)), s < S - 1 ? 1 : 0);
            EXPECT_EQ(count(list, recv_grad(mb)), s < S - 1 ? 1 : 0);
          }
          EXPECT_EQ(list.back(), optimizer_step());
          EXPECT_EQ(count(list, optimizer_step()), 1);
          EXPECT_TRUE(sched->validate().ok());
        }
      }
}

TEST(PipelineSchedule, SimulationCompletesWithoutDeadlock) {
  for (ScheduleKind kind : kKinds)
    for (int S : {1, 2, 3, 4, 8})
      for (int M = 1; M <= 8; ++M) {
        auto sched = value_of(PipelineSchedule::build(kind, S, M));
        for (PipelineCosts c : {PipelineCosts{}, PipelineCosts{1, 2, 0.5, 0.25, 0.1}, PipelineCosts{1, 3, 4, 2, 0}}) {
          auto r = simulate_pipeline(sched, c);
          ASSERT_TRUE(r.ok()) << schedule_kind_name(kind) << " S=" << S << " M=" << M << ": " << r.status().to_string();
          for (int s = 0; s < S; ++s) EXPECT_DOUBLE_EQ(r->busy[s], M * (c.forward + c.backward));
        }
      }
}

TEST(PipelineSchedule, OneFOneBBoundsActivationsInFlight) {
  for (int S : {1, 2, 3, 4, 8})
    for (int M = 1; M <= 8; ++M) {
      auto f1b = value_of(PipelineSchedule::build(ScheduleKind::k1F1B, S, M));
      auto gpipe = value_of(PipelineSchedule::build(ScheduleKind::kGPipe, S, M));
      auto sim = value_of(simulate_pipeline(f1b));
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(f1b.max_in_flight(s), std::min(S - s, M)) << "S=" << S << " M=" << M << " s=" << s;
        EXPECT_EQ(sim.max_in_flight[s], f1b.max_in_flight(s));
        EXPECT_EQ(gpipe.max_in_flight(s), M);
      }
    }
}

TEST(PipelineSchedule, BubbleFractionMatchesTheory) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B})
    for (int S : {1, 2, 3, 4, 8})
      for (int M = 1; M <= 8; ++M) {
        auto r = value_of(simulate_pipeline(value_of(PipelineSchedule::build(kind, S, M))));
        const double expected = double(S - 1) / (M + S - 1);
        EXPECT_NEAR(r.bubble_fraction, expected, 1e-12) << schedule_kind_name(kind) << " S=" << S << " M=" << M;
        EXPECT_DOUBLE_EQ(r.makespan, 2.0 * (M + S - 1));
      }
}

TEST(PipelineSchedule, LinkCostsLengthenTheStep) {
  auto sched = value_of(PipelineSchedule::build(ScheduleKind::k1F1B, 4, 8));
  double free_link = value_of(simulate_pipeline(sched)).makespan;
  double slow_link = value_of(simulate_pipeline(sched, PipelineCosts{1, 1, 3, 0, 0})).makespan;
  EXPECT_GT(slow_link, free_link);
  // A link busier than compute bounds the step: 8 messages each way per link at 3 units each.
  EXPECT_GE(slow_link, 8 * 3.0);
}

// A link-bound pipeline: 2 stages, GPipe, transfers longer than compute. Stage 1's forwards wait for each activation
// (f + m·x_f + L_f), its backwards then feed a backward wire as slow: the step is compute at both ends plus
// M transfers and one latency each way — bytes/rate + latency, exactly.
TEST(PipelineSchedule, ALinkBoundPipelineTakesItsTransfersAndLatency) {
  for (int M : {1, 2, 4, 8}) {
    auto sched = value_of(PipelineSchedule::build(ScheduleKind::kGPipe, 2, M));
    PipelineCosts c;
    c.forward = 1;
    c.backward = 2;
    c.fwd_transfer = {5};
    c.bwd_transfer = {7};
    c.fwd_latency = {3};
    c.bwd_latency = {4};
    auto r = value_of(simulate_pipeline(sched, c));
    EXPECT_DOUBLE_EQ(r.makespan, 2 * 1.0 + 2 * 2.0 + M * 5.0 + 3 + M * 7.0 + 4) << "M=" << M;
  }
}

// Unequal stages, free links: GPipe is two flow shops of identical jobs, forward then backward, each
// Σ p_s + (M − 1) · max p_s.
TEST(PipelineSchedule, UnevenStagesFollowTheFlowShopBound) {
  PipelineCosts c;
  c.stage_forward = {1, 3, 2};
  c.stage_backward = {2, 5, 1};
  for (int M : {1, 4, 7}) {
    auto r = value_of(simulate_pipeline(value_of(PipelineSchedule::build(ScheduleKind::kGPipe, 3, M)), c));
    EXPECT_DOUBLE_EQ(r.makespan, (6 + (M - 1) * 3.0) + (8 + (M - 1) * 5.0)) << "M=" << M;
    // 1F1B cannot beat the slowest stage's own work, nor the one microbatch's way down and back.
    auto f = value_of(simulate_pipeline(value_of(PipelineSchedule::build(ScheduleKind::k1F1B, 3, M)), c));
    EXPECT_GE(f.makespan, M * 8.0);
    EXPECT_GE(f.makespan, 6 + 8.0);
    EXPECT_EQ(f.busy[1], M * 8.0);
  }
}

// The eager policy under random uneven costs: it never deadlocks, whatever the in-flight limit; what each stage ran
// is a valid schedule; replayed as fixed lists by the list simulator it takes exactly the time the policy did (the
// two simulators agree); and it keeps at most the limit in flight.
TEST(PipelineSchedule, EagerNeverDeadlocksAndItsOrderReplaysToTheSameTime) {
  Rng rng(11);
  auto draw = [&](int n, double lo, double hi) {
    std::vector<double> v(static_cast<size_t>(n), 0.0);
    for (double& x : v) x = lo + (hi - lo) * rng.uniform();
    return v;
  };
  for (int S : {1, 2, 3, 4, 6})
    for (int M : {1, 2, 3, 5, 8})
      for (int trial = 0; trial < 4; ++trial) {
        PipelineCosts c;
        c.stage_forward = draw(S, 0.5, 2);
        c.stage_backward = draw(S, 1, 4);
        c.fwd_transfer = draw(S - 1, 0, trial * 2.0);
        c.bwd_transfer = draw(S - 1, 0, trial * 2.0);
        c.fwd_latency = draw(S - 1, 0, trial * 5.0);
        c.bwd_latency = draw(S - 1, 0, trial * 5.0);
        for (int limit : {1, 2, M}) {
          const std::string at = "S=" + std::to_string(S) + " M=" + std::to_string(M) + " trial " +
                                 std::to_string(trial) + " limit " + std::to_string(limit);
          auto eager = simulate_eager(S, M, limit, c);
          ASSERT_TRUE(eager.ok()) << at << ": " << eager.status().to_string();
          auto lists = PipelineSchedule::from_lists(ScheduleKind::kGPipe, M, eager->lists);
          ASSERT_TRUE(lists.ok()) << at << ": " << lists.status().to_string();
          auto replay = value_of(simulate_pipeline(*lists, c));
          EXPECT_NEAR(replay.makespan, eager->result.makespan, 1e-9) << at;
          for (int s = 0; s < S; ++s) {
            EXPECT_LE(eager->result.max_in_flight[s], limit) << at;
            EXPECT_NEAR(eager->result.busy[s], M * (c.stage_forward[s] + c.stage_backward[s]), 1e-9) << at;
          }
        }
      }
}

// Links slower than compute and far away (the WAN case): eager is never slower than GPipe or 1F1B there, strictly
// faster than both once there are as many microbatches as stages, and no synchronous order can beat the first
// microbatch's way down and back.
TEST(PipelineSchedule, EagerBeatsGPipeAndOneFOneBOverSlowDistantLinks) {
  for (int M : {2, 4, 8}) {
    PipelineCosts c{1, 2, 6, 8, 0};  // forward 1, backward 2, transfer 6, latency 8
    const double eager =
        value_of(simulate_pipeline(value_of(PipelineSchedule::build(ScheduleKind::kEager, 4, M)), c)).makespan;
    const double gpipe =
        value_of(simulate_pipeline(value_of(PipelineSchedule::build(ScheduleKind::kGPipe, 4, M)), c)).makespan;
    const double f1b =
        value_of(simulate_pipeline(value_of(PipelineSchedule::build(ScheduleKind::k1F1B, 4, M)), c)).makespan;
    EXPECT_LT(eager, gpipe) << "M=" << M;
    EXPECT_LE(eager, f1b) << "M=" << M;
    if (M >= 4) EXPECT_LT(eager, f1b) << "M=" << M;  // with fewer microbatches than stages 1F1B sends them all first
    // Down: 4 forwards, 3 transfers and delays for the first microbatch; the last one's M transfers on link 0;
    // back: 4 backwards, 3 transfers and delays.
    EXPECT_GE(eager, 4 * 1 + 4 * 2 + 2 * 3 * (6 + 8) + (M - 1) * 6.0) << "M=" << M;
  }
}

TEST(PipelineSchedule, CostsOfTheWrongSizeAreRefused) {
  auto sched = value_of(PipelineSchedule::build(ScheduleKind::k1F1B, 3, 2));
  PipelineCosts c;
  c.fwd_transfer = {1, 2, 3};  // 3 stages have 2 links
  auto r = simulate_pipeline(sched, c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fwd_transfer has 3 entries, want 2"), std::string::npos) << r.status().message();
  c = {};
  c.stage_backward = {1, -1, 1};
  r = simulate_pipeline(sched, c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stage_backward"), std::string::npos) << r.status().message();
}

TEST(PipelineSchedule, ParsesKindNames) {
  EXPECT_EQ(value_of(parse_schedule_kind("gpipe")), ScheduleKind::kGPipe);
  EXPECT_EQ(value_of(parse_schedule_kind("1f1b")), ScheduleKind::k1F1B);
  EXPECT_EQ(value_of(parse_schedule_kind("eager")), ScheduleKind::kEager);
  for (ScheduleKind k : kKinds) EXPECT_EQ(value_of(parse_schedule_kind(schedule_kind_name(k))), k);
  auto bad = parse_schedule_kind("zb");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'zb' is unknown; choose gpipe, 1f1b, eager, async or async:predict"),
            std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(PipelineSchedule::build(ScheduleKind::kGPipe, 0, 4).ok());
  EXPECT_NE(PipelineSchedule::build(ScheduleKind::kGPipe, 2, 0).status().message().find("--microbatches"),
            std::string::npos);
}

TEST(PipelineSchedule, ValidateNamesBrokenRules) {
  struct Case {
    std::vector<std::vector<Action>> lists;
    const char* says;
  };
  const Case cases[] = {
      {{{forward(0), backward(0)}}, "no optimizer step"},
      {{{forward(0), optimizer_step(), backward(0)}}, "must be the last"},
      {{{forward(0), forward(0), backward(0), optimizer_step()}}, "appears twice"},
      {{{backward(0), forward(0), optimizer_step()}}, "F0 must come before B0"},
      {{{forward(0), optimizer_step()}}, "no backward of microbatch 0"},
      {{{forward(1), backward(1), optimizer_step()}}, "microbatch outside"},
      {{{recv_act(0), forward(0), backward(0), optimizer_step()}}, "no previous stage"},
      {{{forward(0), send_act(0), recv_grad(0), backward(0), optimizer_step()},
        {forward(0), recv_act(0), backward(0), send_grad(0), optimizer_step()}},
       "RA0 must come before F0"},
      {{{forward(0), send_act(0), backward(0), recv_grad(0), optimizer_step()},
        {recv_act(0), forward(0), backward(0), send_grad(0), optimizer_step()}},
       "RG0 must come before B0"},
      {{{forward(0), send_act(0), recv_grad(0), backward(0), optimizer_step()},
        {recv_act(0), forward(0), backward(0), optimizer_step()}},
       "no gradient send"},
  };
  for (const Case& c : cases) {
    auto r = PipelineSchedule::from_lists(ScheduleKind::kGPipe, 1, c.lists);
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().message();
  }
  // Neighbours that disagree on the order of activations.
  std::vector<std::vector<Action>> swapped = {{forward(0), send_act(0), forward(1), send_act(1), recv_grad(0),
                                               backward(0), recv_grad(1), backward(1), optimizer_step()},
                                              {recv_act(1), forward(1), recv_act(0), forward(0), backward(0),
                                               send_grad(0), backward(1), send_grad(1), optimizer_step()}};
  auto r = PipelineSchedule::from_lists(ScheduleKind::kGPipe, 2, swapped);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("order of activations"), std::string::npos) << r.status().message();
}

TEST(PipelineSchedule, SimulatorReportsADeadlock) {
  // Valid per stage, but stage 0 waits for a gradient before it has sent the activation.
  auto sched = PipelineSchedule::from_lists(ScheduleKind::kGPipe, 1,
                                            {{forward(0), recv_grad(0), send_act(0), backward(0), optimizer_step()},
                                             {recv_act(0), forward(0), backward(0), send_grad(0), optimizer_step()}});
  ASSERT_TRUE(sched.ok()) << sched.status().to_string();
  auto r = simulate_pipeline(*sched);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stage 0 waits at RG0"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("stage 1 waits at RA0"), std::string::npos);
}

TEST(PipelineSchedule, DescribeListsEveryStage) {
  auto sched = value_of(PipelineSchedule::build(ScheduleKind::k1F1B, 2, 2));
  EXPECT_EQ(sched.describe(),
            "1f1b, 2 stages, 2 microbatches\n"
            "  stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1 OPT\n"
            "  stage 1: RA0 F0 B0 SG0 RA1 F1 B1 SG1 OPT\n");
}

}  // namespace
}  // namespace lh
