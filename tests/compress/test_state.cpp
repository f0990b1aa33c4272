// Stateful codecs and stream state: error feedback tracks the running sum, AQ-SGD delta keeps both
// ends' memories equal, lowrank warm starts, and cereal save/restore gives identical next packets.
// Label `compress`.
#include <gtest/gtest.h>

#include <cereal/archives/binary.hpp>
#include <sstream>

#include "codec_test_util.h"

namespace lh::compress {
namespace {

using testing::chain_of;
using testing::gaussian;
using testing::rel_rms;
using testing::round_trip;

TEST(ErrorFeedback, RunningSumOfDecodedTracksRunningSumOfInputs) {
  // With ef, Σ decoded = Σ x − e_T, and e stays bounded, so the relative gap shrinks like 1/T.
  // Without ef, topk drops the same small entries every step and the gap grows with T.
  const int T = 200;
  Tensor sum_x = Tensor::zeros({512}), sum_ef = Tensor::zeros({512}), sum_plain = Tensor::zeros({512});
  CodecChain ef = chain_of("ef+topk:ratio=0.05+int8"), plain = chain_of("topk:ratio=0.05+int8");
  StreamState tx1, rx1, tx2, rx2;
  Tensor base = gaussian({512}, 1);
  for (int t = 0; t < T; ++t) {
    Tensor x = gaussian({512}, 100 + t, 0.3f);
    for (int i = 0; i < 512; ++i) x.at(i) += base.at(i);
    Tensor a = round_trip(ef, x, tx1, rx1), b = round_trip(plain, x, tx2, rx2);
    for (int i = 0; i < 512; ++i) {
      sum_x.at(i) += x.at(i);
      sum_ef.at(i) += a.at(i);
      sum_plain.at(i) += b.at(i);
    }
  }
  double gap_ef = rel_rms(sum_x, sum_ef), gap_plain = rel_rms(sum_x, sum_plain);
  EXPECT_LT(gap_ef, 0.05);
  EXPECT_GT(gap_plain, 0.5);
  // The residual is exactly what is missing: Σx − Σdecoded = e.
  const Tensor& e = tx1.stages().at("0").residual;
  ASSERT_TRUE(e.defined());
  Tensor gap = Tensor::empty({512});
  for (int i = 0; i < 512; ++i) gap.at(i) = sum_x.at(i) - sum_ef.at(i);
  EXPECT_LT(testing::max_abs_diff(gap, e), 1e-2);
}

TEST(Delta, BothEndsKeepTheSameMemoryAndRepeatsGetCheaperToSendAccurately) {
  CodecChain chain = chain_of("delta+int4");
  StreamState tx(Role::kActivation), rx(Role::kActivation);
  std::vector<int64_t> ids = {7, 3, 11};
  EncodeOptions eo;
  eo.sample_ids = &ids;
  Tensor x = gaussian({3, 4, 32}, 5);
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 6; ++epoch) {
    Tensor a = x.clone();
    for (int64_t i = 0; i < a.numel(); ++i) a.at(i) += 0.01f * epoch;  // activations drift slowly
    Packet p;
    ASSERT_TRUE(chain.encode(a, tx, &p, eo).ok());
    Tensor y;
    std::vector<int64_t> got;
    DecodeOptions o;
    o.sample_ids = &got;
    ASSERT_TRUE(chain.decode(p, rx, &y, o).ok());
    EXPECT_EQ(got, ids);
    double e = rel_rms(a, y);
    (epoch == 0 ? first : last) = e;
    for (int64_t id : ids) {
      const Tensor& mt = tx.stages().at("0").memory.at(id);
      const Tensor& mr = rx.stages().at("0").memory.at(id);
      ASSERT_EQ(mt.to_vector(), mr.to_vector()) << "sender and receiver memories differ for sample " << id;
    }
  }
  EXPECT_GT(first, 0.02);
  EXPECT_LT(last, first / 4);  // AQ-SGD: the quantized change is small once memories hold the sample
}

TEST(Delta, RejectsMissingOrDuplicateSampleIds) {
  CodecChain chain = chain_of("delta+int8");
  StreamState tx;
  Tensor x = gaussian({2, 8}, 1);
  Packet p;
  Status s = chain.encode(x, tx, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sample_ids"), std::string::npos) << s.to_string();
  std::vector<int64_t> dup = {4, 4};
  EncodeOptions eo;
  eo.sample_ids = &dup;
  s = chain.encode(x, tx, &p, eo);
  EXPECT_NE(s.message().find("distinct"), std::string::npos) << s.to_string();
  std::vector<int64_t> few = {1};
  eo.sample_ids = &few;
  EXPECT_FALSE(chain.encode(x, tx, &p, eo).ok());
  EXPECT_TRUE(p.bytes.empty());
}

std::string save(const StreamState& st) {
  std::ostringstream os;
  {
    cereal::BinaryOutputArchive ar(os);
    ar(st);
  }
  return os.str();
}
StreamState load(const std::string& bytes) {
  std::istringstream is(bytes);
  cereal::BinaryInputArchive ar(is);
  StreamState st;
  ar(st);
  return st;
}

TEST(StreamStateCheckpoint, SaveRestoreGivesIdenticalNextPackets) {
  std::vector<int64_t> ids = {1, 2};
  EncodeOptions eo;
  eo.sample_ids = &ids;
  for (const char* spec : {"ef+topk:ratio=0.1+int4:stochastic", "ef+lowrank:rank=2+int8", "delta+int8:stochastic",
                           "ef+randk:ratio=0.2+int2:stochastic"}) {
    CodecChain chain = chain_of(spec);
    StreamState tx(Role::kWeightGrad, 42), rx(Role::kWeightGrad);
    for (int t = 0; t < 3; ++t) round_trip(chain, gaussian({2, 40}, t), tx, rx, nullptr, eo);
    StreamState tx2 = load(save(tx)), rx2 = load(save(rx));
    EXPECT_EQ(tx2.role(), Role::kWeightGrad);
    for (int t = 3; t < 6; ++t) {
      Tensor x = gaussian({2, 40}, t);
      Packet a, b;
      ASSERT_TRUE(chain.encode(x, tx, &a, eo).ok());
      ASSERT_TRUE(chain.encode(x, tx2, &b, eo).ok());
      ASSERT_EQ(a.bytes, b.bytes) << spec << " step " << t;
      Tensor ya, yb;
      ASSERT_TRUE(chain.decode(a, rx, &ya).ok());
      ASSERT_TRUE(chain.decode(b, rx2, &yb).ok());
      ASSERT_EQ(ya.to_vector(), yb.to_vector()) << spec;
    }
  }
}

TEST(StreamStateCheckpoint, ADifferentSeedGivesDifferentStochasticPackets) {
  CodecChain chain = chain_of("int4:stochastic");
  StreamState a(Role::kActivation, 1), b(Role::kActivation, 2);
  Tensor x = gaussian({256}, 3);
  Packet pa, pb;
  ASSERT_TRUE(chain.encode(x, a, &pa).ok());
  ASSERT_TRUE(chain.encode(x, b, &pb).ok());
  EXPECT_NE(pa.bytes, pb.bytes);
}

TEST(StreamStateCheckpoint, ChangingTheCodecResetsStageState) {
  StreamState tx, rx;
  Tensor x = gaussian({8, 8}, 1);
  round_trip(chain_of("ef+topk:ratio=0.1"), x, tx, rx);
  EXPECT_TRUE(tx.stages().at("0").residual.defined());
  round_trip(chain_of("lowrank:rank=2"), x, tx, rx);
  EXPECT_FALSE(tx.stages().at("0").residual.defined());
  EXPECT_TRUE(tx.stages().at("0").warm_q.defined());
}

TEST(Decode, FollowsTheSenderAcrossCodecChanges) {
  // The receiver's chain object is irrelevant: the packet says how it was made.
  StreamState tx, rx;
  CodecChain receiver = chain_of("int8");
  Tensor x = gaussian({16, 16}, 2);
  for (const char* spec : {"fp16", "lowrank:rank=16", "none"}) {
    Packet p;
    ASSERT_TRUE(chain_of(spec).encode(x, tx, &p).ok());
    Tensor y;
    ASSERT_TRUE(receiver.decode(p, rx, &y).ok());
    EXPECT_LT(rel_rms(x, y), 1e-3) << spec;
  }
}

}  // namespace
}  // namespace lh::compress
