// Tests of control-message framing: every type round-trips; wrong magic/version/type, truncation, huge
// length prefixes, stray bytes, invalid fields and random garbage are rejected with a reason, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "transport/messages.h"

namespace lh {
namespace {

Plan sample_plan() {
  Plan p;
  p.rank = 1;
  p.world_size = 4;
  p.stage = 1;
  p.pp = 4;
  p.peers = {{0, "h0", "cpu", {1, 2, 3}}, {1, "h1", "cpu", {4, 5}}};
  p.codecs = {{0, 1, "fwd", "int8"}, {1, 0, "bwd", "lowrank:rank=8+int8"}};
  p.config = R"({"steps": 10, "model": "gpt-tiny"})";
  return p;
}

TEST(Messages, EveryTypeRoundTrips) {
  std::vector<ControlMessage> all = {Join{"tok", "host", "cpu", 12.5, {9, 8, 7}},
                                     sample_plan(),
                                     Ready{3},
                                     Barrier{42},
                                     Heartbeat{7, 12, {PendingLink{1, true, 900, 800}}},
                                     SetCodec{0, 1, "fwd", "int4", 100, 5},
                                     StepMetrics{2, 5, R"({"loss":1.5})"},
                                     Shutdown{"done"},
                                     Reject{"no"},
                                     PeerLost{3, "h3", "silent"},
                                     CtlRequest{"tok", "status", "{}"},
                                     CtlReply{true, "{}"},
                                     ShardSaved{2, 10, {1, 2, 3}},
                                     Rollback{3, "worker 2 lost"},
                                     CodecApplied{1, 5, 100, true, ""},
                                     SetLink{"1-2:bwd=5M,80ms"},
                                     Preflight{3,
                                               {PeerProbe{1, true, "", 40.5f, 5.1f, 86016},
                                                PeerProbe{2, false, "sending to rank 2: timed out", 0, 0, 0}}},
                                     Relays{{1, 0}, {2, 3}, "", 7001},
                                     ShardAck{10, 65536},
                                     ResumeFailed{2, 10, "corrupt shard"},
                                     Preempt{12, "worker 1: this worker was sent SIGTERM"}};
  ASSERT_EQ(all.size(), std::variant_size_v<ControlMessage>);
  for (const auto& m : all) {
    auto bytes = encode_message(m);
    auto back = decode_message(bytes);
    ASSERT_TRUE(back.ok()) << msg_type_name(message_type(m)) << ": " << back.status().to_string();
    EXPECT_EQ(back->index(), m.index());
    EXPECT_EQ(encode_message(*back), bytes);
  }
  auto p = decode_message(encode_message(sample_plan()));
  ASSERT_TRUE(p.ok());
  const Plan& plan = std::get<Plan>(*p);
  EXPECT_EQ(plan.peers[1].ucx_address, (std::vector<uint8_t>{4, 5}));
  EXPECT_EQ(plan.codecs[1].spec, "lowrank:rank=8+int8");
  EXPECT_EQ(plan.config, sample_plan().config);
  Plan resumed = sample_plan();
  resumed.epoch = 2;
  resumed.resume_step = 40;
  resumed.shard = {1, 2, 3, 4};
  resumed.changes = {SetCodec{-1, -1, "grad", "int8", 12}};
  auto r = decode_message(encode_message(resumed));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::get<Plan>(*r).shard, resumed.shard);
  EXPECT_EQ(std::get<Plan>(*r).changes.at(0).apply_at_step, 12);
}

TEST(Messages, ResumeFieldsAreChecked) {
  Plan p = sample_plan();
  p.resume_step = 5;  // without a state
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("resumes at step 5"), std::string::npos);
  p = sample_plan();
  p.epoch = 0;
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("epoch 0"), std::string::npos);
  p = sample_plan();
  p.changes = {SetCodec{-1, 3, "fwd", "int8", 2}};
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("set-codec src"), std::string::npos);
  EXPECT_NE(decode_message(encode_message(ShardSaved{1, 0, {1}})).status().message().find("shard step 0"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(ShardSaved{1, 3, {1, 2}, 10, 11})).status().message().find(
                "shard part [10, +2) of 11 bytes"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(ShardSaved{1, 3, {1}, 0, uint64_t(1) << 40})).status().message().find(
                "shard part [0, +1) of 1099511627776 bytes"),
            std::string::npos);
  EXPECT_TRUE(decode_message(encode_message(ShardSaved{1, 3, {1, 2}, 9, 11})).ok());
  EXPECT_NE(decode_message(encode_message(ShardAck{0, 1})).status().message().find("shard ack step 0"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(ResumeFailed{1, 0, "x"})).status().message().find("resume-failed step 0"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Preempt{-2, "x"})).status().message().find("preempt step -2"),
            std::string::npos);
  EXPECT_TRUE(decode_message(encode_message(Preempt{-1, "SIGTERM"})).ok());
  EXPECT_NE(decode_message(encode_message(ShardSaved{1, 3, {}})).status().message().find("empty shard"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Join{"t", "h", "cpu", 1, {1}, 5000})).status().message().find("join rank"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Rollback{0, "x"})).status().message().find("rollback epoch"),
            std::string::npos);
}

TEST(Messages, HeaderErrorsNameTheProblem) {
  auto b = encode_message(Heartbeat{1, -1, {}});
  auto bad_magic = b;
  bad_magic[0] ^= 1;
  EXPECT_NE(decode_message(bad_magic).status().message().find("magic"), std::string::npos);
  auto bad_version = b;
  bad_version[4] = uint8_t(kProtocolVersion + 1);
  auto s = decode_message(bad_version).status();
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("protocol version " + std::to_string(kProtocolVersion + 1)), std::string::npos)
      << s.to_string();
  auto bad_type = b;
  bad_type[6] = 99;
  EXPECT_NE(decode_message(bad_type).status().message().find("unknown message type 99"), std::string::npos);
  EXPECT_FALSE(decode_message(b.data(), 5).ok());
  auto stray = b;
  stray.push_back(0);
  EXPECT_NE(decode_message(stray).status().message().find("stray"), std::string::npos);
}

TEST(Messages, TruncationAtEveryLengthIsRejected) {
  auto b = encode_message(sample_plan());
  for (size_t n = 0; n < b.size(); ++n) EXPECT_FALSE(decode_message(b.data(), n).ok()) << n;
}

TEST(Messages, HugeLengthPrefixDoesNotAllocate) {
  // A Shutdown whose string claims 2^60 bytes.
  auto b = encode_message(Shutdown{"x"});
  uint64_t huge = uint64_t(1) << 60;
  std::memcpy(b.data() + kControlHeaderBytes, &huge, 8);
  auto s = decode_message(b).status();
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("size prefix"), std::string::npos) << s.to_string();
}

TEST(Messages, InvalidFieldsAreRejected) {
  Plan p = sample_plan();
  p.rank = 9;  // outside world size 4
  EXPECT_FALSE(decode_message(encode_message(p)).ok());
  p = sample_plan();
  p.peers.push_back(p.peers[0]);
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("twice"), std::string::npos);
  p = sample_plan();
  p.tp = 3;
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("grid"), std::string::npos);
  // Axes whose product overflows 64 bits (libFuzzer found it: undefined behaviour before the bound per axis).
  p.pp = p.tp = p.dp = int32_t(1) << 30;
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("grid"), std::string::npos);
  EXPECT_FALSE(decode_message(encode_message(Join{"t", "h", "cpu", -1, {1}})).ok());
  EXPECT_FALSE(decode_message(encode_message(Join{"t", "h", "cpu", 1, {}})).ok());
  EXPECT_FALSE(decode_message(encode_message(Ready{-2})).ok());
  // A pre-flight entry must name a rank and hold a time and a rate.
  EXPECT_NE(decode_message(encode_message(Preflight{1, {PeerProbe{-1, true, "", 1, 1, 0}}}))
                .status()
                .message()
                .find("probe peer"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Preflight{1, {PeerProbe{0, true, "", -3, 1, 0}}}))
                .status()
                .message()
                .find("rtt -3"),
            std::string::npos);
  EXPECT_FALSE(decode_message(encode_message(Preflight{1, {PeerProbe{0, true, "", std::nanf(""), 1, 0}}})).ok());
  Preflight phase{1, {}};
  phase.phase = 7;
  EXPECT_NE(decode_message(encode_message(phase)).status().message().find("pre-flight phase 7"), std::string::npos);
  // Relayed pairs: (low, high) ranks in matching lists, with a port to reach the relay at.
  EXPECT_NE(decode_message(encode_message(Relays{{2}, {1}, "", 7001})).status().message().find("relayed pair 2-1"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Relays{{1, 2}, {3}, "", 7001})).status().message().find("2 low and 1 high"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Relays{{1}, {2}, "", 0})).status().message().find("without a relay port"),
            std::string::npos);
  EXPECT_FALSE(decode_message(encode_message(Relays{{1}, {5000}, "", 7001})).ok());
  EXPECT_TRUE(decode_message(encode_message(Relays{})).ok());
  // Only a role-wide change (grad, tp) may leave both ends unnamed.
  EXPECT_TRUE(decode_message(encode_message(SetCodec{-1, -1, "grad", "int8", 7})).ok());
  EXPECT_NE(decode_message(encode_message(SetCodec{-1, -1, "fwd", "int4", 3})).status().message().find("src -1"),
            std::string::npos);
  EXPECT_FALSE(decode_message(encode_message(SetCodec{-1, 2, "grad", "int4", 3})).ok());
  EXPECT_FALSE(decode_message(encode_message(Join{std::string(10000, 't'), "h", "cpu", 1, {1}})).ok());
  // Names end up in status JSON: valid UTF-8 without control characters.
  EXPECT_NE(decode_message(encode_message(Join{"t", "h\xff\xfe", "cpu", 1, {1}})).status().message().find("UTF-8"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Join{"t", "h", "cpu\n", 1, {1}})).status().message().find("control"),
            std::string::npos);
  EXPECT_TRUE(decode_message(encode_message(Join{"t", "h\xc3\xa9te", "cpu", 1, {1}})).ok());
  // A data-plane public key is 32 bytes, or absent.
  Join keyed{"t", "h", "cpu", 1, {1}};
  keyed.data_key.assign(32, 1);
  EXPECT_TRUE(decode_message(encode_message(keyed)).ok());
  keyed.data_key.resize(31);
  EXPECT_NE(decode_message(encode_message(keyed)).status().message().find("data-plane key"), std::string::npos);
  p = sample_plan();
  p.peers[0].data_key.assign(40, 1);
  EXPECT_NE(decode_message(encode_message(p)).status().message().find("data-plane key"), std::string::npos);
  EXPECT_NE(decode_message(encode_message(StepMetrics{0, int64_t(1) << 40, "{}"})).status().message().find("step"),
            std::string::npos);
  EXPECT_NE(decode_message(encode_message(Heartbeat{1, int64_t(1) << 40, {}})).status().message().find("step"),
            std::string::npos);
}

// Every count in a message has its own bound, checked before anything is allocated: 100 000 peers in a 12 MB Plan
// (within the byte limit, each peer a few bytes) are refused from the count.
TEST(Messages, CountsAreBoundedBeforeAllocating) {
  Plan p = sample_plan();
  p.peers.assign(100000, p.peers[0]);
  auto b = encode_message(p);
  ASSERT_LT(b.size(), kMaxControlMessage);
  auto r = decode_message(b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("plan peers: 100000 entries (max 4096)"), std::string::npos)
      << r.status().message();
  Heartbeat hb;
  hb.pending.assign(10000, PendingLink{1, true, 5, 5});
  EXPECT_NE(decode_message(encode_message(hb)).status().message().find("heartbeat pending links"), std::string::npos);
  // The header alone tells the type and number.
  auto h = decode_header(encode_message(Ready{3}, 77).data(), kControlHeaderBytes);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->type, MsgType::kReady);
  EXPECT_EQ(h->seq, 77u);
}

TEST(Messages, RandomGarbageNeverCrashes) {
  std::mt19937_64 rng(11);
  int accepted = 0;
  auto valid = encode_message(sample_plan());
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b;
    if (i % 2 == 0) {  // pure noise behind a valid header
      b.resize(kControlHeaderBytes + rng() % 200);
      for (auto& x : b) x = uint8_t(rng());
      std::memcpy(b.data(), valid.data(), 6);
      b[6] = uint8_t(1 + rng() % 12);
      b[7] = 0;
    } else {  // a valid message with a few bytes flipped
      b = valid;
      for (int k = 0; k < 3; ++k) b[kControlHeaderBytes + rng() % (b.size() - kControlHeaderBytes)] ^= uint8_t(rng());
    }
    auto r = decode_message(b);
    accepted += r.ok();
  }
  EXPECT_LT(accepted, 20000);  // most garbage is refused; what decodes passed validation
}

}  // namespace
}  // namespace lh
