// Tests for Tensor, Status and the Philox RNG (label core).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/cuda_runtime.h"
#include "core/hd.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace lh {
namespace {

TEST(Status, CarriesCodeMessageAndContext) {
  Status s = invalid_argument("bad flag --foo");
  s.add_context("core/x.cpp", 12);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("bad flag --foo"), std::string::npos);
  EXPECT_NE(s.to_string().find("x.cpp:12"), std::string::npos);
}

Result<int> half_of(int x) {
  if (x % 2) return invalid_argument("odd");
  return x / 2;
}
Status use_half(int x, int* out) {
  LH_ASSIGN_OR_RETURN(int h, half_of(x));
  *out = h;
  return Status::Ok();
}

TEST(Status, AssignOrReturnPropagates) {
  int out = -1;
  EXPECT_TRUE(use_half(8, &out).ok());
  EXPECT_EQ(out, 4);
  Status s = use_half(7, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 4);  // output untouched on failure
}

TEST(Tensor, CreateViewSlice) {
  Tensor t = Tensor::zeros({4, 6});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  for (int i = 0; i < 24; ++i) t.at(i) = float(i);
  Tensor v = t.view({2, 12});
  EXPECT_EQ(v.data<float>(), t.data<float>());
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.at(0), 6.f);
  Tensor c = s.clone();
  c.at(0) = -1.f;
  EXPECT_EQ(t.at(6), 6.f);
  EXPECT_EQ(Tensor::create({-1, 2}).status().code(), StatusCode::kInvalidArgument);
}

TEST(Tensor, CopyFromChecksShape) {
  Tensor a = Tensor::zeros({3}), b = Tensor::zeros({4});
  EXPECT_FALSE(a.copy_from(b).ok());
  Tensor c = Tensor::from_vector({1, 2, 3}, {3});
  EXPECT_TRUE(a.copy_from(c).ok());
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1, 2, 3}));
}

TEST(Tensor, CudaAllocationFailsCleanlyWithoutDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  auto r = Tensor::create({4}, DType::f32, Device::cuda);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

TEST(Philox, KnownAnswer) {
  // Random123's published known-answer vector for philox4x32-10 with all-zero counter and key.
  Philox4 r = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Philox, StreamsDifferAndMomentsAreRight) {
  std::set<uint32_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(philox_u32(1, 0, i));
  EXPECT_GT(seen.size(), 995u);
  EXPECT_NE(philox_u32(1, 0, 0), philox_u32(1, 1, 0));
  EXPECT_NE(philox_u32(1, 0, 0), philox_u32(2, 0, 0));
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = philox_normal(3, 0, i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

TEST(HalfFloats, RoundTripAndRounding) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down to 1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(65504.f), 0x7bff);
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp16_to_float(0x0001), 5.9604644775390625e-08f);  // smallest subnormal
  for (float x : {0.1f, -3.7f, 1000.25f, 6e-5f, 1e-7f}) {
    float back = fp16_to_float(float_to_fp16(x));
    EXPECT_NEAR(back, x, std::fabs(x) * 1e-3 + 6e-8) << x;
  }
}

}  // namespace
}  // namespace lh
