// CPU vs CUDA equality of every codec: byte-identical packets for the elementwise, quantizing and
// sparsifying codecs (same functors, same Philox draws), matching decodes across devices, and
// BLAS-vs-cuBLAS agreement for lowrank/subspace. Labels `compress` and `gpu`; skips without a device.
#include <gtest/gtest.h>

#include "codec_test_util.h"
#include "core/cuda_runtime.h"

namespace lh::compress {
namespace {

using testing::chain_of;
using testing::gaussian;
using testing::max_abs_diff;
using testing::rel_rms;

class CodecsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_device_summary();
  }
};

Tensor on_gpu(const Tensor& t) {
  auto r = t.to(Device::cuda);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return *r;
}

TEST_F(CodecsGpu, ElementwiseAndSparseCodecsGiveIdenticalPackets) {
  std::vector<int64_t> ids = {5, 6, 7};
  EncodeOptions eo;
  eo.sample_ids = &ids;
  for (const char* spec :
       {"none", "fp16", "bf16", "int8", "int4", "int2", "int8:block=32,scale=fp32", "int4:block=128,stochastic",
        "int2:stochastic", "topk:ratio=0.01", "randk:ratio=0.1", "ef+topk:ratio=0.05+int4",
        "randk:ratio=0.2+topk:ratio=0.3+int8", "delta+int4", "int8+zstd", "ef+int4+zstd", "spikes+int4",
        "spikes:block=32,n=3,values=fp32+int2:block=32", "ef+spikes:block=8+int4+zstd"}) {
    for (const Shape& shape : {Shape{3, 1000}, Shape{3, 77, 129}}) {
      Tensor x = gaussian(shape, 17);
      Tensor xg = on_gpu(x);
      StreamState tc(Role::kActivation, 9), tg(Role::kActivation, 9);
      for (int step = 0; step < 3; ++step) {  // later steps exercise ef residuals and delta memories
        Packet pc, pg;
        ASSERT_TRUE(chain_of(spec).encode(x, tc, &pc, eo).ok()) << spec;
        Status s = chain_of(spec).encode(xg, tg, &pg, eo);
        ASSERT_TRUE(s.ok()) << spec << ": " << s.to_string();
        ASSERT_EQ(pc.bytes, pg.bytes) << spec << " " << shape_string(shape) << " step " << step;
      }
    }
  }
}

TEST_F(CodecsGpu, DecodingOnEitherDeviceGivesTheSameTensor) {
  for (const char* spec : {"fp16", "bf16", "int8", "int4:block=32", "int2", "topk:ratio=0.1+int8", "randk:ratio=0.3",
                           "int4+zstd", "spikes:n=2+int4"}) {
    Tensor x = gaussian({64, 96}, 3);
    StreamState tx, rc, rg;
    Packet p;
    ASSERT_TRUE(chain_of(spec).encode(x, tx, &p).ok());
    Tensor yc, yg;
    ASSERT_TRUE(decode_packet(p.bytes.data(), p.size(), rc, &yc).ok());
    DecodeOptions o;
    o.device = Device::cuda;
    Status s = decode_packet(p.bytes.data(), p.size(), rg, &yg, o);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(yg.device(), Device::cuda);
    EXPECT_EQ(yc.to_vector(), yg.to_vector()) << spec;
  }
}

TEST_F(CodecsGpu, MatmulCodecsAgreeWithinFloatTolerance) {
  const int n = 200, m = 128, R = 4;
  Tensor a = gaussian({n, R}, 1), b = gaussian({R, m}, 2), x = Tensor::zeros({n, m});
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j)
      for (int r = 0; r < R; ++r) x.at(i * m + j) += a.at(i * R + r) * b.at(r * m + j);
  for (const char* spec : {"lowrank:rank=4", "lowrank:rank=4,iters=2+bf16", "subspace:k=16", "subspace:k=16+int8"}) {
    StreamState tc, tg, rc, rg;
    Packet pc, pg;
    ASSERT_TRUE(chain_of(spec).encode(x, tc, &pc).ok());
    Status s = chain_of(spec).encode(on_gpu(x), tg, &pg);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(pc.size(), pg.size());
    Tensor yc, yg;
    ASSERT_TRUE(decode_packet(pc.bytes.data(), pc.size(), rc, &yc).ok());
    DecodeOptions o;
    o.device = Device::cuda;
    ASSERT_TRUE(decode_packet(pg.bytes.data(), pg.size(), rg, &yg, o).ok());
    EXPECT_LT(rel_rms(yc, yg), 2e-2) << spec;
    if (std::string(spec) == "lowrank:rank=4") {
      EXPECT_LT(rel_rms(x, yg), 1e-4);
    }
  }
}

TEST_F(CodecsGpu, HalfInputsAndInPlaceOutputsOnTheDevice) {
  Tensor x = gaussian({8, 256}, 5);
  StreamState tx, rx;
  Packet p;
  ASSERT_TRUE(chain_of("int8").encode(on_gpu(x), tx, &p).ok());
  auto out = Tensor::create({8, 256}, DType::f32, Device::cuda);
  ASSERT_TRUE(out.ok());
  Tensor y = *out;
  void* before = y.raw_data();
  ASSERT_TRUE(decode_packet(p.bytes.data(), p.size(), rx, &y).ok());
  EXPECT_EQ(y.raw_data(), before);
  EXPECT_LT(rel_rms(x, y), 0.01);
  EXPECT_LT(max_abs_diff(x, y), 0.05);
}

}  // namespace
}  // namespace lh::compress
