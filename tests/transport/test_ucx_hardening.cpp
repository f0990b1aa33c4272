// Tests of UcxDataPlane's defences (issue 12): dropped packets cost no allocation, the unexpected-packet
// queue is bounded per peer and purged when a peer fails, and a failed receive never completes while UCX
// may still write into its buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>

#include "tests/transport/byte_pattern.h"
#include "tests/transport/plane_util.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using test::pattern;

// Sets an environment variable for UCX while a plane is created (ucp_config_read reads it then).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Receives are posted on the plane's thread in the order they are made: once a 0-byte packet matched to a
// receive made after others has arrived, those others are posted (a packet sent now cannot find them missing).
void wait_until_posted(UcxDataPlane& from, int to_rank, UcxDataPlane& to, int from_rank) {
  Tag sync = make_tag(999, 4095, Role::kOther);
  Transfer r = to.recv(from_rank, sync);
  ASSERT_TRUE(from.send(to_rank, sync, Bytes()).wait(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(r.wait(std::chrono::seconds(30)).ok()) << r.status().to_string();
}

std::unique_ptr<UcxDataPlane> make_plane(UcxOptions o = {}) {
  if (o.tls.empty()) o.tls = test::test_tls("tcp");
  return test::loopback_plane(o);
}

// A recv_into failed while its packet is still arriving: the Transfer reports done only once UCX has let go
// of the caller's buffer. Over shared memory, a rendezvous packet's fragments keep landing in the caller's buffer
// after the receiver gave up on its endpoint, so a receive completed at fail_peer would see its buffer change after
// done. (An eager packet is assembled by UCX and copied in at once: it never lands there piece by piece.)
// Plane b receives a 128 MiB rendezvous packet from plane a straight into `buf` (shared memory); returns once UCX has
// started writing into it. mid_packet: its last byte was not written yet then.
struct MidPacket {
  ScopedEnv rendezvous{"UCX_RNDV_THRESH", "8k"};
  std::unique_ptr<UcxDataPlane> a, b;
  static constexpr size_t n = size_t(128) << 20;
  Bytes packet, buf = Bytes(n, 0xCD);
  Transfer r, s;
  bool mid_packet = false;
  MidPacket(uint8_t seed, std::chrono::milliseconds close_timeout) : packet(pattern(n, seed)) {
    UcxOptions o;
    o.tls = "posix";
    o.peer_error_handling = false;
    if (close_timeout.count() > 0) o.close_timeout = close_timeout;
    a = make_plane(o);
    b = make_plane(o);
    EXPECT_TRUE(a->connect(0, {{1, b->address()}}).ok());
    EXPECT_TRUE(b->connect(1, {{0, a->address()}}).ok());
    r = b->recv_into(0, make_tag(1, 0, Role::kActivation), buf.data(), buf.size());
    wait_until_posted(*a, 1, *b, 0);  // so UCX receives straight into `buf`
    s = a->send_view(1, make_tag(1, 0, Role::kActivation), packet.data(), packet.size());
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (*reinterpret_cast<volatile uint8_t*>(&buf[0]) == 0xCD && Clock::now() < deadline) std::this_thread::yield();
    mid_packet = *reinterpret_cast<volatile uint8_t*>(&buf[n - 1]) == 0xCD;
  }
};

TEST(UcxHardening, FailedRecvIntoIsNotDoneWhileUcxStillWrites) {
  MidPacket m(7, std::chrono::milliseconds(0));
  auto [b, buf, r, s, mid_packet] = std::tie(m.b, m.buf, m.r, m.s, m.mid_packet);
  // UCX has started writing into the caller's buffer: fail the peer mid-packet.
  b->fail_peer(0, "declared dead mid-packet");
  Status st = r.wait(std::chrono::seconds(60));
  ASSERT_TRUE(r.done());
  // A rendezvous packet over shared memory may finish before fail_peer reaches the plane's thread: then it is whole.
  if (st.ok())
    EXPECT_TRUE(buf == m.packet) << "a receive reported done before its packet was whole";
  else
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  Bytes at_done = buf;  // what the caller sees when the Transfer says done
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(buf == at_done) << "UCX wrote into the caller's buffer after the failed receive reported done";
  EXPECT_TRUE(mid_packet) << "the packet finished before fail_peer; the check above proved nothing";
  EXPECT_TRUE(s.wait(std::chrono::seconds(60)).ok() || s.done());
}

// A recv_into UCX is still writing into when the plane closes completes with the close (after the worker,
// and with it every way to write into the buffer, is gone), rather than staying pending for ever.
TEST(UcxHardening, ReceiveInFlightAtCloseCompletes) {
  MidPacket m(8, std::chrono::milliseconds(200));
  auto [a, b, packet, buf, r, s, mid_packet] = std::tie(m.a, m.b, m.packet, m.buf, m.r, m.s, m.mid_packet);
  b.reset();
  EXPECT_TRUE(mid_packet) << "the packet finished before the close; the check below proved little";
  ASSERT_TRUE(r.done());
  // The close lets a receive in flight finish for a moment; either it did, or it failed with the close.
  if (r.status().ok())
    EXPECT_TRUE(buf == packet);
  else
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  a.reset();  // its send to the vanished b fails on close, and only then: UCX read `packet` until then
  EXPECT_TRUE(s.done());
}

// Polls `cond` for up to 10 s.
template <class F>
bool eventually(F cond) {
  return test::eventually(cond, std::chrono::seconds(10));
}

bool contains(const Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

// Three planes a (rank 0), b (rank 1, with `b_options`) and c (rank 2), all connected.
struct Trio {
  std::unique_ptr<UcxDataPlane> a, b, c;
  explicit Trio(UcxOptions b_options = {}) : a(make_plane()), b(make_plane(b_options)), c(make_plane()) {
    EXPECT_TRUE(a->connect(0, {{1, b->address()}, {2, c->address()}}).ok());
    EXPECT_TRUE(b->connect(1, {{0, a->address()}, {2, c->address()}}).ok());
    EXPECT_TRUE(c->connect(2, {{0, a->address()}, {1, b->address()}}).ok());
  }
};

// b takes one packet from `from` (sent now) intact.
void expect_link_works(UcxDataPlane& from, int from_rank, UcxDataPlane& to, int to_rank, uint32_t step) {
  Tag tag = make_tag(step, 3, Role::kOther);
  Transfer r = to.recv(from_rank, tag);
  ASSERT_TRUE(from.send(to_rank, tag, pattern(3000, step)).wait(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(r.wait(std::chrono::seconds(30)).ok()) << r.status().to_string();
  EXPECT_TRUE(r.take() == pattern(3000, step));
}

// A packet from a rank outside the plan is thrown away without a buffer of its claimed size, eager or
// rendezvous, and the stranger's send still completes (UCX consumed it).
TEST(UcxHardening, StrangersPacketsAreDroppedWithoutABuffer) {
  auto a = make_plane(), b = make_plane(), stranger = make_plane();
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  ASSERT_TRUE(stranger->connect(2, {{1, b->address()}}).ok());
  std::vector<size_t> sizes = {0, 5000, 200000, size_t(64) << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    Status s =
        stranger->send(1, make_tag(i, 0, Role::kActivation), pattern(sizes[i], i)).wait(std::chrono::seconds(30));
    // A rendezvous packet is refused unfetched (its sender's send fails); an eager one is just forgotten.
    EXPECT_TRUE(s.ok() || contains(s, "rejected")) << "size " << sizes[i] << ": " << s.to_string();
    EXPECT_TRUE(eventually([&] { return b->dropped_packets() == i + 1; })) << "size " << sizes[i];
  }
  EXPECT_EQ(b->packet_buffer_bytes_peak(), 0u);
  EXPECT_EQ(b->unexpected_bytes(), 0u);
  EXPECT_EQ(b->unexpected_packets(), 0u);
  expect_link_works(*a, 0, *b, 1, 100);
  EXPECT_EQ(b->packet_buffer_bytes_peak(), 3000u);  // the one packet b did take (it arrived before its recv or not)
}

// Issue 37, item 1 and 2: a process without the pair's keys that reaches a worker's data plane claims a member's rank.
// Its packets' headers do not verify, so nothing of them is received or held — a rendezvous packet is never fetched
// (its sender's send is rejected), an eager one is forgotten — and the claimed rank is not failed: the member's own
// link goes on. A header announcing more bytes than follow (a 512 MiB claim whose data never comes) is refused the
// same way. Each is counted as an authentication failure.
TEST(UcxHardening, AKeylessClientClaimingAMembersRankHoldsNothingAndFailsNobody) {
  auto a = make_plane(), b = make_plane(), stranger = make_plane();
  auto sec = [](int peer, const std::array<uint8_t, 32>& key) {
    DataPlaneSecurity s;
    s.protection = PacketProtection::kMac;
    s.epoch = 4;
    s.peers[peer] = {key, local_ciphers()};
    return s;
  };
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}, sec(1, b->data_public_key())).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}, sec(0, a->data_public_key())).ok());
  ASSERT_TRUE(stranger->connect(0, {{1, b->address()}}).ok());  // no keys: it can only guess a MAC
  const Tag t = make_tag(3, 0, Role::kActivation);
  Transfer waiting = b->recv(0, t);  // a member's receive the stranger's packets would match
  uint64_t refused = 0;
  auto try_header = [&](const char* what, uint64_t claimed, size_t sent) {
    WireHeader h;
    h.packet.epoch = 4;
    h.packet.sender = 0;
    h.packet.receiver = 1;
    h.packet.tag_bits = t.pack();
    h.packet.seq = 1 + refused;
    h.length = claimed;
    std::array<uint8_t, kWireHeaderBytes> bytes{};
    write_wire_header(h, nullptr, bytes.data());
    for (int i = 48; i < 64; ++i) bytes[i] = uint8_t(i * 7);  // a guessed MAC
    Status s = stranger->send_raw_for_tests(1, bytes, pattern(sent, uint32_t(sent))).wait(std::chrono::seconds(30));
    EXPECT_TRUE(s.ok() || contains(s, "rejected")) << what << ": " << s.to_string();
    ++refused;
    EXPECT_TRUE(eventually([&] { return b->auth_failures() == refused; })) << what << ": " << b->auth_failures();
  };
  try_header("an empty packet", 0, 0);
  try_header("an eager packet", 5000, 5000);
  try_header("a 64 MiB rendezvous packet", size_t(64) << 20, size_t(64) << 20);
  try_header("a 512 MiB claim with 100 bytes behind it", uint64_t(512) << 20, 100);
  EXPECT_EQ(b->dropped_packets(), refused);
  EXPECT_EQ(b->packet_buffer_bytes_peak(), 0u);
  EXPECT_EQ(b->unexpected_bytes(), 0u);
  EXPECT_FALSE(waiting.done()) << waiting.status().to_string();
  // Rank 0's real packet then completes the receive: the claimed rank was never failed.
  ASSERT_TRUE(a->send(1, t, pattern(3000, 3)).wait(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(waiting.wait(std::chrono::seconds(30)).ok()) << waiting.status().to_string();
  EXPECT_TRUE(waiting.take() == pattern(3000, 3));
  expect_link_works(*a, 0, *b, 1, 100);
  EXPECT_EQ(b->auth_failures(), refused);
}

// After fail_peer, that peer's packets are dropped on arrival without a buffer. Shared memory: the packet
// still reaches b although b has closed its endpoint.
TEST(UcxHardening, FailedPeersPacketsAreDroppedWithoutABuffer) {
  UcxOptions o;
  o.tls = "posix";
  o.peer_error_handling = false;
  auto a = make_plane(o), b = make_plane(o);
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  b->fail_peer(0, "declared dead");
  Status refused = b->recv(0, make_tag(0, 0, Role::kActivation)).wait(std::chrono::seconds(10));
  ASSERT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
  Transfer s1 = a->send(1, make_tag(1, 0, Role::kActivation), pattern(20000, 1));
  Transfer s2 = a->send(1, make_tag(2, 0, Role::kActivation), pattern(size_t(32) << 20, 2));
  EXPECT_TRUE(eventually([&] { return b->dropped_packets() == 2; })) << b->dropped_packets();
  EXPECT_EQ(b->packet_buffer_bytes_peak(), 0u);
  EXPECT_EQ(b->unexpected_bytes(), 0u);
}

// A peer that sends more packets ahead of their receives than the bound is failed, with a reason naming
// the bound; b holds no more than the bound meanwhile and keeps working with its other peers.
TEST(UcxHardening, UnexpectedPacketFloodFailsOnlyThatPeer) {
  UcxOptions bo;
  bo.max_unexpected_packets = 8;
  Trio t(bo);
  Transfer from_c = t.c->send(1, make_tag(7, 0, Role::kActivation), pattern(1000, 77));
  ASSERT_TRUE(eventually([&] { return t.b->unexpected_packets() == 1; }));
  std::vector<Transfer> flood;
  for (int i = 0; i < 40; ++i) flood.push_back(t.a->send(1, make_tag(i, 0, Role::kActivation), pattern(1000, i)));
  ASSERT_TRUE(eventually([&] { return t.b->dropped_packets() >= 1; }));
  EXPECT_EQ(t.b->packet_buffer_bytes_peak(), 9000u);  // c's packet and the 8 of a's that fit the bound
  // a's 8 queued packets were purged with a; c's is still there.
  EXPECT_TRUE(eventually([&] { return t.b->unexpected_packets() == 1; })) << t.b->unexpected_packets();
  EXPECT_EQ(t.b->unexpected_bytes(), 1000u);
  Status s = t.b->recv(0, make_tag(0, 0, Role::kActivation)).wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_TRUE(contains(s, "rank 0") && contains(s, "more than 8 packets") && contains(s, "max_unexpected_packets"))
      << s.to_string();
  Transfer r = t.b->recv(2, make_tag(7, 0, Role::kActivation));
  ASSERT_TRUE(r.wait(std::chrono::seconds(10)).ok()) << r.status().to_string();
  EXPECT_TRUE(r.take() == pattern(1000, 77));
  EXPECT_EQ(t.b->unexpected_packets(), 0u);
  expect_link_works(*t.c, 2, *t.b, 1, 101);
  expect_link_works(*t.b, 1, *t.c, 2, 102);
}

TEST(UcxHardening, UnexpectedBytesOverTheBoundFailThatPeer) {
  UcxOptions bo;
  bo.max_unexpected_bytes = 1 << 20;
  Trio t(bo);
  for (int i = 0; i < 3; ++i) t.a->send(1, make_tag(i, 0, Role::kWeightGrad), pattern(400000, i));
  ASSERT_TRUE(eventually([&] { return t.b->dropped_packets() >= 1; }));
  EXPECT_EQ(t.b->packet_buffer_bytes_peak(), 800000u);  // the third was never given a buffer
  EXPECT_TRUE(eventually([&] { return t.b->unexpected_bytes() == 0; })) << t.b->unexpected_bytes();
  Status s = t.b->recv(0, make_tag(0, 0, Role::kWeightGrad)).wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_TRUE(contains(s, "1200000 bytes") && contains(s, "bound of 1048576 bytes per peer")) << s.to_string();
  expect_link_works(*t.c, 2, *t.b, 1, 103);
}

// A packet over max_packet_bytes: a recv() it matches fails with OutOfRange, unbuffered; one that arrives
// before its receive fails its sender.
TEST(UcxHardening, PacketsOverTheSizeBoundGetNoBuffer) {
  UcxOptions bo;
  bo.max_packet_bytes = 1 << 20;
  Trio t(bo);
  Transfer r = t.b->recv(0, make_tag(1, 0, Role::kActivation));
  wait_until_posted(*t.a, 1, *t.b, 0);
  ASSERT_TRUE(t.a->send(1, make_tag(1, 0, Role::kActivation), pattern(2 << 20, 1)).wait(std::chrono::seconds(30)).ok());
  Status s = r.wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
  EXPECT_TRUE(contains(s, "2097152 bytes") && contains(s, "1048576")) << s.to_string();
  // recv_into receives into the caller's buffer whatever the bound says.
  Bytes big(2 << 20);
  Transfer r2 = t.b->recv_into(0, make_tag(2, 0, Role::kActivation), big.data(), big.size());
  wait_until_posted(*t.a, 1, *t.b, 0);
  ASSERT_TRUE(t.a->send(1, make_tag(2, 0, Role::kActivation), pattern(2 << 20, 2)).wait(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(r2.wait(std::chrono::seconds(10)).ok()) << r2.status().to_string();
  EXPECT_TRUE(big == pattern(2 << 20, 2));
  EXPECT_EQ(t.b->packet_buffer_bytes_peak(), 0u);
  expect_link_works(*t.a, 0, *t.b, 1, 104);
  t.a->send(1, make_tag(3, 0, Role::kActivation), pattern(2 << 20, 3));
  ASSERT_TRUE(eventually([&] { return t.b->dropped_packets() == 2; })) << t.b->dropped_packets();
  Status s3 = t.b->recv(0, make_tag(3, 0, Role::kActivation)).wait(std::chrono::seconds(10));
  EXPECT_EQ(s3.code(), StatusCode::kUnavailable) << s3.to_string();
  EXPECT_TRUE(contains(s3, "bound of 1048576 bytes per packet")) << s3.to_string();
  EXPECT_EQ(t.b->packet_buffer_bytes_peak(), 3000u);
  expect_link_works(*t.c, 2, *t.b, 1, 105);
}

// fail_peer drops that peer's packets waiting for receives (and frees them); others' stay.
TEST(UcxHardening, FailPeerPurgesItsUnexpectedPackets) {
  Trio t;
  for (int i = 0; i < 3; ++i) t.a->send(1, make_tag(i, 0, Role::kActivation), pattern(10000, i));
  t.c->send(1, make_tag(0, 0, Role::kActivation), pattern(500, 9));
  ASSERT_TRUE(eventually([&] { return t.b->unexpected_packets() == 4; })) << t.b->unexpected_packets();
  EXPECT_EQ(t.b->unexpected_bytes(), 30500u);
  t.b->fail_peer(0, "declared dead");
  EXPECT_TRUE(eventually([&] { return t.b->unexpected_bytes() == 500; })) << t.b->unexpected_bytes();
  EXPECT_EQ(t.b->unexpected_packets(), 1u);
  EXPECT_EQ(t.b->recv(0, make_tag(0, 0, Role::kActivation)).wait(std::chrono::seconds(10)).code(),
            StatusCode::kUnavailable);
  auto got = t.b->recv_blocking(2, make_tag(0, 0, Role::kActivation), std::chrono::seconds(10));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(*got == pattern(500, 9));
  EXPECT_EQ(t.b->unexpected_bytes(), 0u);
}

// A packet larger than its recv_into buffer is consumed into nothing: the caller's memory is untouched
// (beyond `capacity` too), no buffer of its size is allocated, and the link keeps working.
TEST(UcxHardening, TooBigForRecvIntoIsConsumedWithoutABuffer) {
  auto a = make_plane(), b = make_plane();
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  std::vector<size_t> sizes = {101, 50000, size_t(16) << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    Bytes buf(4096, 0xCD);
    Transfer r = b->recv_into(0, make_tag(i, 0, Role::kActivation), buf.data(), 100);
    wait_until_posted(*a, 1, *b, 0);  // the packet finds its receive posted, not the unexpected path
    ASSERT_TRUE(
        a->send(1, make_tag(i, 0, Role::kActivation), pattern(sizes[i], i)).wait(std::chrono::seconds(30)).ok());
    EXPECT_EQ(r.wait(std::chrono::seconds(30)).code(), StatusCode::kOutOfRange) << sizes[i];
    EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint8_t v) { return v == 0xCD; })) << sizes[i];
  }
  EXPECT_EQ(b->packet_buffer_bytes_peak(), 0u);
  EXPECT_EQ(b->dropped_packets(), sizes.size());
  expect_link_works(*a, 0, *b, 1, 106);
}

}  // namespace
}  // namespace lh
