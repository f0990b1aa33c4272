// The data-plane relay: two UcxDataPlanes whose pair goes through a Relay (as when they cannot connect directly)
// exchange every kind of transfer, sealed or not, with the plane's own bounds; the relay refuses hellos without the
// token and drops what it cannot place, counted.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "tests/transport/byte_pattern.h"
#include "tests/transport/plane_util.h"
#include "transport/allow_list.h"
#include "transport/relay.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using namespace std::chrono_literals;
using test::pattern;

std::unique_ptr<UcxDataPlane> make_plane(UcxOptions o = {}) {
  o.tls = "tcp";
  return test::loopback_plane(o);
}

std::unique_ptr<Relay> make_relay(const std::string& token = "job-token") {
  RelayOptions o;
  o.token = token;
  auto r = Relay::start(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

RelayClientOptions client(const Relay& relay, const std::string& token = "job-token") {
  RelayClientOptions o;
  o.endpoint = relay.endpoint();
  o.token = token;
  o.timeout = 5s;
  return o;
}

// Polls `f` for up to 5 s.
template <class F>
bool eventually(F f) {
  return test::eventually(f, 5s);
}

DataPlaneSecurity security(PacketProtection p, int peer, const std::array<uint8_t, 32>& key) {
  DataPlaneSecurity s;
  s.protection = p;
  s.epoch = 1;
  s.peers[peer] = {key, local_ciphers()};
  return s;
}

// Every kind of transfer both ways through the relay, plain and with each packet protection (sealed end to end: the
// relay forwards what it cannot read); the relay counts what it forwarded, per pair.
TEST(Relay, CarriesEveryKindOfTransferBetweenTwoPlanes) {
  for (PacketProtection p : {PacketProtection::kNone, PacketProtection::kMac, PacketProtection::kAead}) {
    SCOPED_TRACE(packet_protection_name(p));
    auto relay = make_relay();
    auto a = make_plane(), b = make_plane();
    ASSERT_TRUE(a->connect(0, {{1, b->address()}}, p == PacketProtection::kNone ? DataPlaneSecurity{}
                                                                                : security(p, 1, b->data_public_key()))
                    .ok());
    ASSERT_TRUE(b->connect(1, {{0, a->address()}}, p == PacketProtection::kNone ? DataPlaneSecurity{}
                                                                                : security(p, 0, a->data_public_key()))
                    .ok());
    ASSERT_TRUE(a->use_relay(client(*relay), {1}).ok());
    ASSERT_TRUE(b->use_relay(client(*relay), {0}).ok());
    EXPECT_EQ(a->relayed_peers(), std::set<int>{1});
    EXPECT_EQ(relay->connected(), 2);
    uint64_t sent = 0;
    for (size_t n : {size_t(0), size_t(1), size_t(4000), size_t(3) << 20}) {
      const Bytes data = pattern(n, uint32_t(n));
      const Tag t = make_tag(uint32_t(n % 1000), 1, Role::kActivation);
      Transfer r = b->recv(0, t);
      ASSERT_TRUE(a->send_view(1, t, data.data(), data.size()).wait(30s).ok());
      ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
      EXPECT_EQ(r.wire_bytes(), n);
      EXPECT_TRUE(r.take() == data) << n;
      // recv_into posted before and after its packet arrived, the other way.
      Bytes into(n + 7);
      Transfer early = a->recv_into(1, t, into.data(), into.size());
      ASSERT_TRUE(b->send(0, t, data).wait(30s).ok());
      ASSERT_TRUE(early.wait(30s).ok()) << early.status().to_string();
      EXPECT_TRUE(std::equal(data.begin(), data.end(), into.begin()));
      ASSERT_TRUE(b->send(0, t, data).wait(30s).ok());
      std::this_thread::sleep_for(20ms);
      std::fill(into.begin(), into.end(), 0);
      Transfer late = a->recv_into(1, t, into.data(), into.size());
      ASSERT_TRUE(late.wait(30s).ok()) << late.status().to_string();
      EXPECT_EQ(late.wire_bytes(), n);
      EXPECT_TRUE(std::equal(data.begin(), data.end(), into.begin()));
      sent += 1;
    }
    // Packets of one (peer, tag) keep their order through the relay.
    const Tag t = make_tag(9, 9, Role::kOther);
    for (uint32_t i = 0; i < 20; ++i) a->send(1, t, pattern(100 + i, i));
    for (uint32_t i = 0; i < 20; ++i) {
      auto got = b->recv_blocking(0, t, 30s);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_TRUE(*got == pattern(100 + i, i)) << i;
    }
    // Too large for its recv_into: the receive fails, named.
    Bytes small(10);
    Transfer r = b->recv_into(0, make_tag(1, 2, Role::kOther), small.data(), small.size());
    a->send(1, make_tag(1, 2, Role::kOther), pattern(100, 1));
    EXPECT_EQ(r.wait(30s).code(), StatusCode::kOutOfRange);
    const auto counts = relay->forwarded();
    ASSERT_TRUE(counts.count({0, 1}) && counts.count({1, 0}));
    EXPECT_EQ(counts.at({0, 1}).packets, sent + 20 + 1);
    EXPECT_EQ(counts.at({1, 0}).packets, 2 * sent);
    EXPECT_EQ(a->auth_failures() + b->auth_failures(), 0u);
    EXPECT_EQ(relay->dropped(), 0u);
  }
}

// Large packets travel in parts; parts from two senders interleave at the receiver and each packet comes out whole.
TEST(Relay, PacketsInPartsFromTwoSendersComeOutWhole) {
  auto relay = make_relay();
  auto a = make_plane(), b = make_plane(), c = make_plane();
  ASSERT_TRUE(a->connect(0, {{1, b->address()}, {2, c->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}, {2, c->address()}}).ok());
  ASSERT_TRUE(c->connect(2, {{0, a->address()}, {1, b->address()}}).ok());
  ASSERT_TRUE(a->use_relay(client(*relay), {1}).ok());
  ASSERT_TRUE(b->use_relay(client(*relay), {0, 2}).ok());
  ASSERT_TRUE(c->use_relay(client(*relay), {1}).ok());
  const size_t n = 3 * kRelayFragmentBytes + 17;
  std::thread ta([&] {
    for (uint32_t i = 0; i < 5; ++i) a->send(1, make_tag(i, 0, Role::kActivation), pattern(n, i));
  });
  std::thread tc([&] {
    for (uint32_t i = 0; i < 5; ++i) c->send(1, make_tag(i, 0, Role::kActivation), pattern(n, 100 + i));
  });
  ta.join();
  tc.join();
  for (uint32_t i = 0; i < 5; ++i) {
    auto from_a = b->recv_blocking(0, make_tag(i, 0, Role::kActivation), 30s);
    auto from_c = b->recv_blocking(2, make_tag(i, 0, Role::kActivation), 30s);
    ASSERT_TRUE(from_a.ok() && from_c.ok());
    EXPECT_TRUE(*from_a == pattern(n, i)) << i;
    EXPECT_TRUE(*from_c == pattern(n, 100 + i)) << i;
  }
  EXPECT_EQ(relay->forwarded().at({0, 1}).packets, 5u);
  EXPECT_EQ(relay->forwarded().at({0, 1}).bytes, 5 * n);
  EXPECT_EQ(b->dropped_packets(), 0u);
}

// The receiver's bounds hold for relayed packets as for UCX ones: a peer that sends too many packets ahead of their
// receives is failed, named.
TEST(Relay, ARelayedPeerOverTheBoundsIsFailedNamed) {
  auto relay = make_relay();
  UcxOptions bounded;
  bounded.max_unexpected_packets = 3;
  auto a = make_plane(), b = make_plane(bounded);
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  ASSERT_TRUE(a->use_relay(client(*relay), {1}).ok());
  ASSERT_TRUE(b->use_relay(client(*relay), {0}).ok());
  for (uint32_t i = 0; i < 5; ++i) a->send(1, make_tag(i, 0, Role::kOther), pattern(64, i));
  ASSERT_TRUE(eventually([&] { return b->dropped_packets() > 0; }));
  Status s = b->recv(0, make_tag(0, 0, Role::kOther)).wait(5s);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("max_unexpected_packets"), std::string::npos) << s.message();
}

// A hello without the job's token is refused, and use_relay says so; a relay that never answers is named with its
// endpoint within the timeout.
TEST(Relay, AWrongTokenOrNoRelayIsAClearError) {
  auto relay = make_relay("right");
  auto a = make_plane(), b = make_plane();
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  Status s = a->use_relay(client(*relay, "wrong"), {1});
  EXPECT_NE(s.message().find("refused this worker: wrong token"), std::string::npos) << s.message();
  EXPECT_TRUE(a->relayed_peers().empty());
  EXPECT_EQ(relay->connected(), 0);

  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  RelayClientOptions nowhere;
  nowhere.endpoint = "tcp://127.0.0.1:9";  // the discard port: nothing listens there
  nowhere.timeout = 500ms;
  const auto t0 = std::chrono::steady_clock::now();
  s = b->use_relay(nowhere, {0});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_NE(s.message().find("the relay at tcp://127.0.0.1:9 did not answer within 500 ms"), std::string::npos)
      << s.message();
  EXPECT_FALSE(b->use_relay(client(*relay, "right"), {7}).ok()) << "rank 7 is not in the plan";
}

// With a rank key, a hello binds only the rank whose token it carries (each worker's is in its plan): a member of
// the job, which holds the join token, cannot bind another member's rank and receive its packets. The victim stays
// bound and its packets still arrive.
TEST(Relay, AHelloBindsOnlyTheRankItsTokenIsFor) {
  RelayOptions o;
  o.token = "job-token";
  o.rank_key = std::string(kRelayRankKeyBytes, '\x5a');
  auto r = Relay::start(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Relay& relay = **r;
  EXPECT_NE(relay_rank_token(o.rank_key, 0), relay_rank_token(o.rank_key, 1));
  EXPECT_NE(relay_rank_token(o.rank_key, 0), relay_rank_token(std::string(kRelayRankKeyBytes, '\x5b'), 0));
  auto a = make_plane(), b = make_plane(), thief = make_plane();
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}).ok());
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}).ok());
  ASSERT_TRUE(a->use_relay(client(relay, relay_rank_token(o.rank_key, 0)), {1}).ok());
  ASSERT_TRUE(b->use_relay(client(relay, relay_rank_token(o.rank_key, 1)), {0}).ok());
  EXPECT_EQ(relay.connected(), 2);
  // Another process claiming rank 1: with the job's join token, with rank 0's own token, with nothing.
  ASSERT_TRUE(thief->connect(1, {{0, a->address()}}).ok());
  for (const std::string& token : {std::string("job-token"), relay_rank_token(o.rank_key, 0), std::string()}) {
    Status s = thief->use_relay(client(relay, token), {0});
    EXPECT_NE(s.message().find("wrong token for rank 1 (each rank's is in its plan"), std::string::npos)
        << "token '" << token << "': " << s.message();
  }
  EXPECT_EQ(relay.dropped(), 3u);
  const Tag t = make_tag(3, 1, Role::kActivation);
  Transfer got = b->recv(0, t);
  ASSERT_TRUE(a->send(1, t, pattern(5000, 3)).wait(30s).ok());
  ASSERT_TRUE(got.wait(30s).ok()) << got.status().to_string();
  EXPECT_TRUE(got.take() == pattern(5000, 3));
  // A bad key length is refused at start.
  o.rank_key = "short";
  EXPECT_NE(Relay::start(o).status().message().find("rank key has 5 bytes, not 32"), std::string::npos);
}

// What the relay cannot place is dropped and counted, never forwarded: data from a connection that sent no hello, to
// a rank not connected, or with bad frames.
TEST(Relay, DropsWhatItCannotPlace) {
  auto relay = make_relay("");
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  ASSERT_EQ(zmq_connect(s, relay->endpoint().c_str()), 0);
  auto send = [&](std::vector<Bytes> frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      zmq_send(s, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  };
  auto word = [](const char* w) { return Bytes(w, w + std::strlen(w)); };
  send({word("data"), relay_u32(1), relay_u64(5), pattern(10, 1)});  // no hello yet
  ASSERT_TRUE(eventually([&] { return relay->dropped() == 1; }));
  send({word("hello"), relay_u32(0), Bytes{}});
  char buf[64];
  ASSERT_EQ(zmq_recv(s, buf, sizeof(buf), 0), 7);
  EXPECT_EQ(std::string(buf, 7), "welcome");
  send({word("data"), relay_u32(1), relay_u64(5), pattern(10, 1)});  // rank 1 is not connected
  ASSERT_TRUE(eventually([&] { return relay->dropped() == 2; }));
  send({word("data"), relay_u32(1), Bytes{1, 2}, pattern(10, 1)});  // a short tag frame
  send({word("what")});
  ASSERT_TRUE(eventually([&] { return relay->dropped() == 4; }));
  send({word("hello"), relay_u32(99999), Bytes{}});  // a rank out of range
  ASSERT_TRUE(eventually([&] { return relay->dropped() == 5; }));
  EXPECT_TRUE(relay->forwarded().empty());
  zmq_close(s);
  zmq_ctx_term(ctx);
}

// A listener whose port is held when it starts waits for it (bind_retry) and takes it once it is let go; a port that
// stays held past the wait is an error naming the address and the cause.
TEST(ZmqLoopBind, AHeldPortIsWaitedForThenNamed) {
  // A port held by a plain listening socket (no SO_REUSEADDR: ZeroMQ's bind cannot share it).
  auto hold = [](int* port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 1) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return -1;
    *port = ntohs(a.sin_port);
    return fd;
  };
  auto options = [](int port, std::chrono::milliseconds retry) {
    ZmqLoop::Options o;
    o.socket_type = ZMQ_ROUTER;
    o.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
    o.bind = true;
    o.bind_retry = retry;
    return o;
  };
  int port = 0;
  int fd = hold(&port);
  ASSERT_GE(fd, 0);
  auto refused = ZmqLoop::start(
      options(port, 300ms), [](Frames&&) {}, [] {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cannot listen on 'tcp://127.0.0.1:" + std::to_string(port) + "'"),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("in use"), std::string::npos) << refused.status().message();
  std::thread release([fd] {
    std::this_thread::sleep_for(500ms);
    close(fd);
  });
  auto waited = ZmqLoop::start(
      options(port, 20s), [](Frames&&) {}, [] {});
  release.join();
  ASSERT_TRUE(waited.ok()) << waited.status().message();
  EXPECT_EQ((*waited)->endpoint(), "tcp://127.0.0.1:" + std::to_string(port));
}

TEST(TcpEndpoint, AddressesAreSplitAndBadOnesRefused) {
  auto e = parse_tcp_endpoint("tcp://relay.example:5556");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "relay.example");
  EXPECT_EQ(e->port, 5556);
  EXPECT_EQ(e->with_port(5557), "tcp://relay.example:5557");
  auto any = parse_tcp_endpoint("tcp://127.0.0.1:*", /*any_port=*/true);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->port, 0);
  EXPECT_EQ(any->with_port(0), "tcp://127.0.0.1:*");
  for (const char* bad : {"127.0.0.1:7001", "tcp://h", "tcp://:7001", "tcp://h:0", "tcp://h:70000", "tcp://h:7x",
                          "udp://h:1", "tcp://h:*"})
    EXPECT_EQ(parse_tcp_endpoint(bad).status().message(), "expected tcp://HOST:PORT") << bad;
}

// The TCP ports this process listens on.
std::set<int> listening_ports() {
  const std::vector<int> ports = listening_tcp_ports();
  return std::set<int>(ports.begin(), ports.end());
}

TEST(DataPorts, RangesAreParsedAndBadOnesNamed) {
  auto r = parse_port_range("40000-40015");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 40000);
  EXPECT_EQ(r->second, 40015);
  for (const char* bad : {"", "40000", "0-10", "10-5", "1-70000", "a-b", "40000-"})
    EXPECT_EQ(parse_port_range(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(parse_port_range("10-5").status().message().find("empty"), std::string::npos);
  // A plane with a port range listens inside it, and only there.
  auto in_range = [](const std::set<int>& ports) {
    return std::count_if(ports.begin(), ports.end(), [](int q) { return q >= 47310 && q <= 47330; });
  };
  const std::set<int> before = listening_ports();
  UcxOptions o;
  o.data_ports = "47310-47330";
  auto p = make_plane(o);
  ASSERT_TRUE(p);
  const std::set<int> after = listening_ports();
  EXPECT_EQ(in_range(before), 0);
  EXPECT_GE(in_range(after), 1);
  for (int q : after)
    if (!before.count(q)) EXPECT_TRUE(q >= 47310 && q <= 47330) << "plane listens on port " << q;
  EXPECT_EQ(std::getenv("UCX_TCP_PORT_RANGE"), nullptr) << "the environment is put back";
  UcxOptions bad;
  bad.data_ports = "9-1";
  EXPECT_EQ(UcxDataPlane::create(bad).status().code(), StatusCode::kInvalidArgument);
}

// The envelope carries an advertised address (version 2) beside the UCX address; a bad host in it is refused, and
// check_advertised_host names what is wrong with a host a user gives.
TEST(Advertise, TheEnvelopeCarriesTheAdvertisedAddress) {
  const Bytes ucx = pattern(90, 3);
  auto plain = unwrap_peer_address(wrap_worker_address(ucx.data(), ucx.size()));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->worker, ucx);
  EXPECT_TRUE(plain->host.empty());
  EXPECT_EQ(plain->describe(), "");
  auto ad = unwrap_peer_address(wrap_worker_address(ucx.data(), ucx.size(), "gpu-3.example.org", 47001));
  ASSERT_TRUE(ad.ok()) << ad.status().to_string();
  EXPECT_EQ(ad->worker, ucx);
  EXPECT_EQ(ad->host, "gpu-3.example.org");
  EXPECT_EQ(ad->port, 47001);
  EXPECT_EQ(ad->describe(), "advertised gpu-3.example.org:47001");
  EXPECT_EQ(unwrap_worker_address(wrap_worker_address(ucx.data(), ucx.size(), "10.0.0.1", 5)).value(), ucx);
  // A host with characters no name has, and port 0, are corrupt envelopes (checksummed, so made, not flipped).
  EXPECT_NE(unwrap_peer_address(wrap_worker_address(ucx.data(), ucx.size(), "a b", 5)).status().message().find(
                "advertised host: ' ' is not allowed"),
            std::string::npos);
  EXPECT_NE(unwrap_peer_address(wrap_worker_address(ucx.data(), ucx.size(), "h", 0)).status().message().find("port 0"),
            std::string::npos);
  Bytes flipped = wrap_worker_address(ucx.data(), ucx.size(), "h", 9);
  flipped[22] ^= 1;
  EXPECT_EQ(unwrap_peer_address(flipped).status().code(), StatusCode::kCorrupt);
  for (const char* good : {"10.1.2.3", "node-7.cluster.local", "my_host"}) EXPECT_TRUE(check_advertised_host(good).ok());
  EXPECT_NE(check_advertised_host("").message().find("empty"), std::string::npos);
  EXPECT_NE(check_advertised_host(std::string(254, 'a')).message().find("253"), std::string::npos);
  EXPECT_NE(check_advertised_host("tcp://h:1").message().find("':' is not allowed"), std::string::npos);
  UcxOptions o;
  o.advertise = "bad host";
  EXPECT_NE(UcxDataPlane::create(o).status().message().find("advertised host 'bad host'"), std::string::npos);
}

// A plane that advertises an address opens a UCX listener inside its data ports; its peers connect there (client–
// server mode), and every kind of traffic flows both ways, sealed or not, also when both advertise.
TEST(Advertise, PeersConnectToTheAdvertisedAddress) {
  for (PacketProtection p : {PacketProtection::kNone, PacketProtection::kMac}) {
    for (bool both : {false, true}) {
      SCOPED_TRACE(std::string(packet_protection_name(p)) + (both ? ", both advertise" : ", one advertises"));
      UcxOptions ao;
      ao.advertise = "127.0.0.1";
      ao.data_ports = "47340-47360";
      auto a = make_plane(ao);
      UcxOptions bo;
      if (both) bo.advertise = "localhost";
      auto b = make_plane(bo);
      ASSERT_TRUE(a && b);
      EXPECT_GE(a->listen_port(), 47340);
      EXPECT_LE(a->listen_port(), 47360);
      EXPECT_EQ(b->listen_port() > 0, both);
      EXPECT_EQ(unwrap_peer_address(a->address())->describe(),
                "advertised 127.0.0.1:" + std::to_string(a->listen_port()));
      auto sec = [&](int peer, const std::array<uint8_t, 32>& key) {
        return p == PacketProtection::kNone ? DataPlaneSecurity{} : security(p, peer, key);
      };
      ASSERT_TRUE(a->connect(0, {{1, b->address()}}, sec(1, b->data_public_key())).ok());
      ASSERT_TRUE(b->connect(1, {{0, a->address()}}, sec(0, a->data_public_key())).ok());
      for (uint64_t n : {uint64_t(0), uint64_t(100), uint64_t(3) << 20}) {
        const Bytes x = pattern(n, 1), y = pattern(n, 2);
        Transfer to_a = a->recv(1, make_tag(1, 0, Role::kActivation));
        Transfer to_b = b->recv(0, make_tag(1, 0, Role::kActivationGrad));
        ASSERT_TRUE(b->send(0, make_tag(1, 0, Role::kActivation), x).wait(20s).ok());
        ASSERT_TRUE(a->send(1, make_tag(1, 0, Role::kActivationGrad), y).wait(20s).ok());
        ASSERT_TRUE(to_a.wait(20s).ok()) << to_a.status().to_string();
        ASSERT_TRUE(to_b.wait(20s).ok()) << to_b.status().to_string();
        EXPECT_TRUE(to_a.take() == x);
        EXPECT_TRUE(to_b.take() == y);
      }
      // b's endpoint went to a's listener: a accepted it (and, when b advertises too, the other way round).
      EXPECT_TRUE(eventually([&] { return a->accepted_connections() >= 1; }));
      EXPECT_EQ(b->accepted_connections() >= 1, both);
      EXPECT_EQ(a->auth_failures() + b->auth_failures(), 0u);
    }
  }
}

// A peer's advertised address where nothing listens: its endpoint fails, and the failure names the address.
TEST(Advertise, ATransferToAnAdvertisedAddressNobodyListensAtIsNamed) {
  auto a = make_plane(), b = make_plane();
  ASSERT_TRUE(a && b);
  auto raw = unwrap_worker_address(b->address());
  ASSERT_TRUE(raw.ok());
  // Port 9 (discard) on loopback: nothing listens there on a test machine.
  const Bytes nowhere = wrap_worker_address(raw->data(), raw->size(), "127.0.0.1", 9);
  ASSERT_TRUE(a->connect(0, {{1, nowhere}}).ok());
  Status s = a->send(1, make_tag(1, 0, Role::kActivation), pattern(64, 1)).wait(30s);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("advertised 127.0.0.1:9"), std::string::npos) << s.to_string();
}

// The listener binds the advertised address's interface when this host has it, else every interface (NAT, port
// forwarding) unless --data-bind names one; a bind address this host does not have, or one without an advertised
// address, is refused by name.
TEST(Advertise, TheListenerBindsTheAdvertisedInterfaceOrDataBind) {
  UcxOptions o;
  o.advertise = "127.0.0.1";
  EXPECT_EQ(make_plane(o)->listen_address(), "127.0.0.1");
  o.advertise = "192.0.2.10";  // TEST-NET-1: not this host's (a forwarded port's public address)
  EXPECT_EQ(make_plane(o)->listen_address(), "0.0.0.0");
  o.data_bind = "127.0.0.1";
  EXPECT_EQ(make_plane(o)->listen_address(), "127.0.0.1");
  o.data_bind = "192.0.2.11";
  o.tls = "tcp";
  auto bad = UcxDataPlane::create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'192.0.2.11': no interface of this host has it"), std::string::npos)
      << bad.status().to_string();
  o.data_bind = "not-an-address";
  EXPECT_NE(UcxDataPlane::create(o).status().message().find("not an IPv4 address"), std::string::npos);
  UcxOptions no_advertise;
  no_advertise.data_bind = "127.0.0.1";
  EXPECT_NE(UcxDataPlane::create(no_advertise).status().message().find("without an advertised address"),
            std::string::npos);
}

// Connections to the advertised listener are few until proven: the peer's hello (authenticated under the pair's keys)
// proves its connection, also when it came before the listener's plane knew the peer's key (connect() checks it
// then); a stranger's connection is closed once unproven for unproven_timeout, and while max_unproven_connections
// strangers wait, further ones are refused. The member's link keeps working throughout.
TEST(Advertise, UnprovenConnectionsAreBoundedAndClosed) {
  UcxOptions bo;
  bo.advertise = "127.0.0.1";
  bo.max_unproven_connections = 2;
  bo.unproven_timeout = 1500ms;
  auto b = make_plane(bo), a = make_plane();
  // a connects (and says hello) before b knows a's key: b proves the connection at its own connect().
  ASSERT_TRUE(a->connect(0, {{1, b->address()}}, security(PacketProtection::kMac, 1, b->data_public_key())).ok());
  ASSERT_TRUE(eventually([&] { return b->accepted_connections() == 1; }));
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(b->connect(1, {{0, a->address()}}, security(PacketProtection::kMac, 0, a->data_public_key())).ok());
  // Three strangers with keys of their own, each claiming rank 0.
  std::vector<std::unique_ptr<UcxDataPlane>> strangers;
  for (int i = 0; i < 3; ++i) {
    strangers.push_back(make_plane());
    ASSERT_TRUE(strangers.back()
                    ->connect(0, {{1, b->address()}}, security(PacketProtection::kMac, 1, b->data_public_key()))
                    .ok());
    if (i < 2) ASSERT_TRUE(eventually([&] { return b->accepted_connections() == uint64_t(2 + i); }));
  }
  EXPECT_TRUE(eventually([&] { return b->refused_connections() == 1; })) << b->refused_connections();
  EXPECT_EQ(b->accepted_connections(), 3u);
  // Their hellos did not verify (each sealed under its own keys, not rank 0's).
  EXPECT_TRUE(eventually([&] { return b->auth_failures() == 2; })) << b->auth_failures();
  EXPECT_TRUE(eventually([&] { return b->unproven_closed() == 2; })) << b->unproven_closed();
  // a's connection, proven, stays: its packets still arrive, well after the strangers' were closed.
  for (uint32_t step = 1; step <= 2; ++step) {
    Transfer r = b->recv(0, make_tag(step, 0, Role::kActivation));
    ASSERT_TRUE(a->send(1, make_tag(step, 0, Role::kActivation), pattern(5000, step)).wait(20s).ok());
    ASSERT_TRUE(r.wait(20s).ok()) << r.status().to_string();
    EXPECT_TRUE(r.take() == pattern(5000, step));
  }
  EXPECT_EQ(b->unproven_closed(), 2u);
  EXPECT_EQ(b->dropped_packets(), 2u);
}

// A relay-only plane (--relay-only) opens no socket at all: no listener, not even UCX's own tcp interfaces. Its peers
// cannot reach it directly (their transfers fail, named), and through the relay every transfer flows, sealed. It
// takes no transports, advertised address or data ports.
TEST(Relay, ARelayOnlyPlaneOpensNoPortAndTalksThroughTheRelay) {
  const size_t before = listening_ports().size();
  UcxOptions ro;
  ro.relay_only = true;
  auto a = UcxDataPlane::create(ro);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(listening_ports().size(), before) << "a relay-only plane listens somewhere";
  auto b = make_plane();
  EXPECT_GT(listening_ports().size(), before) << "the check above cannot fail: a tcp plane listens nowhere either";
  ASSERT_TRUE(
      (*a)->connect(0, {{1, b->address()}}, security(PacketProtection::kMac, 1, b->data_public_key())).ok());
  ASSERT_TRUE(b->connect(1, {{0, (*a)->address()}}, security(PacketProtection::kMac, 0, (*a)->data_public_key())).ok());
  Status direct = (*a)->send(1, make_tag(1, 0, Role::kActivation), pattern(10, 1)).wait(10s);
  EXPECT_NE(direct.message().find("relay-only"), std::string::npos) << direct.to_string();
  auto relay = make_relay();
  ASSERT_TRUE((*a)->use_relay(client(*relay), {1}).ok());
  ASSERT_TRUE(b->use_relay(client(*relay), {0}).ok());
  for (uint64_t n : {uint64_t(0), uint64_t(5000), uint64_t(3) << 20}) {
    Transfer r = b->recv(0, make_tag(2, 0, Role::kActivation));
    ASSERT_TRUE((*a)->send(1, make_tag(2, 0, Role::kActivation), pattern(n, 2)).wait(20s).ok());
    ASSERT_TRUE(r.wait(20s).ok()) << r.status().to_string();
    EXPECT_TRUE(r.take() == pattern(n, 2));
    Transfer back = (*a)->recv(1, make_tag(3, 0, Role::kActivationGrad));
    ASSERT_TRUE(b->send(0, make_tag(3, 0, Role::kActivationGrad), pattern(n, 3)).wait(20s).ok());
    ASSERT_TRUE(back.wait(20s).ok()) << back.status().to_string();
    EXPECT_TRUE(back.take() == pattern(n, 3));
  }
  for (auto bad : {&UcxOptions::tls, &UcxOptions::advertise, &UcxOptions::data_ports}) {
    UcxOptions o;
    o.relay_only = true;
    o.*bad = "x";
    EXPECT_NE(UcxDataPlane::create(o).status().message().find("relay-only data plane opens no data ports"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace lh
