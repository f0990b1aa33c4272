// GPU tests of the data plane's device-memory API (label gpu; they skip without a CUDA device): CUDA buffers
// round-trip between two UcxDataPlanes over loopback, from 0 bytes to 64 MiB, both with UCX's own CUDA path
// where this UCX has one and with pinned host staging forced; contents are checked by copying back to the host.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/tensor.h"
#include "tests/transport/byte_pattern.h"
#include "tests/transport/plane_util.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using test::pattern;

std::unique_ptr<UcxDataPlane> make_plane(bool force_staging) {
  UcxOptions o;
  o.tls = test::test_tls("");
  o.force_device_staging = force_staging;
  return test::loopback_plane(o);
}

// A device buffer holding `host` (or `n` bytes of zeros' worth of space when host is empty).
std::shared_ptr<Storage> device_buffer(size_t n) {
  auto s = Storage::allocate(n ? n : 1, Device::cuda);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(s).value() : nullptr;
}
Bytes to_host(const Storage& s, size_t n) {
  Bytes b(n);
  Status st = copy_bytes(b.data(), Device::cpu, s.data(), Device::cuda, n);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return b;
}

class DeviceDataPlane : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_device_summary();
    a = make_plane(GetParam());
    b = make_plane(GetParam());
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
    ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
    if (GetParam()) {
      EXPECT_FALSE(a->device_memory_direct(Device::cuda));
    } else {
      EXPECT_EQ(a->device_memory_direct(Device::cuda), a->ucx_supports_cuda_memory());
    }
    std::printf("UCX transports %s, CUDA memory support %d, path %s\n", a->transports().c_str(),
                int(a->ucx_supports_cuda_memory()), a->device_memory_direct(Device::cuda) ? "direct" : "staged");
  }
  std::unique_ptr<UcxDataPlane> a, b;
};

TEST_P(DeviceDataPlane, DeviceToDeviceRoundTripsFromZeroTo64MiB) {
  std::vector<size_t> sizes = {0, 1, 7, 4097, 65536, 1 << 20, 8 << 20, 64 << 20};
  std::vector<std::shared_ptr<Storage>> src, dst;
  std::vector<Bytes> want;
  for (size_t i = 0; i < sizes.size(); ++i) {
    want.push_back(pattern(sizes[i], uint32_t(i) + 1));
    src.push_back(device_buffer(sizes[i]));
    dst.push_back(device_buffer(sizes[i]));
    ASSERT_TRUE(src.back() && dst.back());
    ASSERT_TRUE(copy_bytes(src.back()->data(), Device::cuda, want.back().data(), Device::cpu, sizes[i]).ok());
  }
  // Even indices: receive posted first. Odd: the packet is sent first (it may arrive before the receive).
  std::vector<Transfer> sends(sizes.size()), recvs(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tag tag = make_tag(uint32_t(i), 0, Role::kActivation);
    if (i % 2 == 0) recvs[i] = b->recv_into_device(0, tag, dst[i]->data(), sizes[i], Device::cuda);
    sends[i] = a->send_device(1, tag, src[i]->data(), sizes[i], Device::cuda, sizes[i]);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t i = 1; i < sizes.size(); i += 2)
    recvs[i] =
        b->recv_into_device(0, make_tag(uint32_t(i), 0, Role::kActivation), dst[i]->data(), sizes[i], Device::cuda);
  for (size_t i = 0; i < sizes.size(); ++i) {
    Status s = sends[i].wait(std::chrono::seconds(60));
    ASSERT_TRUE(s.ok()) << sizes[i] << ": " << s.to_string();
    Status r = recvs[i].wait(std::chrono::seconds(60));
    ASSERT_TRUE(r.ok()) << sizes[i] << ": " << r.to_string();
    EXPECT_EQ(recvs[i].wire_bytes(), sizes[i]);
    EXPECT_TRUE(to_host(*dst[i], sizes[i]) == want[i]) << "size " << sizes[i];
  }
  if (!a->device_memory_direct(Device::cuda)) {
    EXPECT_GT(a->staging_bytes(), 0u);
  }
}

TEST_P(DeviceDataPlane, RepeatedTransfersReuseStagingAndBothDirectionsWork) {
  const size_t n = 3 << 20;
  auto da = device_buffer(n), db = device_buffer(n);
  ASSERT_TRUE(da && db);
  uint64_t staged_after_first = 0;
  for (int round = 0; round < 20; ++round) {
    Bytes want = pattern(n, 100 + round);
    bool forward = round % 2 == 0;
    UcxDataPlane& from = forward ? *a : *b;
    UcxDataPlane& to = forward ? *b : *a;
    auto& src = forward ? da : db;
    auto& dst = forward ? db : da;
    ASSERT_TRUE(copy_bytes(src->data(), Device::cuda, want.data(), Device::cpu, n).ok());
    Tag tag = make_tag(uint32_t(round), 1, Role::kWeightGrad);
    Transfer r = to.recv_into_device(from.rank(), tag, dst->data(), n, Device::cuda);
    Transfer s = from.send_device(to.rank(), tag, src->data(), n, Device::cuda);
    ASSERT_TRUE(s.wait(std::chrono::seconds(30)).ok()) << s.status().to_string();
    ASSERT_TRUE(r.wait(std::chrono::seconds(30)).ok()) << r.status().to_string();
    ASSERT_TRUE(to_host(*dst, n) == want) << "round " << round;
    if (round == 1) staged_after_first = a->staging_bytes() + b->staging_bytes();
  }
  // One round at a time: the pinned buffers are reused, not piled up.
  EXPECT_EQ(a->staging_bytes() + b->staging_bytes(), staged_after_first);
}

TEST_P(DeviceDataPlane, MixedHostAndDeviceEnds) {
  const size_t n = 1 << 20;
  Bytes want = pattern(n, 7);
  auto d = device_buffer(n);
  ASSERT_TRUE(d);
  ASSERT_TRUE(copy_bytes(d->data(), Device::cuda, want.data(), Device::cpu, n).ok());
  // device → host
  Bytes host(n);
  Transfer r = b->recv_into(0, make_tag(1, 0, Role::kActivation), host.data(), n);
  ASSERT_TRUE(a->send_device(1, make_tag(1, 0, Role::kActivation), d->data(), n, Device::cuda).wait().ok());
  ASSERT_TRUE(r.wait(std::chrono::seconds(30)).ok()) << r.status().to_string();
  EXPECT_TRUE(host == want);
  // host → device
  Bytes back = pattern(n, 8);
  auto d2 = device_buffer(n);
  ASSERT_TRUE(d2);
  Transfer r2 = a->recv_into_device(1, make_tag(2, 0, Role::kActivation), d2->data(), n, Device::cuda);
  ASSERT_TRUE(b->send(0, make_tag(2, 0, Role::kActivation), back).wait().ok());
  ASSERT_TRUE(r2.wait(std::chrono::seconds(30)).ok()) << r2.status().to_string();
  EXPECT_TRUE(to_host(*d2, n) == back);
}

TEST_P(DeviceDataPlane, TooSmallDeviceBufferFailsAndThePlaneCarriesOn) {
  auto small = device_buffer(100), src = device_buffer(4096);
  ASSERT_TRUE(small && src);
  Transfer r = b->recv_into_device(0, make_tag(3, 0, Role::kActivation), small->data(), 100, Device::cuda);
  Transfer s = a->send_device(1, make_tag(3, 0, Role::kActivation), src->data(), 4096, Device::cuda);
  Status rs = r.wait(std::chrono::seconds(30));
  EXPECT_EQ(rs.code(), StatusCode::kOutOfRange) << rs.to_string();
  EXPECT_TRUE(s.wait(std::chrono::seconds(30)).ok());
  Bytes want = pattern(100, 9);
  ASSERT_TRUE(copy_bytes(src->data(), Device::cuda, want.data(), Device::cpu, 100).ok());
  Transfer r2 = b->recv_into_device(0, make_tag(4, 0, Role::kActivation), small->data(), 100, Device::cuda);
  ASSERT_TRUE(a->send_device(1, make_tag(4, 0, Role::kActivation), src->data(), 100, Device::cuda).wait().ok());
  ASSERT_TRUE(r2.wait(std::chrono::seconds(30)).ok()) << r2.status().to_string();
  EXPECT_TRUE(to_host(*small, 100) == want);
}

INSTANTIATE_TEST_SUITE_P(Paths, DeviceDataPlane, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "ForcedStaging" : "UcxChoice");
                         });

}  // namespace
}  // namespace lh
