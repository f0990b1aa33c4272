// Tests for JobConfig (validation naming the flag, JSON round trip and field errors) and the
// codec plan / change conversions to the control messages. Label `plan`.
#include <gtest/gtest.h>

#include "core/gpt.h"
#include "plan/job_config.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

JobConfig four_stages() {
  JobConfig c;
  c.train.model.layers = 8;
  c.train.batch = 8;
  c.workers = c.pp = 4;
  c.partition = "3,2,2,1";
  c.schedule = ScheduleKind::kGPipe;
  c.microbatches = 4;
  c.compress_fwd = "int8";
  c.compress_bwd = "bf16";
  c.compress_link = {"1-2:fwd=int4"};
  c.compress_grad = "ef+int4";
  c.sync = "diloco:H=5,outer_lr=0.5,outer_momentum=0.8";
  c.train.model.subspace_k = 16;
  c.train.seed = 0xFFFFFFFFFFFFull;
  return c;
}

TEST(JobConfig, ValidatesAndBuildsThePieces) {
  JobConfig c = four_stages();
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(value_of(c.make_partition()).to_string(), "3,2,2,1");
  EXPECT_EQ(value_of(c.codec_plan()).spec({1, 2}, LinkDir::kFwd), "int4");
  c.partition.clear();
  EXPECT_EQ(value_of(c.make_partition()).to_string(), "2,2,2,2");

  struct Case {
    void (*change)(JobConfig&);
    const char* says;
  };
  const Case cases[] = {
      {[](JobConfig& c) { c.workers = 3; }, "--workers 3 does not equal"},
      {[](JobConfig& c) { c.partition = "3,3,1,1,0"; }, "--partition"},
      {[](JobConfig& c) { c.microbatches = 3; }, "does not split into --dp 1 replicas × --microbatches 3"},
      {[](JobConfig& c) { c.workers = 12, c.dp = 3; }, "--batch 8 does not split into --dp 3 replicas"},
      {[](JobConfig& c) { c.workers = 8, c.dp = 2, c.compress_grad = "delta"; }, "--compress-grad 'delta'"},
      {[](JobConfig& c) { c.sync = "diloco:H=-1"; }, "H must be an integer >= 1"},
      {[](JobConfig& c) { c.sync = "diloco", c.compress_grad = "powersgd"; }, "--sync every-step"},
      {[](JobConfig& c) { c.microbatches = 0; }, "--microbatches must be at least 1"},
      {[](JobConfig& c) { c.compress_link = {"3-4:fwd=int8"}; }, "'3-4'"},
      {[](JobConfig& c) { c.compress_fwd = "int3"; }, "--compress-fwd"},
      // A job's links send no sample ids: delta is refused up front, not at the first step.
      {[](JobConfig& c) { c.compress_bwd = "delta+int8"; }, "delta needs each sample's id"},
      {[](JobConfig& c) { c.compress_link = {"1-2:fwd=delta"}; }, "delta needs each sample's id"},
      {[](JobConfig& c) { c.train.steps = 0; }, "--steps"},
      {[](JobConfig& c) { c.workers = 8, c.tp = 2; }, "with --subspace-k: tensor parallelism does not"},
      {[](JobConfig& c) { c.workers = 12, c.tp = 3, c.train.model.subspace_k = 0; },
       "--tp 3 does not divide the model's 4 heads; give the shards whole heads with --tp-split 2:1:1"},
      {[](JobConfig& c) { c.tp_split = "3:1"; }, "--tp-split 3:1 needs --tp > 1"},
      {[](JobConfig& c) { c.workers = 8, c.tp = 2, c.train.model.subspace_k = 0, c.compress_tp = "int3"; },
       "--compress-tp 'int3'"},
      {[](JobConfig& c) {
         c.workers = 8, c.tp = 2, c.train.model.subspace_k = 0, c.microbatches = 8, c.train.batch = 1024,
         c.train.model.layers = 1024, c.partition = "";
       },
       "use fewer --microbatches or more stages"},
      {[](JobConfig& c) { c.workers = 8, c.tp = 2, c.train.model.subspace_k = 0, c.compress_link = {"t0-t1=int8"}; },
       "a tp group's sums use one codec, --compress-tp"},
  };
  for (const Case& k : cases) {
    JobConfig bad = four_stages();
    k.change(bad);
    expect_error(bad.validate(), k.says);
  }
}

TEST(JobConfig, ReplicaLinkOverridesSetEachGroupsGradientCodec) {
  JobConfig c = four_stages();
  c.pp = 2;
  c.dp = 2;
  c.workers = 4;
  c.partition.clear();
  c.sync = "every-step";
  c.compress_link = {"0-1:fwd=int4", "s1d0-s1d1=int8"};
  EXPECT_EQ(value_of(c.grad_specs()), (std::vector<std::string>{"ef+int4", "int8"}));
  EXPECT_EQ(value_of(c.codec_plan()).spec({0, 1}, LinkDir::kFwd), "int4");  // pipeline entries still apply
  c.compress_link = {"d0-d1=bf16", "s0d0-s0d1=powersgd:rank=2"};            // later wins
  EXPECT_EQ(value_of(c.grad_specs()), (std::vector<std::string>{"powersgd:rank=2", "bf16"}));
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  for (auto [entry, says] : std::vector<std::pair<std::string, std::string>>{
           {"s0d0-s0d1:fwd=int4", "drop the :fwd/:bwd"},
           {"s0d0-s1d1=int4", "a cross pair carries no codec"},
           {"d0-d1=lowrank:rank=2", "'lowrank' cannot compress"},
           {"d0-d1=int9", "int9"},
       }) {
    JobConfig bad = c;
    bad.compress_link = {entry};
    Status s = bad.validate();
    ASSERT_FALSE(s.ok()) << entry;
    EXPECT_NE(s.message().find("--compress-link '" + entry + "'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  }
}

TEST(JobConfig, JsonRoundTripAndFieldErrors) {
  const JobConfig c = four_stages();
  const nlohmann::json j = c.to_json();
  JobConfig back = value_of(JobConfig::from_json(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.train.seed, c.train.seed);
  EXPECT_EQ(back.train.model, c.train.model);
  EXPECT_EQ(back.schedule, ScheduleKind::kGPipe);

  auto with = [&](const std::string& pointer, const nlohmann::json& value) {
    nlohmann::json k = j;
    if (value.is_discarded())
      k.erase(k.find(pointer.substr(1)));
    else
      k[nlohmann::json::json_pointer(pointer)] = value;
    return JobConfig::from_json(k.dump()).status();
  };
  const nlohmann::json gone = nlohmann::json(nlohmann::json::value_t::discarded);
  expect_error(with("/pp", gone), "field 'pp': missing");
  expect_error(with("/pp", "4"), "field 'pp': expected an integer");
  expect_error(with("/model/layers", 2.5), "field 'model.layers'");
  expect_error(with("/model/layers", 99999999999LL), "field 'model.layers': out of range");
  expect_error(with("/train/seed", -1), "field 'train.seed'");
  expect_error(with("/train/device", "tpu"), "field 'train.device': expected cpu or cuda");
  expect_error(with("/schedule", "zigzag"), "field 'schedule': schedule 'zigzag' is unknown");
  expect_error(with("/compress_link", nlohmann::json::array({1})), "field 'compress_link'");
  expect_error(with("/model", 3), "field 'model': expected an object");
  expect_error(with("/workers", 5), "--workers 5");
  expect_error(JobConfig::from_json("{").status(), "not valid JSON");
  expect_error(JobConfig::from_json(R"({"steps": 1e999})").status(), "not valid JSON");
  expect_error(JobConfig::from_json("[]").status(), "expected a JSON object");
}

// --elastic: a job without one replica keeps the others' slices of the original global batch, round-trips through
// JSON (the plan carries it), resumes from the same checkpoints (the resume hash ignores the replicas), and refuses
// slices that do not fit.
TEST(JobConfig, WithoutAReplicaKeepsTheOthersSlices) {
  JobConfig c = four_stages();
  c.pp = 2;
  c.dp = 3;
  c.workers = 6;
  c.train.batch = 12;
  c.microbatches = 2;
  c.partition = "";
  c.compress_link.clear();
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(c.slices(), 3);
  EXPECT_EQ(c.slice_of(2), 2);
  JobConfig two = value_of(c.without_replica(1));
  EXPECT_EQ(two.dp, 2);
  EXPECT_EQ(two.workers, 4);
  EXPECT_EQ(two.slices(), 3);
  EXPECT_EQ(two.slice_of(0), 0);
  EXPECT_EQ(two.slice_of(1), 2);
  EXPECT_EQ(two.resume_hash(), c.resume_hash());
  JobConfig one = value_of(two.without_replica(0));
  EXPECT_EQ(one.replica_slices, std::vector<int>{2});
  EXPECT_EQ(one.slices(), 3);
  EXPECT_EQ(value_of(JobConfig::from_json(one.to_json().dump())).to_json(), one.to_json());
  expect_error(one.without_replica(0).status(), "one replica");
  expect_error(c.without_replica(3).status(), "replica 3 outside 0..2");
  JobConfig bad = two;
  bad.replica_slices = {2, 0};
  expect_error(bad.validate(), "replica slices must rise");
  bad.replica_slices = {0, 3};
  expect_error(bad.validate(), "replica slices must rise within 0..2");
  bad.replica_slices = {0};
  expect_error(bad.validate(), "1 replica slices of 3 for --dp 2");
  nlohmann::json j = two.to_json();
  j["replica_slices"] = "0,2";
  expect_error(JobConfig::from_json(j.dump()).status(), "field 'replica_slices'");
}

TEST(JobConfig, SpeedPartitionIsSettledAtPlanning) {
  JobConfig c = four_stages();
  c.partition = "speed";
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(value_of(c.make_partition()).to_string(), "2,2,2,2");  // until planned
  EXPECT_EQ(value_of(c.planned_partition({3, 1, 1, 1})), "5,1,1,1");
  EXPECT_EQ(value_of(c.planned_partition({3, 0, 1, 1})), "2,2,2,2");  // a speed unknown: even
  expect_error(c.planned_partition({1, 1}).status(), "2 speeds for 4 workers");
  EXPECT_EQ(value_of(JobConfig::from_json(c.to_json().dump())).partition, "speed");
  c.partition = "3,2,2,1";
  EXPECT_EQ(value_of(c.planned_partition({})), "3,2,2,1");
  c.partition.clear();
  EXPECT_EQ(value_of(c.planned_partition({})), "");
}

TEST(JobConfig, TensorShardSplitsAndTheirSpeedPlan) {
  JobConfig c = four_stages();
  c.train.model.subspace_k = 0;
  c.train.model.heads = 4;
  c.workers = 16;  // pp 4 × tp 2 × dp 2
  c.tp = 2;
  c.dp = 2;
  c.compress_tp = "lowrank:rank=8+int8";
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(value_of(c.tp_heads_split()), (std::vector<int>{2, 2}));
  c.tp_split = "3:1";
  EXPECT_EQ(value_of(c.tp_heads_split()), (std::vector<int>{3, 1}));
  const JobConfig back = value_of(JobConfig::from_json(c.to_json().dump()));
  EXPECT_EQ(back.tp_split, "3:1");
  EXPECT_EQ(back.compress_tp, "lowrank:rank=8+int8");
  c.tp_split = "speed";
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(value_of(c.tp_heads_split()), (std::vector<int>{2, 2}));  // until planned
  // Shard index 1's slowest worker is 3× slower than index 0's: it gets one head of four.
  std::vector<double> speeds(16, 3.0);
  for (int r = 1; r < 16; r += 2) speeds[r] = 2.0;
  speeds[7] = 1.0;
  EXPECT_EQ(value_of(c.planned_tp_split(speeds)), "3:1");
  speeds[7] = 0;  // unknown: even
  EXPECT_EQ(value_of(c.planned_tp_split(speeds)), "2:2");
  expect_error(c.planned_tp_split({1, 1}).status(), "2 speeds for 16 workers");
  // The stage partition by speed takes each stage's slowest worker.
  c.partition = "speed";
  std::vector<double> stage_speeds(16, 1.0);
  for (int r = 0; r < 4; ++r) stage_speeds[r] = 3.0;  // stage 0's four workers
  stage_speeds[2] = 2.0;
  EXPECT_EQ(value_of(c.planned_partition(stage_speeds)),
            value_of(JobConfig(c).planned_partition({2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})));
}

// --dp-split: weights become sequences per replica in whole microbatches, the slowest replica's share minimised;
// "speed" is planned from each replica's slowest worker; what cannot be split is named.
TEST(JobConfig, ReplicaSharesOfTheBatch) {
  JobConfig c;
  c.train.model.layers = 4;
  c.train.batch = 16;
  c.workers = 4;
  c.pp = 2;
  c.dp = 2;
  c.microbatches = 2;
  EXPECT_TRUE(value_of(c.dp_rows()).empty());
  c.dp_split = "3:1";
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(value_of(c.dp_rows()), (std::vector<int>{12, 4}));
  c.dp_split = "1:1000";
  EXPECT_EQ(value_of(c.dp_rows()), (std::vector<int>{2, 14}));  // at least one microbatch each
  c.dp_split = "2.5:2.5";
  EXPECT_EQ(value_of(c.dp_rows()), (std::vector<int>{8, 8}));
  EXPECT_EQ(value_of(JobConfig::from_json(c.to_json().dump())).dp_split, "2.5:2.5");
  // Each replica takes its slowest worker (ranks: stage · dp + replica): replica 1's worker on stage 1 is 3x slower.
  c.dp_split = "speed";
  ASSERT_TRUE(c.validate().ok());
  EXPECT_TRUE(value_of(c.dp_rows()).empty());  // until planned
  EXPECT_EQ(value_of(c.planned_dp_split({3, 3, 3, 1})), "12:4");
  expect_error(c.planned_dp_split({1, 1}).status(), "2 speeds for 4 workers");
  // The resume hash does not depend on how the batch is shared.
  JobConfig even = c;
  even.dp_split = "";
  EXPECT_EQ(c.resume_hash(), even.resume_hash());
  for (const auto& [split, says] :
       std::vector<std::pair<std::string, std::string>>{{"3:x", "entry 2 'x' is not a positive weight"},
                                                        {"3:0", "entry 2 '0' is not a positive weight"},
                                                        {"1:1:1", "has 3 weights for --dp 2"}}) {
    c.dp_split = split;
    expect_error(c.validate(), says);
  }
  c.dp_split = "1:1";
  c.sync = "diloco:H=5";
  expect_error(c.validate(), "with --sync diloco is not supported");
  c.sync = "every-step";
  c.microbatches = 16;  // one share of 16 sequences: not enough for two replicas
  expect_error(c.validate(), "must split into at least --dp 2 shares of whole --microbatches 16");
  c.microbatches = 2;
  c.dp = 1;
  c.workers = 2;
  expect_error(c.validate(), "--dp-split 1:1 needs --dp > 1");
}

TEST(TpSplit, EvenWeightedAndBySpeedWithFixesInTheErrors) {
  EXPECT_EQ(value_of(tp_heads("", 2, 4)), (std::vector<int>{2, 2}));
  EXPECT_EQ(value_of(tp_heads("3:1", 2, 8)), (std::vector<int>{6, 2}));
  EXPECT_EQ(value_of(tp_heads("1:1:2", 3, 4)), (std::vector<int>{1, 1, 2}));
  expect_error(tp_heads("3:2", 2, 4).status(),
               "gives shard 0 2.4 of the model's 4 heads; heads must divide: use "
               "--tp-split 2:2");
  expect_error(tp_heads("", 4, 6).status(), "--tp-split 2:2:1:1");
  expect_error(tp_heads("", 8, 6).status(), "needs at least one head per shard");
  expect_error(tp_heads("3:x", 2, 4).status(), "'x' is not a positive whole weight");
  expect_error(tp_heads("3:0", 2, 4).status(), "'0' is not a positive whole weight");
  expect_error(tp_heads("speed", 2, 4).status(), "settled by the coordinator");
  EXPECT_EQ(value_of(tp_heads_by_speed({4, 1}, 5)), (std::vector<int>{4, 1}));
  EXPECT_EQ(value_of(tp_heads_by_speed({100, 1}, 4)), (std::vector<int>{3, 1}));  // every shard keeps a head
  EXPECT_EQ(value_of(tp_heads_by_speed({1, 1, 1}, 4)), (std::vector<int>{2, 1, 1}));
  const TpShard s = tp_shard({3, 1}, 1);
  EXPECT_EQ(s.head_begin, 3);
  EXPECT_EQ(s.head_end, 4);
  EXPECT_EQ(s.size, 2);
  EXPECT_EQ(tp_split_string({6, 2}), "6:2");
}

TEST(PlanCodecs, RoundTripThroughLinkCodecs) {
  Topology t = value_of(Topology::pipeline(3));
  CodecPlan plan = value_of(CodecPlan::create(t, "int8", "bf16", {"1-2:fwd=topk:ratio=0.1+int8"}));
  std::vector<LinkCodec> entries = link_codecs_of(plan, t);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[1].src, 1);
  EXPECT_EQ(entries[1].dst, 0);
  EXPECT_EQ(entries[1].dir, "bwd");
  CodecPlan back = value_of(codec_plan_from_link_codecs(entries, t));
  EXPECT_EQ(back.describe(), plan.describe());

  auto broken = [&](void (*change)(std::vector<LinkCodec>&)) {
    std::vector<LinkCodec> e = entries;
    change(e);
    return codec_plan_from_link_codecs(e, t).status();
  };
  expect_error(broken([](std::vector<LinkCodec>& e) { e.pop_back(); }), "no bwd codec for link 1-2");
  expect_error(broken([](std::vector<LinkCodec>& e) { e[0].dst = 2; }), "are not pipeline neighbours");
  expect_error(broken([](std::vector<LinkCodec>& e) { e[0].dir = "bwd"; }),
               "bwd traffic does not flow from rank 0 to rank 1");
  expect_error(broken([](std::vector<LinkCodec>& e) { e[0].src = 7; }), "outside 0..2");
  expect_error(broken([](std::vector<LinkCodec>& e) { e[2].spec = "int9"; }), "unknown codec 'int9'");
  // Two replicas of one pipeline link must agree.
  Topology dp2 = value_of(Topology::create(4, 2, 1, 2));
  std::vector<LinkCodec> two = link_codecs_of(value_of(CodecPlan::create(dp2, "int8", "int8", {})), dp2);
  ASSERT_EQ(two.size(), 4u);
  EXPECT_TRUE(codec_plan_from_link_codecs(two, dp2).ok());
  two[2].spec = "int4";
  expect_error(codec_plan_from_link_codecs(two, dp2).status(), "disagrees with 'int8'");
}

TEST(PlanCodecs, SetCodecMessagesBecomeStepAlignedChanges) {
  Topology t = value_of(Topology::pipeline(3));
  CodecSchedule schedule(t, value_of(CodecPlan::create(t, "none", "none", {})));
  ASSERT_TRUE(schedule.begin_step(6).ok());
  SetCodec m;
  m.src = 2;
  m.dst = 1;
  m.dir = "bwd";
  m.spec = "int8";
  CodecChange c = value_of(codec_change_of(m, t, schedule));
  EXPECT_EQ(c.link.name(), "1-2");
  EXPECT_EQ(c.dir, LinkDir::kBwd);
  EXPECT_EQ(c.from_step, 7);
  ASSERT_TRUE(schedule.schedule_change(c).ok());
  SetCodec again = set_codec_message(c, t);
  EXPECT_EQ(again.src, 2);
  EXPECT_EQ(again.dst, 1);
  EXPECT_EQ(again.apply_at_step, 7);
  EXPECT_EQ(value_of(codec_change_of(again, t, schedule)).from_step, 7);
  m.dir = "fwd";
  expect_error(codec_change_of(m, t, schedule).status(), "fwd traffic does not flow from rank 2 to rank 1");
  m.dir = "bwd";
  m.apply_at_step = -5;
  expect_error(codec_change_of(m, t, schedule).status(), "apply_at_step -5");
}

// The data plane's bounds come from the job: above every tensor the job sends (the whole model's parameters, counted
// by the model itself; the batch's activations), and far below the 16 GiB a plane allows when nothing says more.
TEST(JobConfig, DataPlaneBoundsCoverTheJobsLargestTensors) {
  for (const char* preset : {"tiny", "small", "base"}) {
    SCOPED_TRACE(preset);
    JobConfig c;
    c.train.model = value_of(gpt_preset(preset));
    for (bool tied : {false, true}) {
      c.train.model.tied_head = tied;
      Gpt model = value_of(Gpt::create(c.train.model, Device::cpu, 1));
      const uint64_t param_bytes = uint64_t(model.num_params()) * 4;
      const uint64_t act_bytes = uint64_t(c.train.batch) * c.train.model.seq * c.train.model.d_model * 4;
      const auto b = c.data_plane_bounds();
      EXPECT_GE(b.max_packet_bytes, 2 * param_bytes);
      EXPECT_GE(b.max_packet_bytes, 2 * act_bytes);
      EXPECT_LE(b.max_packet_bytes, 2 * std::max(param_bytes, act_bytes) * 11 / 10 + (uint64_t(9) << 20));
      EXPECT_GE(b.max_unexpected_bytes, 2 * (param_bytes + act_bytes));
      EXPECT_LT(b.max_unexpected_bytes, uint64_t(4) << 30);
    }
  }
}

}  // namespace
}  // namespace lh
