// Tests of UcxDataPlane inside one process (two or three planes, each with its own UCX worker): sizes from
// 0 bytes to 64 MiB, out-of-order posting, drop of packets from ranks outside the plan, bad addresses, metering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <thread>

#include "core/cuda_runtime.h"
#include "tests/transport/byte_pattern.h"
#include "tests/transport/plane_util.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using test::pattern;

std::unique_ptr<UcxDataPlane> make_plane() {
  UcxOptions o;
  o.tls = test::test_tls("tcp");
  return test::loopback_plane(o);
}

struct Pair {
  std::unique_ptr<UcxDataPlane> a = make_plane(), b = make_plane();
  Pair() {
    EXPECT_TRUE(a->connect(0, {{1, b->address()}}).ok());
    EXPECT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  }
};

TEST(Tag, PacksAndUnpacks) {
  Tag t = make_tag(123456, 4095, Role::kActivationGrad, 7);
  auto u = Tag::unpack(t.pack());
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->step, 123456u);
  EXPECT_EQ(u->microbatch, 4095);
  EXPECT_EQ(u->role, Role::kActivationGrad);
  EXPECT_EQ(u->shard, 7);
  EXPECT_LT(t.pack(), uint64_t(1) << Tag::kBits);
  EXPECT_FALSE(Tag::unpack(uint64_t(1) << 60).ok());
  EXPECT_FALSE(Tag::unpack(uint64_t(200) << 8).ok());  // role 200 does not exist
  EXPECT_NE(make_tag(1, 0, Role::kActivation).pack(), make_tag(1, 0, Role::kActivationGrad).pack());
}

TEST(WorkerAddress, RejectsCorruptEnvelopes) {
  auto p = make_plane();
  auto ok = unwrap_worker_address(p->address());
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  Bytes bad = p->address();
  bad.back() ^= 0x5a;
  EXPECT_EQ(unwrap_worker_address(bad).status().code(), StatusCode::kCorrupt);
  EXPECT_FALSE(unwrap_worker_address(Bytes{1, 2, 3}).ok());
  Bytes truncated(p->address().begin(), p->address().end() - 5);
  EXPECT_FALSE(unwrap_worker_address(truncated).ok());
  Bytes garbage = pattern(200, 9);
  EXPECT_FALSE(unwrap_worker_address(garbage).ok());
  // connect() refuses a bad address and names the rank.
  Status s = p->connect(0, {{1, bad}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.to_string();
  EXPECT_FALSE(p->connect(-1, {}).ok());
  EXPECT_FALSE(p->connect(0, {{5000, p->address()}}).ok());
}

TEST(UcxDataPlane, SizesFromZeroTo64MiBArriveIntact) {
  Pair pr;
  std::vector<size_t> sizes = {0, 1, 7, 64, 4096, 65536, 1 << 20, 8 << 20, 64 << 20};
  std::vector<Transfer> sends, recvs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    recvs.push_back(pr.b->recv(0, make_tag(uint32_t(i), 0, Role::kActivation)));
    sends.push_back(pr.a->send(1, make_tag(uint32_t(i), 0, Role::kActivation), pattern(sizes[i], uint32_t(i))));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(sends[i].wait(std::chrono::seconds(60)).ok()) << sends[i].status().to_string();
    ASSERT_TRUE(recvs[i].wait(std::chrono::seconds(60)).ok()) << recvs[i].status().to_string();
    Bytes got = recvs[i].take();
    ASSERT_EQ(got.size(), sizes[i]);
    EXPECT_TRUE(got == pattern(sizes[i], uint32_t(i))) << "size " << sizes[i];
  }
}

TEST(UcxDataPlane, OutOfOrderPostingAndBothDirections) {
  Pair pr;
  const int n = 40;
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::mt19937 rng(3);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Transfer> sends;
  // Half the sends go out before any receive is posted (unexpected path), half after.
  for (int k = 0; k < n / 2; ++k)
    sends.push_back(
        pr.a->send(1, make_tag(order[k], 1, Role::kWeightGrad, 2), pattern(1000 + order[k] * 997, order[k])));
  std::vector<Transfer> recvs(n);
  std::vector<int> recv_order = order;
  std::shuffle(recv_order.begin(), recv_order.end(), rng);
  for (int i : recv_order) recvs[i] = pr.b->recv(0, make_tag(i, 1, Role::kWeightGrad, 2));
  for (int k = n / 2; k < n; ++k)
    sends.push_back(
        pr.a->send(1, make_tag(order[k], 1, Role::kWeightGrad, 2), pattern(1000 + order[k] * 997, order[k])));
  // And the other way at the same time.
  Transfer back = pr.b->send(0, make_tag(0, 0, Role::kActivationGrad), pattern(300000, 77));
  auto got_back = pr.a->recv_blocking(1, make_tag(0, 0, Role::kActivationGrad), std::chrono::seconds(30));
  ASSERT_TRUE(got_back.ok()) << got_back.status().to_string();
  EXPECT_TRUE(*got_back == pattern(300000, 77));
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(recvs[i].wait(std::chrono::seconds(30)).ok());
    EXPECT_TRUE(recvs[i].take() == pattern(1000 + i * 997, i)) << "packet " << i;
  }
  for (auto& s : sends) EXPECT_TRUE(s.wait(std::chrono::seconds(30)).ok());
}

TEST(UcxDataPlane, RecvIntoCallerBuffers) {
  Pair pr;
  // Posted first: UCX writes straight into the buffer.
  Bytes direct(1 << 20, 0);
  Transfer r1 = pr.b->recv_into(0, make_tag(1, 0, Role::kActivation), direct.data(), direct.size());
  ASSERT_TRUE(pr.a->send_blocking(1, make_tag(1, 0, Role::kActivation), pattern(700000, 1)).ok());
  ASSERT_TRUE(r1.wait(std::chrono::seconds(30)).ok());
  EXPECT_EQ(r1.wire_bytes(), 700000u);
  EXPECT_TRUE(std::equal(direct.begin(), direct.begin() + 700000, pattern(700000, 1).begin()));
  EXPECT_TRUE(r1.take().empty());
  // Arrived first: copied out of the staging buffer.
  ASSERT_TRUE(pr.a->send_blocking(1, make_tag(2, 0, Role::kActivation), pattern(5000, 2)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Bytes late(5000);
  Transfer r2 = pr.b->recv_into(0, make_tag(2, 0, Role::kActivation), late.data(), late.size());
  ASSERT_TRUE(r2.wait(std::chrono::seconds(30)).ok());
  EXPECT_TRUE(late == pattern(5000, 2));
  // Too big, posted before and after arrival: OutOfRange, and the link keeps working.
  Bytes small(100);
  Transfer r3 = pr.b->recv_into(0, make_tag(3, 0, Role::kActivation), small.data(), small.size());
  ASSERT_TRUE(pr.a->send_blocking(1, make_tag(3, 0, Role::kActivation), pattern(101, 3)).ok());
  EXPECT_EQ(r3.wait(std::chrono::seconds(30)).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(pr.a->send_blocking(1, make_tag(4, 0, Role::kActivation), pattern(200, 4)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Transfer r4 = pr.b->recv_into(0, make_tag(4, 0, Role::kActivation), small.data(), small.size());
  EXPECT_EQ(r4.wait(std::chrono::seconds(30)).code(), StatusCode::kOutOfRange);
  auto ok = pr.b->recv_into(0, make_tag(5, 0, Role::kActivation), small.data(), small.size());
  ASSERT_TRUE(pr.a->send_blocking(1, make_tag(5, 0, Role::kActivation), pattern(100, 5)).ok());
  ASSERT_TRUE(ok.wait(std::chrono::seconds(30)).ok());
  EXPECT_TRUE(small == pattern(100, 5));
}

TEST(UcxDataPlane, SameTagPacketsMatchInSendOrder) {
  Pair pr;
  for (int i = 0; i < 5; ++i) pr.a->send(1, make_tag(9, 0, Role::kOther), Bytes(10, uint8_t(i)));
  for (int i = 0; i < 5; ++i) {
    auto got = pr.b->recv_blocking(0, make_tag(9, 0, Role::kOther), std::chrono::seconds(30));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->at(0), i);
  }
}

TEST(UcxDataPlane, PacketsFromRanksOutsideThePlanAreDropped) {
  auto a = make_plane(), b = make_plane(), stranger = make_plane();
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  // The stranger calls itself rank 2 and knows b's address, but b's plan has no rank 2.
  ASSERT_TRUE(stranger->connect(2, {{1, b->address()}}).ok());
  ASSERT_TRUE(
      stranger->send(1, make_tag(0, 0, Role::kActivation), pattern(5000, 1)).wait(std::chrono::seconds(30)).ok());
  // A rank-2 receive on b is refused outright, and the stranger's packet never matches a rank-0 receive.
  EXPECT_EQ(b->recv(2, make_tag(0, 0, Role::kActivation)).wait(std::chrono::seconds(5)).code(),
            StatusCode::kInvalidArgument);
  Transfer r = b->recv(0, make_tag(0, 0, Role::kActivation));
  for (int i = 0; i < 200 && b->dropped_packets() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(b->dropped_packets(), 1u);
  EXPECT_FALSE(r.done());
  ASSERT_TRUE(a->send(1, make_tag(0, 0, Role::kActivation), pattern(10, 2)).wait(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(r.wait(std::chrono::seconds(30)).ok());
  EXPECT_TRUE(r.take() == pattern(10, 2));
  // Sending to a rank outside the plan fails without touching the network.
  EXPECT_EQ(a->send(7, make_tag(0, 0, Role::kOther), Bytes(3)).wait(std::chrono::seconds(5)).code(),
            StatusCode::kInvalidArgument);
}

TEST(UcxDataPlane, FailedPeerFailsPendingAndNewTransfers) {
  Pair pr;
  Transfer r = pr.b->recv(0, make_tag(1, 0, Role::kActivation));
  pr.b->fail_peer(0, "declared dead by the coordinator");
  Status s = r.wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("declared dead"), std::string::npos);
  EXPECT_EQ(pr.b->send(0, make_tag(1, 0, Role::kActivation), Bytes(4)).wait(std::chrono::seconds(10)).code(),
            StatusCode::kUnavailable);
}

TEST(UcxDataPlane, MeterCountsRawWireAndBusyTime) {
  Pair pr;
  auto ma = std::make_shared<LinkMeter>(0), mb = std::make_shared<LinkMeter>(1);
  pr.a->set_meter(ma);
  pr.b->set_meter(mb);
  for (int i = 0; i < 4; ++i) {
    Transfer r = pr.b->recv(0, make_tag(i, 0, Role::kActivation), 4000000);
    ASSERT_TRUE(pr.a->send(1, make_tag(i, 0, Role::kActivation), pattern(1000000, i), 4000000).wait().ok());
    ASSERT_TRUE(r.wait(std::chrono::seconds(30)).ok());
  }
  ASSERT_TRUE(pr.a->send_blocking(1, make_tag(0, 0, Role::kWeightGrad), Bytes(100)).ok());
  LinkStats s = ma->stats(1, Role::kActivation, Direction::kSend);
  EXPECT_EQ(s.messages, 4u);
  EXPECT_EQ(s.raw_bytes, 16000000u);
  EXPECT_EQ(s.wire_bytes, 4000000u);
  EXPECT_GT(s.busy_seconds, 0.0);
  LinkStats g = ma->stats(1, Role::kWeightGrad, Direction::kSend);
  EXPECT_EQ(g.raw_bytes, 100u);  // raw 0 means "same as wire"
  LinkStats r = mb->stats(0, Role::kActivation, Direction::kRecv);
  EXPECT_EQ(r.messages, 4u);
  EXPECT_EQ(r.wire_bytes, 4000000u);
  EXPECT_EQ(r.raw_bytes, 16000000u);
  EXPECT_GT(ma->bandwidth_bps(1, Direction::kSend), 0.0);
  auto j = ma->to_json();
  EXPECT_EQ(j["rank"], 0);
  EXPECT_EQ(j["links"].size(), 2u);
}

// The device-memory API where no CUDA device can be used (a CPU-only build, or no GPU): an immediate
// Unavailable that says why, never a crash; Device::cpu takes the host path.
// A worker keeps one plane for its life: reset() ends a plan (what was pending fails with the reason, queued packets
// go) and the same UCX worker, at the same address, serves the next plan, whose epoch keeps the last plan's packets
// out (also without authentication) and whose ranks and keys may differ.
TEST(UcxDataPlane, ResetEndsThePlanAndTheSameWorkerServesTheNext) {
  using namespace std::chrono_literals;
  Pair pr;
  ASSERT_TRUE(pr.a->send(1, make_tag(1, 0, Role::kOther), pattern(100, 1)).wait(30s).ok());
  ASSERT_TRUE(pr.b->recv_blocking(0, make_tag(1, 0, Role::kOther), 30s).ok());
  const Bytes address = pr.b->address();
  const auto key = pr.b->data_public_key();
  Transfer waiting = pr.b->recv(0, make_tag(2, 0, Role::kOther));
  ASSERT_TRUE(pr.a->send(1, make_tag(3, 0, Role::kOther), pattern(5000, 3)).wait(30s).ok());
  for (int i = 0; i < 500 && pr.b->unexpected_packets() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(pr.b->unexpected_packets(), 1u);

  pr.b->reset("the test re-plans");
  ASSERT_TRUE(waiting.done()) << "a pending receive ends with the plan";
  EXPECT_FALSE(waiting.status().ok());
  EXPECT_NE(waiting.status().message().find("the test re-plans"), std::string::npos) << waiting.status().to_string();
  EXPECT_EQ(pr.b->unexpected_packets(), 0u);
  EXPECT_EQ(pr.b->unexpected_bytes(), 0u);
  EXPECT_EQ(pr.b->rank(), -1);
  EXPECT_TRUE(pr.b->peers().empty());
  EXPECT_EQ(pr.b->resets(), 1u);
  EXPECT_TRUE(pr.b->address() == address) << "the UCX worker, and so its address, stays";
  EXPECT_NE(pr.b->data_public_key(), key) << "a new plan gets a new key pair";
  EXPECT_EQ(pr.b->send(0, make_tag(1, 0, Role::kOther), Bytes(3)).wait(10s).code(), StatusCode::kInvalidArgument);

  // b is in plan epoch 1. a, not yet told, still sends under epoch 0 (UCX drops what comes on the endpoint b closed),
  // and so does a plane that connects afresh calling itself rank 0 of epoch 0: its packet arrives and is dropped, not
  // taken as the new plan's packet with the same tag.
  DataPlaneSecurity epoch1;
  epoch1.epoch = 1;
  ASSERT_TRUE(pr.b->connect(1, {{0, pr.a->address()}}, epoch1).ok());
  Transfer next = pr.b->recv(0, make_tag(3, 0, Role::kOther));
  (void)pr.a->send(1, make_tag(3, 0, Role::kOther), pattern(64, 4)).wait(30s);
  auto late = make_plane();
  ASSERT_TRUE(late->connect(0, {{1, pr.b->address()}}).ok());
  const uint64_t dropped = pr.b->dropped_packets();
  ASSERT_TRUE(late->send(1, make_tag(3, 0, Role::kOther), pattern(64, 4)).wait(30s).ok());
  for (int i = 0; i < 500 && pr.b->dropped_packets() == dropped; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(pr.b->dropped_packets(), dropped + 1) << "a packet of the last plan's epoch";
  EXPECT_FALSE(next.done());
  pr.a->reset("the test re-plans");
  ASSERT_TRUE(pr.a->connect(0, {{1, pr.b->address()}}, epoch1).ok());
  ASSERT_TRUE(pr.a->send(1, make_tag(3, 0, Role::kOther), pattern(64, 5)).wait(30s).ok());
  ASSERT_TRUE(next.wait(30s).ok()) << next.status().to_string();
  EXPECT_TRUE(next.take() == pattern(64, 5));

  // The next plan swaps the ranks and authenticates its packets: both directions, eager and rendezvous.
  pr.a->reset("the test re-plans");
  pr.b->reset("the test re-plans");
  auto sec = [](uint32_t epoch, int peer, const std::array<uint8_t, DataKeyPair::kBytes>& k) {
    DataPlaneSecurity s;
    s.protection = PacketProtection::kMac;
    s.epoch = epoch;
    s.peers[peer] = {k, local_ciphers()};
    return s;
  };
  ASSERT_TRUE(pr.a->connect(1, {{0, pr.b->address()}}, sec(2, 0, pr.b->data_public_key())).ok());
  ASSERT_TRUE(pr.b->connect(0, {{1, pr.a->address()}}, sec(2, 1, pr.a->data_public_key())).ok());
  for (size_t n : {size_t(0), size_t(4000), size_t(3) << 20}) {
    const Bytes data = pattern(n, uint32_t(n));
    Transfer r = pr.a->recv(0, make_tag(1, 1, Role::kActivation));
    ASSERT_TRUE(pr.b->send(1, make_tag(1, 1, Role::kActivation), data).wait(30s).ok());
    ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
    EXPECT_TRUE(r.take() == data) << n;
    Transfer back = pr.b->recv(1, make_tag(1, 2, Role::kActivationGrad));
    ASSERT_TRUE(pr.a->send(0, make_tag(1, 2, Role::kActivationGrad), data).wait(30s).ok());
    ASSERT_TRUE(back.wait(30s).ok()) << back.status().to_string();
    EXPECT_TRUE(back.take() == data) << n;
  }
  EXPECT_EQ(pr.a->auth_failures() + pr.b->auth_failures(), 0u);
  EXPECT_EQ(pr.a->resets(), 2u);
  EXPECT_EQ(pr.b->resets(), 2u);
}

// When reset() returns, UCX writes no more into a caller's buffer and reads no more from it: a 64 MiB receive posted
// into the caller's memory, and a send of the caller's memory, both cut by a reset mid-packet, are done by then.
TEST(UcxDataPlane, ResetLetsGoOfCallersBuffersBeforeItReturns) {
  using namespace std::chrono_literals;
  for (int round = 0; round < 3; ++round) {
    Pair pr;
    const Bytes data = pattern(size_t(64) << 20, 9);
    std::vector<uint8_t> into(data.size());
    Transfer r = pr.b->recv_into(0, make_tag(1, 0, Role::kActivation), into.data(), into.size());
    Transfer s = pr.a->send_view(1, make_tag(1, 0, Role::kActivation), data.data(), data.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * round));
    pr.b->reset("cut mid-packet");
    EXPECT_TRUE(r.done()) << "round " << round;
    pr.a->reset("cut mid-packet");
    EXPECT_TRUE(s.done()) << "round " << round;
    // Either the packet was whole before the cut or the receive failed; nothing is left half-claimed.
    if (r.status().ok()) EXPECT_TRUE(std::equal(data.begin(), data.end(), into.begin()));
  }
}

TEST(UcxDataPlane, DeviceMemoryWithoutCudaIsUnavailable) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: test_data_plane_gpu covers device memory";
  Pair pr;
  uint8_t fake[64] = {};
  Tag tag = make_tag(5, 0, Role::kActivation);
#if defined(LH_USE_CUDA)
  const char* why = "no CUDA device";
#else
  const char* why = "CPU-only build";
#endif
  Transfer s = pr.a->send_device(1, tag, fake, sizeof(fake), Device::cuda);
  ASSERT_TRUE(s.done());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().to_string();
  EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status().to_string();
  EXPECT_NE(s.status().message().find("rank 1"), std::string::npos) << s.status().to_string();
  Transfer r = pr.b->recv_into_device(0, tag, fake, sizeof(fake), Device::cuda);
  ASSERT_TRUE(r.done());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().to_string();
  EXPECT_FALSE(pr.a->device_memory_direct(Device::cuda));
  EXPECT_TRUE(pr.a->device_memory_direct(Device::cpu));
  EXPECT_EQ(pr.a->staging_bytes(), 0u);

  // Nothing was sent: the host path still works, also through the device API with Device::cpu.
  Bytes want = pattern(5000, 11), got(5000);
  Transfer r2 = pr.b->recv_into_device(0, tag, got.data(), got.size(), Device::cpu);
  Transfer s2 = pr.a->send_device(1, tag, want.data(), want.size(), Device::cpu);
  ASSERT_TRUE(s2.wait(std::chrono::seconds(30)).ok()) << s2.status().to_string();
  ASSERT_TRUE(r2.wait(std::chrono::seconds(30)).ok()) << r2.status().to_string();
  EXPECT_EQ(r2.wire_bytes(), want.size());
  EXPECT_TRUE(got == want);
}

// TransferState::finish runs once before a successful completion is visible, and its error becomes the status.
TEST(Transfer, FinishStepRunsBeforeWaitersAndCanFail) {
  auto st = std::make_shared<TransferState>();
  int runs = 0;
  st->finish = [&](TransferState&) {
    ++runs;
    return unavailable("copy failed");
  };
  bool hook_saw_error = false;
  st->on_done([&](TransferState& t) { hook_saw_error = !t.status.ok(); });
  st->complete(Status::Ok());
  st->complete(Status::Ok());
  Transfer t(st);
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(hook_saw_error);
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(st->finish);

  auto failed = std::make_shared<TransferState>();
  failed->finish = [&](TransferState&) {
    ++runs;
    return Status::Ok();
  };
  failed->complete(invalid_argument("no"));
  EXPECT_EQ(runs, 1);  // not run for a failed transfer
  EXPECT_EQ(Transfer(failed).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lh
