// Tests of the authenticated data plane: sealing and opening packets (every authenticated field), the replay window,
// and UcxDataPlane with packets forged, altered, replayed, from another epoch or claiming another sender's rank:
// each dropped and counted, the receive they matched still waiting for the real packet. With root, a capture on the
// loopback shows a known pattern in clear without --encrypt-data and not with it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "tests/transport/byte_pattern.h"
#include "tests/transport/plane_util.h"
#include "transport/packet_auth.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using test::pattern;
using namespace std::chrono_literals;

// Two parties' keys, derived as two planes would.
struct KeyPairOfPeers {
  DataKeyPair k0 = DataKeyPair::generate(), k1 = DataKeyPair::generate();
  PacketKeys from0 = PacketKeys::derive(0, k0, 1, k1.public_key, local_ciphers()).value();
  PacketKeys from1 = PacketKeys::derive(1, k1, 0, k0.public_key, local_ciphers()).value();
};

Bytes sealed(PacketProtection p, const PacketKeys& keys, const PacketHeader& h, const Bytes& payload) {
  Bytes b = payload;
  b.resize(payload.size() + kPacketTrailerBytes);
  seal_packet(p, keys, h, b.data(), payload.size());
  return b;
}

PacketHeader header(uint64_t seq, uint32_t epoch = 3, int sender = 0, int receiver = 1, uint64_t tag = 77) {
  PacketHeader h;
  h.epoch = epoch;
  h.sender = sender;
  h.receiver = receiver;
  h.tag_bits = tag;
  h.seq = seq;
  return h;
}

TEST(PacketAuth, PairKeysMatchAcrossTheTwoEnds) {
  KeyPairOfPeers k;
  EXPECT_EQ(k.from0.tx, k.from1.rx);
  EXPECT_EQ(k.from0.rx, k.from1.tx);
  EXPECT_NE(k.from0.tx, k.from0.rx);
  std::array<uint8_t, 32> zero{};  // a low-order point: libsodium refuses it
  EXPECT_EQ(PacketKeys::derive(0, k.k0, 1, zero, 0).status().code(), StatusCode::kCorrupt);
  EXPECT_FALSE(PacketKeys::derive(2, k.k0, 2, k.k1.public_key, 0).ok());
}

// A packet's wire header: every field reads back; its MAC verifies at the other end of the pair only, and not once any
// byte changed; a malformed header is named.
TEST(PacketAuth, WireHeadersCarryEveryFieldUnderThePairsMac) {
  KeyPairOfPeers k, other;
  WireHeader h;
  h.packet = header(41, 6, 0, 1, 0x123456789ull);
  h.length = uint64_t(5) << 30;
  uint8_t bytes[kWireHeaderBytes];
  write_wire_header(h, &k.from0, bytes);
  auto back = read_wire_header(bytes, sizeof(bytes));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->packet.epoch, 6u);
  EXPECT_EQ(back->packet.sender, 0);
  EXPECT_EQ(back->packet.receiver, 1);
  EXPECT_EQ(back->packet.tag_bits, 0x123456789ull);
  EXPECT_EQ(back->packet.seq, 41u);
  EXPECT_EQ(back->length, uint64_t(5) << 30);
  EXPECT_EQ(back->flags, 0);
  EXPECT_TRUE(wire_header_authentic(k.from1, bytes));
  EXPECT_FALSE(wire_header_authentic(k.from0, bytes)) << "the sender's own receiving key";
  EXPECT_FALSE(wire_header_authentic(other.from1, bytes)) << "another pair's key";
  for (size_t i = 0; i < kWireHeaderBytes; ++i) {
    uint8_t changed[kWireHeaderBytes];
    std::memcpy(changed, bytes, sizeof(changed));
    changed[i] ^= 0x10;
    EXPECT_FALSE(wire_header_authentic(k.from1, changed)) << "byte " << i;
  }
  auto error = [&](const uint8_t* b, size_t n) { return read_wire_header(b, n).status().message(); };
  EXPECT_NE(error(bytes, 63).find("63 bytes, not 64"), std::string::npos);
  EXPECT_NE(error(nullptr, 0).find("0 bytes"), std::string::npos);
  uint8_t bad[kWireHeaderBytes];
  std::memcpy(bad, bytes, sizeof(bad));
  bad[0] = 'X';
  EXPECT_NE(error(bad, sizeof(bad)).find("magic"), std::string::npos);
  std::memcpy(bad, bytes, sizeof(bad));
  bad[4] = 9;
  EXPECT_NE(error(bad, sizeof(bad)).find("version 9"), std::string::npos);
  std::memcpy(bad, bytes, sizeof(bad));
  bad[5] = 0x80;
  EXPECT_NE(error(bad, sizeof(bad)).find("unknown flags"), std::string::npos);
  h.flags = kWireHello;  // a hello carries nothing
  write_wire_header(h, &k.from0, bad);
  EXPECT_NE(error(bad, sizeof(bad)).find("hello header announcing"), std::string::npos);
}

TEST(PacketAuth, EveryAuthenticatedFieldIsChecked) {
  KeyPairOfPeers k;
  for (PacketProtection p : {PacketProtection::kMac, PacketProtection::kAead}) {
    SCOPED_TRACE(packet_protection_name(p));
    const Bytes payload = pattern(1000, 5);
    const Bytes good = sealed(p, k.from0, header(9), payload);
    ASSERT_EQ(good.size(), payload.size() + kPacketTrailerBytes);
    {
      Bytes b = good;
      ASSERT_TRUE(open_packet(p, k.from1, header(0), b.data(), b.size()).ok());
      EXPECT_TRUE(std::equal(payload.begin(), payload.end(), b.begin()));
      auto t = read_trailer(good.data(), good.size());
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(t->seq, 9u);
      EXPECT_EQ(t->epoch, 3u);
    }
    // MAC only: the payload travels as it is; AEAD: it does not.
    EXPECT_EQ(std::equal(payload.begin(), payload.end(), good.begin()), p == PacketProtection::kMac);
    auto refused = [&](Bytes b, const PacketHeader& h, const PacketKeys& keys) {
      Status s = open_packet(p, keys, h, b.data(), b.size());
      return !s.ok() && s.code() == StatusCode::kCorrupt;
    };
    Bytes flipped = good;
    flipped[500] ^= 1;
    EXPECT_TRUE(refused(flipped, header(0), k.from1)) << "payload";
    Bytes tag = good;
    tag.back() ^= 0x80;
    EXPECT_TRUE(refused(tag, header(0), k.from1)) << "tag";
    Bytes seq = good;
    seq[payload.size() + 8] ^= 1;  // the trailer's sequence number: the nonce and so the tag change
    EXPECT_TRUE(refused(seq, header(0), k.from1)) << "sequence number";
    Bytes epoch = good;
    epoch[payload.size()] ^= 1;
    EXPECT_TRUE(refused(epoch, header(0), k.from1)) << "epoch";
    EXPECT_TRUE(refused(good, header(0, 3, /*sender=*/2), k.from1)) << "sender";
    EXPECT_TRUE(refused(good, header(0, 3, 0, /*receiver=*/4), k.from1)) << "receiver";
    EXPECT_TRUE(refused(good, header(0, 3, 0, 1, /*tag=*/78), k.from1)) << "data-plane tag";
    Bytes shorter(good.begin() + 1, good.end());  // one payload byte less: the length is authenticated
    EXPECT_TRUE(refused(shorter, header(0), k.from1)) << "length";
    EXPECT_TRUE(refused(good, header(0), k.from0)) << "the other direction's key";
    KeyPairOfPeers other;
    EXPECT_TRUE(refused(good, header(0), other.from1)) << "another pair's key";
    EXPECT_TRUE(refused(Bytes(10), header(0), k.from1)) << "shorter than a trailer";
    // A packet sealed for the other protection is named as such.
    PacketProtection q = p == PacketProtection::kMac ? PacketProtection::kAead : PacketProtection::kMac;
    Bytes b = good;
    Status s = open_packet(q, k.from1, header(0), b.data(), b.size());
    EXPECT_NE(s.message().find("sealed with"), std::string::npos) << s.to_string();
    // An empty payload is sealed and checked too.
    Bytes empty = sealed(p, k.from0, header(10), {});
    EXPECT_TRUE(open_packet(p, k.from1, header(0), empty.data(), empty.size()).ok());
  }
  EXPECT_EQ(parse_packet_protection("aead").value(), PacketProtection::kAead);
  EXPECT_EQ(parse_packet_protection("hmac").status().code(), StatusCode::kInvalidArgument);
}

TEST(PacketAuth, TheReplayWindowAcceptsEachSequenceNumberOnce) {
  ReplayWindow w;
  EXPECT_FALSE(w.fresh(0));
  EXPECT_TRUE(w.fresh(1));
  w.accept(1);
  EXPECT_FALSE(w.fresh(1));
  w.accept(5);  // 2..4 not seen yet: still accepted once each (packets sealed by several threads)
  EXPECT_TRUE(w.fresh(3));
  w.accept(3);
  EXPECT_FALSE(w.fresh(3));
  EXPECT_TRUE(w.fresh(2));
  EXPECT_TRUE(w.fresh(4));
  w.accept(5 + ReplayWindow::kSpan);
  EXPECT_FALSE(w.fresh(2)) << "too old to tell";
  EXPECT_FALSE(w.fresh(5));
  EXPECT_TRUE(w.fresh(6 + 10));
  w.accept(1000000);  // a jump beyond the window forgets everything before it
  EXPECT_FALSE(w.fresh(999999 - ReplayWindow::kSpan));
  EXPECT_TRUE(w.fresh(999999));
  EXPECT_EQ(w.newest(), 1000000u);
}

std::unique_ptr<UcxDataPlane> make_plane(const char* tls = "tcp") {
  UcxOptions o;
  o.tls = tls;
  return test::loopback_plane(o);
}

DataPlaneSecurity security(PacketProtection p, uint32_t epoch, int peer, const std::array<uint8_t, 32>& key) {
  DataPlaneSecurity s;
  s.protection = p;
  s.epoch = epoch;
  s.peers[peer] = {key, local_ciphers()};
  return s;
}

// Polls `f` for up to 5 s.
template <class F>
bool eventually(F f) {
  return test::eventually(f, 5s);
}

TEST(AuthenticatedDataPlane, SendsEveryKindOfTransferBetweenTwoPlanes) {
  for (PacketProtection p : {PacketProtection::kMac, PacketProtection::kAead}) {
    SCOPED_TRACE(packet_protection_name(p));
    auto a = make_plane(), b = make_plane();
    ASSERT_TRUE(a->connect(0, {{1, b->address()}}, security(p, 1, 1, b->data_public_key())).ok());
    ASSERT_TRUE(b->connect(1, {{0, a->address()}}, security(p, 1, 0, a->data_public_key())).ok());
    EXPECT_FALSE(b->device_memory_direct(Device::cuda)) << "authenticated planes stage device memory";
    for (size_t n : {size_t(0), size_t(1), size_t(4000), size_t(3) << 20}) {
      const Bytes data = pattern(n, uint32_t(n));
      Tag t = make_tag(uint32_t(n % 1000), 1, Role::kActivation);
      Transfer r = b->recv(0, t);
      ASSERT_TRUE(a->send_view(1, t, data.data(), data.size()).wait(30s).ok());
      ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
      EXPECT_EQ(r.wire_bytes(), n);
      EXPECT_TRUE(r.take() == data) << n;
      // recv_into, posted after the packet arrived, and an owned send the other way.
      Bytes into(n + 7);
      ASSERT_TRUE(b->send(0, t, data).wait(30s).ok());
      std::this_thread::sleep_for(20ms);
      Transfer ri = a->recv_into(1, t, into.data(), into.size());
      ASSERT_TRUE(ri.wait(30s).ok()) << ri.status().to_string();
      EXPECT_EQ(ri.wire_bytes(), n);
      EXPECT_TRUE(std::equal(data.begin(), data.end(), into.begin()));
    }
    // Too large for its recv_into: found out once the packet is known to be authentic, and said.
    Bytes small(10);
    Transfer r = b->recv_into(0, make_tag(1, 2, Role::kOther), small.data(), small.size());
    a->send(1, make_tag(1, 2, Role::kOther), pattern(100, 1));
    EXPECT_EQ(r.wait(30s).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(a->auth_failures() + b->auth_failures(), 0u);
    // A plane cannot drop its protection on a later connect.
    EXPECT_EQ(a->connect(0, {{1, b->address()}}).code(), StatusCode::kInvalidArgument);
  }
}

// The receiver b (rank 1) believes rank 0's key is `k0`; the test holds k0 and seals rank 0's packets and their wire
// headers itself, sending them through an unauthenticated plane that calls itself rank 0 (so it can also send what an
// attacker would: altered, replayed, misattributed packets).
struct Injection {
  std::unique_ptr<UcxDataPlane> b = make_plane(), wire = make_plane();
  DataKeyPair k0 = DataKeyPair::generate();
  PacketKeys keys;
  PacketProtection p;
  explicit Injection(PacketProtection protection) : p(protection) {
    EXPECT_TRUE(b->connect(1, {{0, wire->address()}}, security(p, 2, 0, k0.public_key)).ok());
    EXPECT_TRUE(wire->connect(0, {{1, b->address()}}).ok());
    keys = PacketKeys::derive(0, k0, 1, b->data_public_key(), local_ciphers()).value();
  }
  Bytes seal(const Bytes& payload, uint64_t seq, Tag tag, uint32_t epoch = 2, const PacketKeys* with = nullptr) {
    return sealed(p, with ? *with : keys, header(seq, epoch, 0, 1, tag.pack()), payload);
  }
  // Sends `packet` under a wire header naming its trailer's epoch and sequence number (epoch 2, sequence 1000 when it
  // has none), with its MAC under `header_keys` (rank 0's genuine keys by default).
  void inject(Tag tag, Bytes packet, const PacketKeys* header_keys = nullptr) {
    WireHeader h;
    h.packet = header(1000, 2, 0, 1, tag.pack());
    if (auto t = read_trailer(packet.data(), packet.size()); t.ok()) {
      h.packet.seq = t->seq;
      h.packet.epoch = t->epoch;
    }
    h.length = packet.size();
    std::array<uint8_t, kWireHeaderBytes> bytes{};
    write_wire_header(h, header_keys ? header_keys : &keys, bytes.data());
    ASSERT_TRUE(wire->send_raw_for_tests(1, bytes, std::move(packet)).wait(30s).ok());
  }
};

TEST(AuthenticatedDataPlane, ForgedAlteredReplayedAndStalePacketsAreDroppedAndCounted) {
  for (PacketProtection p : {PacketProtection::kMac, PacketProtection::kAead}) {
    SCOPED_TRACE(packet_protection_name(p));
    Injection in(p);
    const Tag t5 = make_tag(5, 0, Role::kActivation), t3 = make_tag(3, 0, Role::kActivation);
    // A genuine packet arrives.
    Bytes first = in.seal(pattern(3000, 1), 1, t5);
    Transfer r = in.b->recv(0, t5);
    in.inject(t5, first);
    ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
    EXPECT_TRUE(r.take() == pattern(3000, 1));

    // Now the receive for the next packet waits while an attacker tries, one by one …
    r = in.b->recv(0, t5);
    uint64_t failures = 0;
    auto try_packet = [&](const char* what, Tag tag, Bytes packet, const PacketKeys* header_keys = nullptr) {
      in.inject(tag, std::move(packet), header_keys);
      ++failures;
      EXPECT_TRUE(eventually([&] { return in.b->auth_failures() == failures; }))
          << what << ": " << in.b->auth_failures() << " failures";
      EXPECT_FALSE(r.done()) << what << " completed the receive";
    };
    try_packet("a replay", t5, first);
    Bytes altered = in.seal(pattern(3000, 2), 2, t5);
    altered[17] ^= 4;
    try_packet("an altered payload", t5, altered);
    try_packet("another step's packet under this step's tag", t5, in.seal(pattern(3000, 2), 3, t3));
    try_packet("a packet sealed in an earlier epoch", t5, in.seal(pattern(3000, 2), 4, t5, /*epoch=*/1));
    KeyPairOfPeers stranger;  // someone else's keys, claiming rank 0
    try_packet("a packet claiming rank 0 from someone without its key", t5,
               in.seal(pattern(3000, 2), 5, t5, 2, &stranger.from0), &stranger.from0);
    try_packet("a genuine packet under a header from someone without its key", t5, in.seal(pattern(3000, 2), 11, t5),
               &stranger.from0);
    try_packet("garbage", t5, pattern(3000, 9));
    try_packet("shorter than a trailer", t5, Bytes(5));
    // A replay of an earlier step's packet that nothing waits for is dropped too (not queued for later).
    try_packet("an earlier step's packet again", t3, first);
    EXPECT_EQ(in.b->unexpected_packets(), 0u);
    EXPECT_EQ(in.b->dropped_packets(), failures);

    // … and the genuine next packet completes it.
    in.inject(t5, in.seal(pattern(3000, 2), 6, t5));
    ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
    EXPECT_TRUE(r.take() == pattern(3000, 2));
    // The same with a recv_into: a forged packet never reaches the caller's buffer as a result.
    Bytes into(4000, 0);
    Transfer ri = in.b->recv_into(0, t5, into.data(), into.size());
    in.inject(t5, in.seal(pattern(3500, 3), 7, t5, 2, &stranger.from0), &stranger.from0);
    EXPECT_TRUE(eventually([&] { return in.b->auth_failures() == failures + 1; }));
    EXPECT_FALSE(ri.done());
    in.inject(t5, in.seal(pattern(3500, 4), 8, t5));
    ASSERT_TRUE(ri.wait(30s).ok());
    EXPECT_EQ(ri.wire_bytes(), 3500u);
    const Bytes want = pattern(3500, 4);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), into.begin()));
    // Packets sealed by several threads may arrive a little out of order: each is accepted once.
    Transfer r10 = in.b->recv(0, make_tag(10, 0, Role::kOther)), r9 = in.b->recv(0, make_tag(9, 0, Role::kOther));
    in.inject(make_tag(10, 0, Role::kOther), in.seal(pattern(10, 10), 10, make_tag(10, 0, Role::kOther)));
    in.inject(make_tag(9, 0, Role::kOther), in.seal(pattern(10, 9), 9, make_tag(9, 0, Role::kOther)));
    EXPECT_TRUE(r10.wait(30s).ok());
    EXPECT_TRUE(r9.wait(30s).ok());
    EXPECT_EQ(in.b->auth_failures(), failures + 1);
  }
}

// A forged packet that arrives while a genuine one for the same receive is already queued behind it: the receive
// takes the genuine one once the forgery is refused.
TEST(AuthenticatedDataPlane, AReceiveWhosePacketWasRefusedTakesTheNextOneQueued) {
  Injection in(PacketProtection::kMac);
  const Tag t = make_tag(1, 0, Role::kActivationGrad);
  KeyPairOfPeers stranger;
  in.inject(t, in.seal(pattern(1 << 20, 1), 1, t, 2, &stranger.from0));  // its header is genuine, its trailer not
  in.inject(t, in.seal(pattern(1 << 20, 2), 2, t));
  ASSERT_TRUE(eventually([&] { return in.b->auth_failures() == 1 && in.b->unexpected_packets() == 1; }));
  auto got = in.b->recv_blocking(0, t, 30s);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == pattern(1 << 20, 2));
}

// A packet capture on the loopback, for the duration of `fn` (root only: AF_PACKET).
std::string capture_loopback(const std::function<void()>& fn) {
  int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) return {};
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = int(if_nametoindex("lo"));
  bind(fd, reinterpret_cast<sockaddr*>(&sll), sizeof(sll));
  timeval tv{0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int big = 64 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
  std::atomic<bool> stop{false};
  std::string seen;
  std::thread reader([&] {
    std::vector<char> buf(1 << 17);
    while (!stop) {
      ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n > 0) seen.append(buf.data(), size_t(n));
    }
  });
  fn();
  std::this_thread::sleep_for(200ms);
  stop = true;
  reader.join();
  close(fd);
  return seen;
}

TEST(AuthenticatedDataPlane, ALoopbackCaptureShowsActivationsOnlyWithoutEncryption) {
  if (geteuid() != 0) GTEST_SKIP() << "capturing on the loopback needs root (AF_PACKET)";
  // A known activation pattern: fp32 values whose bytes spell a marker that occurs nowhere else.
  const std::string marker = "ACTIVATION-PATTERN-4c6f6e67";
  Bytes activation;
  for (int i = 0; i < 2000; ++i) activation.insert(activation.end(), marker.begin(), marker.end());
  for (PacketProtection p : {PacketProtection::kNone, PacketProtection::kMac, PacketProtection::kAead}) {
    SCOPED_TRACE(packet_protection_name(p));
    auto a = make_plane("tcp"), b = make_plane("tcp");  // over TCP, so the bytes cross the loopback
    ASSERT_TRUE(a->connect(0, {{1, b->address()}}, security(p, 1, 1, b->data_public_key())).ok());
    ASSERT_TRUE(b->connect(1, {{0, a->address()}}, security(p, 1, 0, a->data_public_key())).ok());
    std::string captured = capture_loopback([&] {
      for (int i = 0; i < 4; ++i) {
        Transfer r = b->recv(0, make_tag(uint32_t(i), 0, Role::kActivation));
        ASSERT_TRUE(a->send_view(1, make_tag(uint32_t(i), 0, Role::kActivation), activation.data(), activation.size())
                        .wait(30s)
                        .ok());
        ASSERT_TRUE(r.wait(30s).ok());
        EXPECT_TRUE(r.take() == activation);
      }
    });
    ASSERT_GT(captured.size(), activation.size()) << "the capture saw no traffic";
    const bool visible = captured.find(marker) != std::string::npos;
    EXPECT_EQ(visible, p != PacketProtection::kAead) << captured.size() << " bytes captured";
  }
}

}  // namespace
}  // namespace lh
