// Tests for adaptive compression's choice (least lossy codec whose transfer fits under the pipeline's compute per
// microbatch, hysteresis, the fastest when nothing fits), its measurement window (sender rows only, the slowest stage
// sets the pace, step 1 ignored, a switch confirmed by two decisions), the ladder flag and which links are auto.
// Label `plan`.
#include <gtest/gtest.h>

#include "plan/auto_codec.h"
#include "plan/job_config.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

// Bytes per microbatch of none, bf16, int8, int4 for a 64 KiB activation.
const std::vector<uint64_t> kBytes = {65536, 32768, 16400, 8300};

TEST(AutoCodec, PicksTheLeastLossyCodecThatFits) {
  // 1 Gbit/s: even `none` takes 0.5 ms, under 10 ms of compute.
  EXPECT_EQ(choose_auto_codec(kBytes, 0, 1e9, 0.010, 0.7).index, 0);
  // 20 Mbit/s: none 26 ms, bf16 13 ms, int8 6.6 ms → int8.
  AutoChoice c = choose_auto_codec(kBytes, 0, 20e6, 0.010, 0.7);
  EXPECT_EQ(c.index, 2);
  EXPECT_NEAR(c.transfer_s, 16400 * 8 / 20e6, 1e-9);
  EXPECT_NE(c.reason.find("fits under compute 10.00 ms"), std::string::npos) << c.reason;
  // Nothing fits: the fastest, or a less lossy one within 10% of it.
  EXPECT_EQ(choose_auto_codec(kBytes, 0, 1e6, 0.010, 0.7).index, 3);
  EXPECT_NE(choose_auto_codec(kBytes, 0, 1e6, 0.010, 0.7).reason.find("no codec"), std::string::npos);
  EXPECT_EQ(choose_auto_codec({1000, 990, 980}, 0, 1e3, 0.001, 0.7).index, 0);
}

TEST(AutoCodec, MovesBackToLessLossyCodecsOnlyWithRoomToSpare) {
  // int8 in force; bf16 would take 13.1 ms of 14 ms compute: it fits, but not within 70%, so int8 stays.
  EXPECT_EQ(choose_auto_codec(kBytes, 2, 20e6, 0.014, 0.7).index, 2);
  // With 20 ms of compute bf16 fits in 70% (13.1 < 14): back to bf16, not none (26 ms).
  EXPECT_EQ(choose_auto_codec(kBytes, 2, 20e6, 0.020, 0.7).index, 1);
}

// tp sums overlap no compute: the step is minimised within the ladder, without compressing for a gain under 5%.
TEST(AutoCodec, TransfersThatHideUnderNothingMinimiseTheStep) {
  const std::vector<uint64_t> sums = {65536, 32768, 16400};  // none, bf16, int8
  // 64 sums a step at 1 Gbit/s: 33.6 ms of a 1 s step with none; int8 would save 25 ms (2.5%): keep none.
  AutoChoice keep = choose_step_codec(sums, 0, 1e9, 64, 1.0, 0.7);
  EXPECT_EQ(keep.index, 0) << keep.reason;
  // At 20 Mbit/s the sums are most of the step (1.68 s of 2 s with none): int8 (0.42 s) is the fastest; bf16's
  // 0.84 s is 36% slower.
  AutoChoice slow = choose_step_codec(sums, 0, 20e6, 64, 2.0, 0.7);
  EXPECT_EQ(slow.index, 2) << slow.reason;
  EXPECT_NEAR(slow.transfer_s, 64 * 16400 * 8 / 20e6, 1e-9);
  EXPECT_NE(slow.reason.find("within 5% of the fastest"), std::string::npos) << slow.reason;
  // From int8, back to none only when none is within 70% of the tolerance (3.5%) of int8's step: at 1 Gbit/s,
  // a 1 s step measured with int8 (8.4 ms of sums) → none's 1.025 s is 2.5% slower: back; with a 0.5 s step (5%) not.
  EXPECT_EQ(choose_step_codec(sums, 2, 1e9, 64, 1.0, 0.7).index, 0);
  EXPECT_NE(choose_step_codec(sums, 2, 1e9, 64, 0.5, 0.7).index, 0);
}

WorkerStepMetrics record(int worker, int64_t step, double compute_s, std::vector<LinkTraffic> links = {}) {
  WorkerStepMetrics m;
  m.worker = worker;
  m.step = step;
  m.compute_s = compute_s;
  m.links = std::move(links);
  return m;
}

// Link 0-1's activations, `bytes` per microbatch for each entry of the default ladder.
AutoCodec::Link fwd_link(std::vector<uint64_t> bytes) {
  AutoCodec::Link fwd;
  fwd.src = 0;
  fwd.dst = 1;
  fwd.name = "0-1:fwd";
  fwd.role = "act";
  fwd.bytes_per_mb = std::move(bytes);
  return fwd;
}

LinkTraffic sent(int src, int dst, const std::string& role, uint64_t wire, double seconds) {
  LinkTraffic t;
  t.src = src;
  t.dst = dst;
  t.role = role;
  t.dir = "send";
  t.wire_bytes = wire;
  t.seconds = seconds;
  t.messages = 4;
  return t;
}

TEST(AutoCodec, DecidesFromAWindowAndConfirmsASwitch) {
  AutoCodecConfig config;
  config.every = 2;
  config.fit = 1;  // a transfer fits under all of the compute
  AutoCodec::Link fwd = fwd_link(kBytes);
  AutoCodec a(config, {fwd}, /*workers=*/2, /*microbatches=*/4);
  auto window = [&](int64_t first, double bps, double compute_per_step) {
    std::optional<int64_t> due;
    for (int64_t s = first; s < first + 2; ++s) {
      // The sender's row counts; the receiver's row of the same traffic and other roles do not.
      EXPECT_FALSE(a.observe(record(0, s, compute_per_step / 4, {sent(0, 1, "act", 4 * 65536, 4 * 65536 * 8 / bps)})));
      LinkTraffic recv = sent(0, 1, "act", 999999, 1e-9);
      recv.dir = "recv";
      due = a.observe(record(1, s, compute_per_step, {recv, sent(1, 0, "act_grad", 10, 1)}));
    }
    return due;
  };
  // Step 1 is warm-up: its times count for nothing, so this first window decides from step 2 alone. The link's first
  // move (from `none`, which nothing measured as right) needs no confirmation.
  ASSERT_EQ(window(1, 20e6, 0.040), std::optional<int64_t>(2));
  auto d = a.decide(2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].link, "0-1:fwd");
  EXPECT_EQ(d[0].from, "none");
  EXPECT_EQ(d[0].to, "int8");  // the slowest stage (worker 1: 40 ms a step, 10 ms a microbatch) sets the pace
  EXPECT_NEAR(d[0].compute_s, 0.010, 1e-9);
  EXPECT_NEAR(d[0].bandwidth_bps, 20e6, 1);
  EXPECT_EQ(a.links()[0].current, 2);
  // A noisy window alone moves nothing back.
  ASSERT_TRUE(window(5, 1e9, 0.040));
  EXPECT_TRUE(a.decide(6).empty());
  ASSERT_TRUE(window(7, 20e6, 0.040));
  EXPECT_TRUE(a.decide(8).empty());
  // A slower pipeline hides more bytes: two windows of 80 ms compute per microbatch bring none back.
  ASSERT_TRUE(window(9, 20e6, 0.320));
  EXPECT_TRUE(a.decide(10).empty());
  ASSERT_TRUE(window(11, 20e6, 0.320));
  d = a.decide(12);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].to, "none");
  // With fit 0.5 a transfer must fit in half the compute: 20 Mbit/s under 10 ms per microbatch takes int4.
  EXPECT_EQ(choose_auto_codec(kBytes, 0, 20e6, 0.010, 0.7, 0.5).index, 3);
  EXPECT_NE(choose_auto_codec(kBytes, 0, 20e6, 0.010, 0.7, 0.5).reason.find("50% of compute"), std::string::npos);
  // The record round-trips through the metrics' JSON.
  auto back = value_of(auto_decision_from_json(auto_decision_to_json(d[0]), "test"));
  EXPECT_EQ(back.to, "none");
  EXPECT_EQ(back.reason, d[0].reason);
  EXPECT_FALSE(auto_decision_from_json(nlohmann::json{{"step", 1}}, "test").ok());
}

// A fast link with a long delay: each 64 KiB activation keeps the wire busy 0.5 ms plus 50 ms of latency, which
// read as bandwidth is 10 Mbit/s and would call for compression that cannot help. The pair's small messages (the
// gradient norm's, role other) measure the latency, and auto takes it out: 1 Gbit/s, `none` fits.
TEST(AutoCodec, LatencyIsNotReadAsLowBandwidth) {
  AutoCodecConfig config;
  config.every = 2;
  config.fit = 1;
  config.tokens_per_step = 1000;  // steps of 1 s (tokens/s 1000): the link is busy 0.2 s of each, not queueing
  AutoCodec::Link fwd = fwd_link(kBytes);
  const double latency = 0.050, busy = 4 * (65536 * 8 / 1e9 + latency);
  for (bool with_norm : {false, true}) {
    AutoCodec a(config, {fwd}, /*workers=*/2, /*microbatches=*/4);
    std::optional<int64_t> due;
    for (int64_t s = 1; s <= 2; ++s) {
      std::vector<LinkTraffic> rows = {sent(0, 1, "act", 4 * 65536, busy)};
      if (with_norm) {
        LinkTraffic norm = sent(0, 1, "other", 16, 2 * latency);
        norm.messages = 2;
        rows.push_back(norm);
      }
      WorkerStepMetrics m0 = record(0, s, 0.040, rows), m1 = record(1, s, 0.040);
      m0.tokens_per_s = m1.tokens_per_s = 1000;
      EXPECT_FALSE(a.observe(m0));
      due = a.observe(m1);
    }
    ASSERT_TRUE(due);
    auto d = a.decide(*due);
    if (!with_norm) {
      ASSERT_EQ(d.size(), 1u);  // 10 Mbit/s: compressed
      EXPECT_NE(d[0].to, "none");
      EXPECT_NEAR(d[0].bandwidth_bps, 4 * 65536 * 8 / busy, 1);
    } else {
      EXPECT_TRUE(d.empty()) << d[0].to << ": " << d[0].reason;  // none stays
      EXPECT_EQ(a.links()[0].current, 0);
    }
  }
  // A queueing link (busy most of each step: 5 Mbit/s, 40 ms): the latency is taken out once a step, not once a
  // message, and the bandwidth comes out right: 4 messages of 64 KiB back to back take 4 · 105 ms + 40 ms.
  AutoCodec q(config, {fwd}, 2, 4);
  const double x = 65536 * 8 / 5e6, step_busy = 4 * x + 0.040;
  std::optional<int64_t> due;
  for (int64_t s = 1; s <= 2; ++s) {
    LinkTraffic norm = sent(0, 1, "other", 16, 0.080);
    norm.messages = 2;
    WorkerStepMetrics m0 = record(0, s, 0.040, {sent(0, 1, "act", 4 * 65536, step_busy), norm});
    WorkerStepMetrics m1 = record(1, s, 0.040);
    m0.tokens_per_s = m1.tokens_per_s = 1000 / (step_busy + 0.05);
    EXPECT_FALSE(q.observe(m0));
    due = q.observe(m1);
  }
  ASSERT_TRUE(due);
  auto d = q.decide(*due);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NEAR(d[0].bandwidth_bps, 5e6, 1e3);
  EXPECT_NEAR(d[0].latency_s, 0.040, 1e-9);
  EXPECT_NE(d[0].reason.find("once a step (the link queues)"), std::string::npos) << d[0].reason;
}

// Issue 45's link (10 Mbit/s, 50 ms one way, a 4-microbatch step): with `none` a step's four 147,528-byte activations
// keep the sender busy 0.52 s, with int4 four 19,656-byte ones 0.113 s — under the 50 ms latency per message, which is
// how the busy-time estimate read 554 Mbit/s and moved the link back to `none` every other decision. The senders'
// serial time (what their meters now report) gives 10 Mbit/s with either codec: one move, to int4, and it stays.
TEST(AutoCodec, ALatencyBoundLinkSettlesOnItsFirstChoice) {
  AutoCodecConfig config;
  config.every = 2;
  config.tokens_per_step = 1000;
  AutoCodec::Link fwd = fwd_link({147528, 73800, 37000, 19656});
  AutoCodec a(config, {fwd}, /*workers=*/2, /*microbatches=*/4);
  int moves = 0;
  for (int64_t first = 1; first < 40; first += 2) {
    std::optional<int64_t> due;
    for (int64_t s = first; s < first + 2; ++s) {
      const uint64_t bytes = 4 * fwd.bytes_per_mb[size_t(a.links()[0].current)];
      LinkTraffic act = sent(0, 1, "act", bytes, a.links()[0].current == 0 ? 0.52 : 0.113);
      act.serial_s = double(bytes) * 8 / 10e6;
      act.latency_s = 0.050;
      LinkTraffic norm = sent(0, 1, "other", 16, 0.100);
      norm.messages = 2;
      norm.serial_s = 0;
      norm.latency_s = 0.050;
      WorkerStepMetrics m0 = record(0, s, 4 * 0.01564, {act, norm}), m1 = record(1, s, 4 * 0.01564);
      m0.tokens_per_s = m1.tokens_per_s = 1000 / 1.8;
      EXPECT_FALSE(a.observe(m0));
      due = a.observe(m1);
    }
    ASSERT_TRUE(due);
    for (const AutoDecision& d : a.decide(*due)) {
      ++moves;
      EXPECT_EQ(d.from, "none") << d.reason;
      EXPECT_EQ(d.to, "int4") << d.reason;
      EXPECT_NEAR(d.bandwidth_bps, 10e6, 1e3);
      EXPECT_NEAR(d.latency_s, 0.050, 1e-9);
      EXPECT_NE(d.reason.find("rate from the serial time"), std::string::npos) << d.reason;
    }
  }
  EXPECT_EQ(moves, 1);
  EXPECT_EQ(a.links()[0].current, 3);
}

// A link whose measurements wander near a boundary (20 and 24 Mbit/s, with no hysteresis or confirmation to hold it)
// moves to bf16 once and does not go back to the int8 it left while the link measures as it did then; a link that
// really changed (10 Mbit/s) moves again.
TEST(AutoCodec, NoCodecIsTakenBackWithoutTheLinkChanging) {
  AutoCodecConfig config;
  config.every = 1;
  config.fit = 1;
  config.relax = 1;
  config.confirm = 1;
  AutoCodec::Link fwd = fwd_link(kBytes);
  AutoCodec a(config, {fwd}, /*workers=*/1, /*microbatches=*/4);
  std::vector<std::string> path;
  auto step = [&](int64_t s, double bps) {
    LinkTraffic act = sent(0, 1, "act", 4 * 16400, 0.1);
    act.serial_s = 4 * 16400 * 8 / bps;
    act.latency_s = 0.010;
    ASSERT_TRUE(a.observe(record(0, s, 4 * 0.0125, {act})));
    for (const AutoDecision& d : a.decide(s)) path.push_back(d.to);
  };
  step(1, 20e6);  // step 1 is warm-up: nothing measured
  for (int64_t s = 2; s < 12; ++s) step(s, s % 2 ? 24e6 : 20e6);
  EXPECT_EQ(path, (std::vector<std::string>{"int8", "bf16"}));
  step(12, 10e6);
  step(13, 10e6);
  EXPECT_EQ(path, (std::vector<std::string>{"int8", "bf16", "int4"}));
}

// The planner's model decides when the job's pipeline is known: the pipeline simulator's step for each codec of the
// link, the least lossy within 2% of the fastest. Over 10 Mbit/s with 50 ms (4 stages, 1F1B, 4 microbatches, 2 + 4 ms
// of compute per microbatch) only int4 is fast enough; the same link under 100 + 200 ms of compute per microbatch
// hides even `none`, which stays; and a link on int4 goes back to `none` only within 70% of the tolerance.
// choose_jointly: the fastest choice, then each link on its least lossy entry that keeps the whole step within the
// tolerance, the links sharing it; hysteresis for entries less lossy than the current.
TEST(AutoCodec, LinksChosenTogetherShareTheTolerance) {
  // Two links of a pipeline, 4 stages of 1F1B, 4 microbatches, 10 Mbit/s and 50 ms each; the step by the simulator.
  const std::vector<uint64_t> bytes = {147528, 73800, 37000, 19656};
  auto step_with = [&](double fwd, double bps) {
    return [=](const std::vector<int>& choice) -> Result<double> {
      PipelineCosts c;
      c.stage_forward.assign(4, fwd);
      c.stage_backward.assign(4, 2 * fwd);
      c.fwd_transfer = {double(bytes[size_t(choice[0])]) * 8 / bps, double(bytes[size_t(choice[1])]) * 8 / bps, 0};
      c.bwd_transfer.assign(3, 0);
      c.fwd_latency.assign(3, 0.050);
      c.bwd_latency.assign(3, 0.050);
      LH_ASSIGN_OR_RETURN(PipelineSchedule s, PipelineSchedule::build(ScheduleKind::k1F1B, 4, 4));
      LH_ASSIGN_OR_RETURN(PipelineSimResult r, simulate_pipeline(s, c));
      return r.makespan;
    };
  };
  // Slow links under fast stages: the fastest is int4 on both; the first link takes int8 within the 5%.
  auto slow_step = step_with(0.002, 10e6);
  JointChoice slow = value_of(choose_jointly({4, 4}, {0, 0}, slow_step, 0.7, 0.05));
  EXPECT_NEAR(slow.fastest_s, value_of(slow_step({3, 3})), 1e-12);
  EXPECT_EQ(slow.index, (std::vector<int>{2, 3}));
  EXPECT_LE(slow.step_s, 1.05 * slow.fastest_s);
  EXPECT_GT(value_of(slow_step({2, 2})), 1.05 * slow.fastest_s);
  // Stages slow enough to hide the links but for the fill and drain: less lossy codecs, the step within 5% of the
  // fastest, and no link can take a less lossy entry without leaving the 5%.
  auto hidden_step = step_with(0.060, 10e6);
  JointChoice hidden = value_of(choose_jointly({4, 4}, {0, 0}, hidden_step, 0.7, 0.05));
  EXPECT_LT(hidden.index[0] + hidden.index[1], 6);
  EXPECT_NEAR(value_of(hidden_step({3, 3})), hidden.fastest_s, 1e-12);
  EXPECT_NEAR(value_of(hidden_step(hidden.index)), hidden.step_s, 1e-12);
  EXPECT_LE(hidden.step_s, 1.05 * hidden.fastest_s);
  for (int k = 0; k < 2; ++k) {
    if (hidden.index[size_t(k)] == 0) continue;
    std::vector<int> less = hidden.index;
    --less[size_t(k)];
    EXPECT_GT(value_of(hidden_step(less)), 1.05 * hidden.fastest_s) << k;
  }
  // Each link alone within 5% would be none + none here; together they would not be.
  EXPECT_GT(value_of(hidden_step({0, 0})), 1.05 * hidden.fastest_s);
  // Decided again from its own choice, the same choice: it settles. From int4 on both, a less lossy entry must fit in
  // relax · tolerance, so the choice is never less lossy in all than from none.
  for (double fwd : {0.002, 0.010, 0.030, 0.060, 0.100}) {
    JointChoice from_none = value_of(choose_jointly({4, 4}, {0, 0}, step_with(fwd, 20e6), 0.7, 0.05));
    EXPECT_EQ(value_of(choose_jointly({4, 4}, from_none.index, step_with(fwd, 20e6), 0.7, 0.05)).index, from_none.index)
        << fwd;
    JointChoice from_int4 = value_of(choose_jointly({4, 4}, {3, 3}, step_with(fwd, 20e6), 0.7, 0.05));
    EXPECT_GE(from_int4.index[0] + from_int4.index[1], from_none.index[0] + from_none.index[1]) << fwd;
  }
  // A step that cannot be predicted is an error, and so is a mismatch of sizes.
  auto broken = [](const std::vector<int>&) -> Result<double> { return invalid_argument("no model"); };
  EXPECT_FALSE(choose_jointly({4}, {0}, broken, 0.7, 0.05).ok());
  EXPECT_FALSE(choose_jointly({4, 4}, {0}, step_with(0.002, 10e6), 0.7, 0.05).ok());
  EXPECT_FALSE(choose_jointly({0}, {0}, broken, 0.7, 0.05).ok());
}

// AutoCodec with the job's pipeline: the window's measurements become the simulator's costs (each stage's slowest
// rank's compute, backward twice forward; each auto link's measured rate and latency), and the decision says so.
TEST(AutoCodec, AJobsPipelineIsSimulatedFromTheWindow) {
  AutoCodecConfig config;
  config.every = 2;
  config.tokens_per_step = 1000;
  AutoCodecConfig::Pipeline pipe;
  pipe.kind = ScheduleKind::k1F1B;
  pipe.stages = 2;
  pipe.stage_of = {{0, 0}, {1, 1}};
  config.pipeline = pipe;
  AutoCodec a(config, {fwd_link({147528, 73800, 37000, 19656})}, /*workers=*/2, /*microbatches=*/4);
  std::optional<int64_t> due;
  for (int64_t s = 1; s <= 2; ++s) {
    LinkTraffic act = sent(0, 1, "act", 4 * 147528, 0.52);
    act.serial_s = 4 * 147528 * 8 / 10e6;
    act.latency_s = 0.050;
    WorkerStepMetrics m0 = record(0, s, 4 * 0.006, {act}), m1 = record(1, s, 4 * 0.006);
    m0.tokens_per_s = m1.tokens_per_s = 1000 / 0.6;
    EXPECT_FALSE(a.observe(m0));
    due = a.observe(m1);
  }
  ASSERT_TRUE(due);
  auto d = a.decide(*due);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].to, "int4") << d[0].reason;
  EXPECT_NE(
      d[0].reason.find("pipeline simulator's step (1f1b, 2 stages, 4 microbatches, every auto link at its measured "
                       "rate and latency); this link at 10.00 Mbit/s"),
      std::string::npos)
      << d[0].reason;
}

TEST(AutoCodec, LadderAndAutoLinksOfAJob) {
  EXPECT_EQ(value_of(parse_auto_ladder("none,int8")), (std::vector<std::string>{"none", "int8"}));
  EXPECT_NE(parse_auto_ladder("none,,int4").status().message().find("entry ''"), std::string::npos);
  EXPECT_NE(parse_auto_ladder("none,int9").status().message().find("int9"), std::string::npos);
  EXPECT_FALSE(parse_auto_ladder("auto").ok());
  JobConfig job;
  job.workers = job.pp = 3;
  job.train.model.layers = 3;
  job.compress_fwd = "auto";
  job.compress_link = {"1-2:fwd=int4", "0-1:bwd=auto"};
  ASSERT_TRUE(job.validate().ok()) << job.validate().to_string();
  auto links = value_of(job.auto_links());
  ASSERT_EQ(links.size(), 2u);  // 0-1:fwd and 0-1:bwd; 1-2:fwd was set to int4, 1-2:bwd is none
  EXPECT_EQ(links[0].first.name(), "0-1");
  EXPECT_EQ(links[0].second, LinkDir::kFwd);
  EXPECT_EQ(links[1].second, LinkDir::kBwd);
  auto plan = value_of(job.codec_plan());
  EXPECT_EQ(plan.spec(links[0].first, LinkDir::kFwd), "none");  // auto starts at the ladder's first codec
  job.auto_ladder = "int8,int4";
  EXPECT_EQ(value_of(job.codec_plan()).spec(links[0].first, LinkDir::kFwd), "int8");
  job.auto_ladder = "int8,lots";
  EXPECT_FALSE(job.validate().ok());
  job.auto_ladder = "none,int8";
  job.auto_every = 0;
  EXPECT_NE(job.validate().message().find("--auto-every"), std::string::npos);
  // Through JSON (the Plan) and back.
  job.auto_every = 7;
  auto again = value_of(JobConfig::from_json(job.to_json().dump()));
  EXPECT_EQ(again.auto_every, 7);
  EXPECT_EQ(again.compress_fwd, "auto");
}

}  // namespace
}  // namespace lh
