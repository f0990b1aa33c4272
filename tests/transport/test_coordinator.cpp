// Tests of the control plane in one process (coordinator and clients on their own threads and sockets):
// join → plan → ready → barrier → metrics → set-codec → shutdown, bad tokens, garbage and protocol errors
// rejected while the coordinator keeps serving, dead-worker detection, ctl requests, a lost coordinator.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "transport/control_client.h"
#include "transport/coordinator.h"
#include "transport/job_secret.h"

namespace lh {
namespace {

using namespace std::chrono_literals;

CoordinatorOptions opts(int n) {
  CoordinatorOptions o;
  o.token = "secret";
  o.expected_workers = n;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 600ms;
  return o;
}

std::unique_ptr<ControlClient> client(const std::string& ep, const std::string& token = "secret") {
  ControlClientOptions o;
  o.coordinator = ep;
  o.token = token;
  o.hostname = "test-host";
  o.heartbeat_interval = 50ms;
  auto c = ControlClient::connect(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(c).value();
}

std::vector<uint8_t> fake_address(int i) {
  return std::vector<uint8_t>(16, uint8_t(i + 1));
}

// A bare DEALER that sends arbitrary frames and returns the first reply it gets.
struct RawDealer {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  explicit RawDealer(const std::string& ep) {
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_connect(sock, ep.c_str());
  }
  ~RawDealer() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
  void send(const std::vector<std::vector<uint8_t>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      zmq_send(sock, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  }
  std::optional<ControlMessage> reply(int timeout_ms = 3000) {
    zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return std::nullopt;
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, sock, 0);
    auto* p = static_cast<uint8_t*>(zmq_msg_data(&m));
    std::vector<uint8_t> b(p, p + zmq_msg_size(&m));
    zmq_msg_close(&m);
    auto d = decode_message(b);
    if (!d.ok()) return std::nullopt;
    return d.value();
  }
  std::string reject_reason(int timeout_ms = 3000) {
    for (int i = 0; i < 20; ++i) {
      auto r = reply(timeout_ms);
      if (!r) return "<no reply>";
      if (auto* rej = std::get_if<Reject>(&*r)) return rej->reason;
    }
    return "<no reject>";
  }
};

// A bare ROUTER playing coordinator on a free loopback port.
struct FakeCoordinator {
  void* ctx = zmq_ctx_new();
  void* router = zmq_socket(ctx, ZMQ_ROUTER);
  std::string endpoint;
  FakeCoordinator() {
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof(linger));
    EXPECT_EQ(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t len = sizeof(ep);
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len);
    endpoint = ep;
  }
  ~FakeCoordinator() {
    zmq_close(router);
    zmq_ctx_term(ctx);
  }
};

TEST(Coordinator, JoinPlanReadyBarrierMetricsSetCodecShutdown) {
  std::atomic<int> joins{0}, metrics{0};
  std::atomic<bool> all_ready{false};
  CoordinatorHooks hooks;
  hooks.on_join = [&](const WorkerInfo&) { ++joins; };
  hooks.on_metrics = [&](const StepMetrics& m) { metrics += m.step == 7 ? 1 : 0; };
  hooks.on_all_ready = [&] { all_ready = true; };
  hooks.make_plans = [](const std::vector<WorkerInfo>& ws) -> Result<std::vector<Plan>> {
    std::vector<Plan> plans;
    for (size_t i = 0; i < ws.size(); ++i) {  // reverse join order, to see ranks come from the hook
      Plan p;
      p.rank = int(ws.size() - 1 - i);
      p.world_size = int(ws.size());
      p.pp = int(ws.size());
      p.stage = p.rank;
      p.config = R"({"steps": 3})";
      p.codecs = {{0, 1, "fwd", "int8"}};
      plans.push_back(p);
    }
    return plans;
  };
  auto c = Coordinator::start(opts(3), hooks);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Coordinator& coord = **c;
  EXPECT_NE(coord.endpoint().find("tcp://127.0.0.1:"), std::string::npos);

  std::vector<std::unique_ptr<ControlClient>> cs;
  for (int i = 0; i < 3; ++i) cs.push_back(client(coord.endpoint()));
  std::vector<Plan> plans(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&, i] {
      auto p = cs[i]->join(fake_address(i), 10s);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      plans[i] = *p;
      ASSERT_TRUE(cs[i]->ready(10s).ok());
      ASSERT_TRUE(cs[i]->barrier(5, 10s).ok());
      cs[i]->send_metrics(7, R"({"loss": 2.0})");
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(joins, 3);
  EXPECT_TRUE(all_ready);
  std::set<int> ranks;
  for (auto& p : plans) {
    ranks.insert(p.rank);
    EXPECT_EQ(p.world_size, 3);
    EXPECT_EQ(p.config, R"({"steps": 3})");
    ASSERT_EQ(p.peers.size(), 3u);  // filled in by the coordinator, indexed by rank
    for (int r = 0; r < 3; ++r) EXPECT_EQ(p.peers[r].rank, r);
    EXPECT_EQ(p.heartbeat_interval_ms, 50);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  // Each worker finds its own address under its own rank, whatever order the joins raced in.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(plans[i].peers[plans[i].rank].ucx_address, fake_address(i));
  for (auto& w : coord.workers()) EXPECT_EQ(w.rank, 2 - w.join_order);

  for (int i = 0; i < 50 && metrics < 3; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(metrics, 3);
  // Heartbeats keep everyone alive well past the timeout.
  std::this_thread::sleep_for(900ms);
  for (auto& w : coord.workers()) EXPECT_EQ(w.state, WorkerInfo::State::kReady);

  coord.broadcast(SetCodec{0, 1, "fwd", "int4", 10});
  for (auto& cl : cs) {
    auto ev = cl->wait_event(5s);
    ASSERT_TRUE(ev.has_value());
    auto* sc = std::get_if<SetCodec>(&*ev);
    ASSERT_NE(sc, nullptr);
    EXPECT_EQ(sc->spec, "int4");
    EXPECT_EQ(sc->apply_at_step, 10);
  }
  coord.shutdown("test over");
  for (auto& cl : cs) {
    auto ev = cl->wait_event(5s);
    ASSERT_TRUE(ev.has_value());
    ASSERT_TRUE(std::holds_alternative<Shutdown>(*ev));
    EXPECT_EQ(std::get<Shutdown>(*ev).reason, "test over");
    EXPECT_TRUE(cl->shutdown_requested());
  }
  EXPECT_TRUE(coord.wait_done(1s));
  EXPECT_EQ(coord.rejected(), 0u);
}

TEST(Coordinator, WrongTokenIsRejectedAndOthersStillJoin) {
  auto c = Coordinator::start(opts(1));
  ASSERT_TRUE(c.ok());
  auto bad = client((*c)->endpoint(), "guess");
  auto r = bad->join(fake_address(0), 5s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("wrong join token"), std::string::npos) << r.status().to_string();
  auto good = client((*c)->endpoint());
  auto p = good->join(fake_address(1), 5s);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->rank, 0);
  EXPECT_EQ((*c)->rejected(), 1u);
  // The job is now full and planned: a late joiner is refused too.
  auto late = client((*c)->endpoint());
  EXPECT_FALSE(late->join(fake_address(2), 5s).ok());
}

TEST(Coordinator, GarbageAndProtocolErrorsAreRejectedWhileServing) {
  auto c = Coordinator::start(opts(1));
  ASSERT_TRUE(c.ok());
  const std::string ep = (*c)->endpoint();
  RawDealer raw(ep);
  raw.send({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}});
  EXPECT_NE(raw.reject_reason().find("magic"), std::string::npos);
  auto wrong_version = encode_message(Join{"secret", "h", "cpu", 1, {1}});
  wrong_version[4] = 7;
  raw.send({wrong_version});
  EXPECT_NE(raw.reject_reason().find("protocol version 7, expected 9"), std::string::npos);
  auto unknown = encode_message(Heartbeat{1, -1, {}});
  unknown[6] = 200;
  raw.send({unknown});
  EXPECT_NE(raw.reject_reason().find("unknown message type 200"), std::string::npos);
  raw.send({encode_message(Heartbeat{1, -1, {}}), encode_message(Heartbeat{2, -1, {}})});
  EXPECT_NE(raw.reject_reason().find("one frame"), std::string::npos);
  raw.send({encode_message(Ready{0})});
  EXPECT_NE(raw.reject_reason().find("not joined"), std::string::npos);
  // A type no worker sends is refused from its header, its body never decoded (here: invalid fields).
  raw.send({encode_message(Plan{})});
  EXPECT_NE(raw.reject_reason().find("Plan is not a message a worker sends"), std::string::npos);
  raw.send({{}});
  EXPECT_NE(raw.reject_reason().find("shorter than"), std::string::npos);

  // Bytes that are not even ZMTP, straight onto the TCP port.
  int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string junk(4096, '\xff');
  ASSERT_GT(write(fd, junk.data(), junk.size()), 0);
  close(fd);

  EXPECT_EQ((*c)->rejected(), 7u);
  auto good = client(ep);
  auto p = good->join(fake_address(0), 5s);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(good->ready(5s).ok());
}

TEST(Coordinator, SilentWorkerIsDeclaredDeadAndOthersAreTold) {
  std::atomic<int> lost_rank{-1};
  CoordinatorHooks hooks;
  hooks.on_worker_lost = [&](const WorkerInfo& w, const std::string&) { lost_rank = w.rank; };
  auto c = Coordinator::start(opts(3), hooks);
  ASSERT_TRUE(c.ok());
  std::vector<std::unique_ptr<ControlClient>> cs;
  for (int i = 0; i < 3; ++i) cs.push_back(client((*c)->endpoint()));
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&, i] {
      ASSERT_TRUE(cs[i]->join(fake_address(i), 10s).ok());
      ASSERT_TRUE(cs[i]->ready(10s).ok());
    });
  for (auto& t : ts) t.join();
  int victim = cs[1]->plan()->rank;
  auto silent_since = std::chrono::steady_clock::now();
  cs[1]->stop_heartbeats_for_test();
  for (int i : {0, 2}) {
    auto ev = cs[i]->wait_event(5s);
    ASSERT_TRUE(ev.has_value());
    auto* lost = std::get_if<PeerLost>(&*ev);
    ASSERT_NE(lost, nullptr);
    EXPECT_EQ(lost->rank, victim);
    EXPECT_NE(lost->reason.find("no message for"), std::string::npos);
  }
  // Timeout 600 ms; generous slack for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - silent_since, 4s);
  EXPECT_EQ(lost_rank, victim);
  for (auto& w : (*c)->workers()) EXPECT_EQ(w.state == WorkerInfo::State::kDead, w.rank == victim);
  // Barriers now complete among the survivors.
  std::thread t0([&] { EXPECT_TRUE(cs[0]->barrier(3, 5s).ok()); });
  EXPECT_TRUE(cs[2]->barrier(3, 5s).ok());
  t0.join();
}

// Two clients of a two-worker job: both join and pass the start barrier.
void start_two(ControlClient& a, ControlClient& b) {
  std::thread ta([&] {
    ASSERT_TRUE(a.join(fake_address(0), 5s).ok());
    ASSERT_TRUE(a.ready(5s).ok());
  });
  ASSERT_TRUE(b.join(fake_address(1), 5s).ok());
  ASSERT_TRUE(b.ready(5s).ok());
  ta.join();
}

// A worker's pre-flight found a peer it cannot reach: the job does not start, and the coordinator ends it at once
// with a reason naming both ranks, their hosts and the error; the pre-flight is in the status.
TEST(Coordinator, APreflightThatCannotReachAPeerEndsTheJobNamingThePair) {
  std::string why;
  CoordinatorHooks hooks;
  hooks.on_unreachable = [&](const std::string& w) { why = w; };
  hooks.link_name = [](int src, int dst) { return std::to_string(src) + "-" + std::to_string(dst) + ":fwd"; };
  auto c = Coordinator::start(opts(2), hooks);
  ASSERT_TRUE(c.ok());
  auto a = client((*c)->endpoint()), b = client((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(start_two(*a, *b));
  const int ra = a->plan()->rank, rb = b->plan()->rank;
  PeerProbe good{rb, true, "", 0.5f, 800.f, 4096};
  PeerProbe bad{ra, false, "waiting for rank " + std::to_string(ra) + ": no answer within 10000 ms", 0, 0, 0};
  std::thread tr([&] { EXPECT_FALSE(a->preflight({good}, 1s).ok()); });
  EXPECT_FALSE(b->preflight({bad}, 1s).ok());  // the pre-flight barrier is never released
  tr.join();
  EXPECT_NE(why.find("pre-flight: rank " + std::to_string(rb) + " ('test-host') cannot reach rank " +
                     std::to_string(ra) + " ('test-host'"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("no answer within 10000 ms"), std::string::npos) << why;
  EXPECT_NE(why.find("(link " + std::to_string(rb) + "-" + std::to_string(ra) + ":fwd)"), std::string::npos) << why;
  const auto pf = (*c)->status_json()["preflight"];
  ASSERT_EQ(pf.size(), 2u);
  for (const auto& e : pf) EXPECT_EQ(e["ok"].get<bool>(), e["src"].get<int>() == ra) << e.dump();
}

// Every worker's pre-flight in: the barrier opens and the matrix is in the status.
TEST(Coordinator, APreflightOfReachablePairsOpensItsBarrier) {
  auto c = Coordinator::start(opts(2));
  ASSERT_TRUE(c.ok());
  auto a = client((*c)->endpoint()), b = client((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(start_two(*a, *b));
  const int ra = a->plan()->rank, rb = b->plan()->rank;
  std::thread ta([&] { EXPECT_TRUE(a->preflight({PeerProbe{rb, true, "", 0.4f, 900.f, 4096}}, 5s).ok()); });
  EXPECT_TRUE(b->preflight({PeerProbe{ra, true, "", 0.4f, 850.f, 4096}}, 5s).ok());
  ta.join();
  const auto pf = (*c)->preflight_json();
  ASSERT_EQ(pf.size(), 2u);
  for (const auto& e : pf) EXPECT_TRUE(e["ok"].get<bool>());
  EXPECT_FALSE((*c)->done());
}

// Without the hook the coordinator shuts the job down itself, with the same reason.
TEST(Coordinator, AnUnreachablePeerShutsTheJobDownByDefault) {
  auto c = Coordinator::start(opts(1));
  ASSERT_TRUE(c.ok());
  auto a = client((*c)->endpoint());
  ASSERT_TRUE(a->join(fake_address(0), 5s).ok());
  ASSERT_TRUE(a->ready(5s).ok());
  Status s = a->preflight({PeerProbe{3, false, "sending to rank 3: connection refused", 0, 0, 0}}, 5s);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("the job ended at its pre-flight: pre-flight: rank 0 ('test-host') cannot reach rank 3"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE((*c)->wait_done(5s));
}

// The pre-flight's first phase: a pair is direct only when each end heard the other. One end that did not makes the
// pair relayed: every worker gets the relayed pairs and the relay's port; the measured matrix then marks the pair.
TEST(Coordinator, APairThatCannotConnectDirectlyIsRelayed) {
  auto c = Coordinator::start(opts(2));
  ASSERT_TRUE(c.ok());
  ASSERT_NE((*c)->relay(), nullptr);
  EXPECT_FALSE((*c)->relay_endpoint().empty());
  auto a = client((*c)->endpoint()), b = client((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(start_two(*a, *b));
  const int ra = a->plan()->rank, rb = b->plan()->rank;
  Result<Relays> got_a = internal_error("not run");
  std::thread ta([&] { got_a = a->reach({PeerProbe{rb, true, "", 0, 0, 0}}, 5s); });
  auto got_b = b->reach({PeerProbe{ra, false, "no hello from rank " + std::to_string(ra) + " within 5000 ms", 0, 0, 0}},
                        5s);
  ta.join();
  ASSERT_TRUE(got_a.ok()) << got_a.status().to_string();
  ASSERT_TRUE(got_b.ok()) << got_b.status().to_string();
  for (const Relays* r : {&*got_a, &*got_b}) {
    ASSERT_EQ(r->lo, std::vector<int32_t>{0});
    ASSERT_EQ(r->hi, std::vector<int32_t>{1});
    EXPECT_EQ(int(r->port), int((*c)->relay()->port()));
  }
  std::thread tb([&] { EXPECT_TRUE(a->barrier(kRelayBarrier, 5s).ok()); });
  EXPECT_TRUE(b->barrier(kRelayBarrier, 5s).ok());
  tb.join();
  PeerProbe pa{rb, true, "", 30.f, 20.f, 4096}, pb{ra, true, "", 30.f, 19.f, 4096};
  pa.relayed = pb.relayed = true;
  std::thread tm([&] { EXPECT_TRUE(a->preflight({pa}, 5s).ok()); });
  EXPECT_TRUE(b->preflight({pb}, 5s).ok());
  tm.join();
  for (const auto& e : (*c)->preflight_json()) EXPECT_TRUE(e["relayed"].get<bool>()) << e.dump();
  EXPECT_FALSE((*c)->done());
}

// Every pair direct: the answer lists no pair.
TEST(Coordinator, PairsThatHeardEachOtherStayDirect) {
  auto c = Coordinator::start(opts(2));
  ASSERT_TRUE(c.ok());
  auto a = client((*c)->endpoint()), b = client((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(start_two(*a, *b));
  Result<Relays> got_a = internal_error("not run");
  std::thread ta([&] { got_a = a->reach({PeerProbe{b->plan()->rank, true, "", 0, 0, 0}}, 5s); });
  auto got_b = b->reach({PeerProbe{a->plan()->rank, true, "", 0, 0, 0}}, 5s);
  ta.join();
  ASSERT_TRUE(got_a.ok() && got_b.ok());
  EXPECT_TRUE(got_a->lo.empty());
  EXPECT_TRUE(got_b->lo.empty());
}

// Relays off (--no-relay): such a pair ends the job at once, naming the link, both ranks and hosts, and what each end
// saw.
TEST(Coordinator, WithoutARelayAPairThatCannotConnectEndsTheJobNamed) {
  CoordinatorOptions o = opts(2);
  o.relay = false;
  CoordinatorHooks hooks;
  hooks.link_name = [](int src, int dst) { return std::to_string(src) + "-" + std::to_string(dst) + ":fwd"; };
  auto c = Coordinator::start(o, hooks);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->relay(), nullptr);
  auto a = client((*c)->endpoint()), b = client((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(start_two(*a, *b));
  Result<Relays> got_a = internal_error("not run");
  std::thread ta([&] { got_a = a->reach({PeerProbe{1 - a->plan()->rank, false, "no hello from rank x", 0, 0, 0}}, 5s); });
  auto got_b = b->reach({PeerProbe{1 - b->plan()->rank, false, "no hello from rank y", 0, 0, 0}}, 5s);
  ta.join();
  ASSERT_FALSE(got_b.ok());
  ASSERT_FALSE(got_a.ok());
  const std::string why = got_b.status().message();
  EXPECT_NE(why.find("pre-flight: link 0-1 cannot connect directly, and relays are off (--no-relay)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("link 0-1 (rank 0 'test-host', rank 1 'test-host')"), std::string::npos) << why;
  EXPECT_NE(why.find("no hello from rank x"), std::string::npos) << why;
  EXPECT_NE(why.find("no hello from rank y"), std::string::npos) << why;
  EXPECT_TRUE((*c)->wait_done(5s));
}

TEST(Coordinator, LeavingWorkerIsReportedAndJobEnds) {
  auto c = Coordinator::start(opts(2));
  ASSERT_TRUE(c.ok());
  auto a = client((*c)->endpoint()), b = client((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(start_two(*a, *b));
  a->leave("finished");
  auto ev = b->wait_event(5s);
  ASSERT_TRUE(ev.has_value() && std::holds_alternative<PeerLost>(*ev));
  EXPECT_NE(std::get<PeerLost>(*ev).reason.find("finished"), std::string::npos);
  b->leave("finished");
  EXPECT_TRUE((*c)->wait_done(5s));
}

TEST(Coordinator, CtlStatusSetCodecAndRefusals) {
  auto c = Coordinator::start(opts(1));
  ASSERT_TRUE(c.ok());
  auto w = client((*c)->endpoint());
  ASSERT_TRUE(w->join(fake_address(0), 5s).ok());
  ASSERT_TRUE(w->ready(5s).ok());
  auto st = ctl_request((*c)->endpoint(), CtlRequest{"secret", "status", ""}, 5s);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_TRUE(st->ok);
  auto j = nlohmann::json::parse(st->body);
  EXPECT_EQ(j["workers"].size(), 1u);
  EXPECT_EQ(j["workers"][0]["state"], "ready");
  auto sc = ctl_request((*c)->endpoint(),
                        CtlRequest{"secret", "set-codec", R"({"src":0,"dst":1,"dir":"bwd","spec":"int2"})"}, 5s);
  ASSERT_TRUE(sc.ok() && sc->ok) << (sc.ok() ? sc->body : sc.status().to_string());
  auto ev = w->wait_event(5s);
  ASSERT_TRUE(ev.has_value() && std::holds_alternative<SetCodec>(*ev));
  EXPECT_EQ(std::get<SetCodec>(*ev).dir, "bwd");
  auto bad_args = ctl_request((*c)->endpoint(), CtlRequest{"secret", "set-codec", "{not json"}, 5s);
  ASSERT_TRUE(bad_args.ok());
  EXPECT_FALSE(bad_args->ok);
  auto unknown = ctl_request((*c)->endpoint(), CtlRequest{"secret", "reboot", ""}, 5s);
  ASSERT_TRUE(unknown.ok());
  EXPECT_FALSE(unknown->ok);
  EXPECT_NE(unknown->body.find("unknown ctl command"), std::string::npos);
  auto bad_token = ctl_request((*c)->endpoint(), CtlRequest{"nope", "status", ""}, 5s);
  EXPECT_FALSE(bad_token.ok());
  // JSON of the wrong types or out of range is refused by name, and the coordinator goes on serving.
  for (const char* args : {R"({"src":"0","dst":1,"dir":"bwd","spec":"int8"})", R"({"src":1e999})"}) {
    auto wrong = ctl_request((*c)->endpoint(), CtlRequest{"secret", "set-codec", args}, 5s);
    ASSERT_TRUE(wrong.ok()) << args;
    EXPECT_FALSE(wrong->ok) << args;
  }
  auto again = ctl_request((*c)->endpoint(), CtlRequest{"secret", "status", ""}, 5s);
  ASSERT_TRUE(again.ok() && again->ok);
}

// A worker that speaks the protocol by hand, numbering its messages itself.
struct RawWorker : RawDealer {
  using RawDealer::RawDealer;
  uint32_t seq = 0;
  void send_numbered(const ControlMessage& m, uint32_t number) { send({encode_message(m, number)}); }
  void send_next(const ControlMessage& m) { send_numbered(m, seq++); }
  // Joins with `address` as a new worker, says Ready and waits for the start (a one-worker job).
  void join_and_start(const std::vector<uint8_t>& address) {
    send_next(Join{"secret", "raw", "cpu", 1, address, -1});
    ASSERT_TRUE(next<Plan>().has_value());
    send_next(Ready{0});
    ASSERT_TRUE(next<Barrier>().has_value());
  }
  // The first message of type T (skipping heartbeats and others), or nullopt.
  template <class T>
  std::optional<T> next(int timeout_ms = 3000) {
    for (int i = 0; i < 200; ++i) {
      auto r = reply(timeout_ms);
      if (!r) return std::nullopt;
      if (auto* t = std::get_if<T>(&*r)) return *t;
    }
    return std::nullopt;
  }
};

// Messages lost on the way (a reset connection drops what was in flight) show as a gap in the worker's numbering:
// the job rolls back (with a replace timeout) or stops naming the loss (without one).
TEST(Coordinator, AGapInAWorkersMessageNumbersRollsTheJobBackOrStopsIt) {
  for (bool replace : {true, false}) {
    SCOPED_TRACE(replace ? "with a replace timeout" : "without");
    CoordinatorOptions o = opts(1);
    o.heartbeat_timeout = 5s;
    if (replace) o.replace_timeout = 30s;
    std::atomic<int> rollbacks{0};
    CoordinatorHooks hooks;
    hooks.on_rollback = [&](int64_t, const std::string&) { ++rollbacks; };
    auto c = Coordinator::start(o, hooks);
    ASSERT_TRUE(c.ok());
    RawWorker w((*c)->endpoint());
    ASSERT_NO_FATAL_FAILURE(w.join_and_start(fake_address(0)));
    w.send_next(StepMetrics{0, 1, "{}"});  // number 2
    // Numbers 3 and 4 never arrive; the heartbeat says the next is 5.
    w.send_numbered(Heartbeat{1, 1, {}}, 5);
    if (replace) {
      auto back = w.next<Rollback>();
      ASSERT_TRUE(back.has_value());
      EXPECT_NE(back->reason.find("2 of its control messages were lost"), std::string::npos) << back->reason;
      EXPECT_EQ((*c)->epoch(), 2);
      EXPECT_EQ(rollbacks.load(), 1);
      // It joins again as itself and gets the next epoch's plan.
      w.seq = 0;
      w.send_next(Join{"secret", "raw", "cpu", 1, fake_address(0), 0});
      auto again = w.next<Plan>();
      ASSERT_TRUE(again.has_value());
      EXPECT_EQ(again->epoch, 2);
    } else {
      auto down = w.next<Shutdown>();
      ASSERT_TRUE(down.has_value());
      EXPECT_NE(down->reason.find("were lost"), std::string::npos) << down->reason;
      EXPECT_TRUE((*c)->done());
    }
  }
}

// A worker's CodecApplied reaches the hook (ctl set-codec waits for them); one naming another rank, or from a
// stranger, is refused.
// A worker's Preempt (it was sent SIGTERM) reaches the hook once it has a plan, its words made printable; before its
// plan it is refused, naming why.
TEST(Coordinator, APreemptReachesTheHookOnlyFromAPlannedWorker) {
  std::mutex mu;
  std::vector<std::pair<int, std::string>> seen;
  CoordinatorHooks hooks;
  hooks.on_preempt = [&](const WorkerInfo& w, const Preempt& p) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(w.rank, p.reason);
  };
  auto c = Coordinator::start(opts(1), hooks);
  ASSERT_TRUE(c.ok());
  RawWorker w((*c)->endpoint());
  w.send_next(Join{"secret", "raw", "cpu", 1, fake_address(0), -1});
  // A second worker's socket that joined nothing may not preempt anyone.
  RawWorker stranger((*c)->endpoint());
  stranger.send_next(Preempt{-1, "SIGTERM"});
  EXPECT_NE(stranger.reject_reason().find("not joined"), std::string::npos);
  ASSERT_TRUE(w.next<Plan>().has_value());
  w.send_next(Ready{0});
  ASSERT_TRUE(w.next<Barrier>().has_value());
  w.send_next(Preempt{-1, "this worker was sent SIGTERM\x1b[2J"});
  for (int i = 0; i < 300; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!seen.empty()) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, 0);
  EXPECT_EQ(seen[0].second, "this worker was sent SIGTERM?[2J");
}

// Workers naming sites take the ranks site by site: sites by the lowest rank their workers ask for, then by name; in
// a site by the rank asked for. Two allocations whose launchers both count from 0 end up with consecutive ranks each.
TEST(Coordinator, WorkersNamingSitesTakeConsecutiveRanksSiteBySite) {
  auto c = Coordinator::start(opts(5));
  ASSERT_TRUE(c.ok());
  struct Member {
    std::string site;
    int asks;
    int gets;
  };
  // Join order: b0, a1, b1, a0, c (asks for none: its site sorts last).
  const std::vector<Member> members = {{"b", 0, 2}, {"a", 1, 1}, {"b", 1, 3}, {"a", 0, 0}, {"c", -1, 4}};
  std::vector<std::unique_ptr<RawWorker>> ws;
  for (size_t i = 0; i < members.size(); ++i) {
    ws.push_back(std::make_unique<RawWorker>((*c)->endpoint()));
    Join j{"secret", "raw" + std::to_string(i), "cpu", 1, fake_address(int(i)), members[i].asks};
    j.site = members[i].site;
    ws.back()->send_next(j);
    std::this_thread::sleep_for(20ms);
  }
  for (size_t i = 0; i < members.size(); ++i) {
    auto plan = ws[i]->next<Plan>();
    ASSERT_TRUE(plan.has_value()) << i;
    EXPECT_EQ(plan->rank, members[i].gets) << members[i].site << " asking for " << members[i].asks;
  }
  auto st = (*c)->status_json();
  ASSERT_TRUE(st["workers"].is_array());
  for (const auto& w : st["workers"])
    EXPECT_EQ(w["site"], members[size_t(std::stoi(w["hostname"].get<std::string>().substr(3)))].site) << w.dump();
}

TEST(Coordinator, CodecAcknowledgementsReachTheHookFromTheirOwnRankOnly) {
  std::vector<CodecApplied> acks;
  std::mutex mu;
  CoordinatorHooks hooks;
  hooks.on_codec_applied = [&](const CodecApplied& a) {
    std::lock_guard<std::mutex> lock(mu);
    acks.push_back(a);
  };
  CoordinatorOptions o = opts(1);
  o.heartbeat_timeout = 5s;
  auto c = Coordinator::start(o, hooks);
  ASSERT_TRUE(c.ok());
  RawWorker w((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(w.join_and_start(fake_address(0)));
  w.send_next(CodecApplied{0, 7, 12, true, ""});
  w.send_next(CodecApplied{3, 7, 12, true, ""});
  EXPECT_NE(w.reject_reason().find("CodecApplied for rank 3 from rank 0"), std::string::npos);
  RawDealer stranger((*c)->endpoint());
  stranger.send({encode_message(CodecApplied{0, 7, 12, true, ""})});
  EXPECT_NE(stranger.reject_reason().find("from a sender that has not joined"), std::string::npos);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].id, 7u);
  EXPECT_EQ(acks[0].from_step, 12);
}

// A member holds the secret but not the job's trust: its heartbeats' pending lists are bounded by the job (two per
// rank, ranks of the job, each peer and way once), it may hold at most a few barriers open, and a rank "waiting on
// itself" is no deadlock (it would force a rollback).
TEST(Coordinator, AMembersHeartbeatsAndBarriersAreBoundedAndASelfWaitIsNoDeadlock) {
  CoordinatorOptions o = opts(2);
  o.heartbeat_timeout = 5s;
  o.stall_timeout = 200ms;
  std::atomic<int> rollbacks{0};
  CoordinatorHooks hooks;
  hooks.on_rollback = [&](int64_t, const std::string&) { ++rollbacks; };
  auto c = Coordinator::start(o, hooks);
  ASSERT_TRUE(c.ok());
  RawWorker w((*c)->endpoint()), other((*c)->endpoint());
  w.send_next(Join{"secret", "raw", "cpu", 1, fake_address(0), -1});
  other.send_next(Join{"secret", "raw", "cpu", 1, fake_address(1), -1});
  auto plan = w.next<Plan>(), other_plan = other.next<Plan>();
  ASSERT_TRUE(plan.has_value() && other_plan.has_value());
  const int me = plan->rank;
  w.send_next(Ready{me});
  other.send_next(Ready{other_plan->rank});
  ASSERT_TRUE(w.next<Barrier>().has_value());
  // Heartbeats carry the number of the sender's next message; they take none themselves.
  const PendingLink wait_me{me, false, 60000, 60000}, send_me{me, true, 60000, 60000};
  const PendingLink wait_other{other_plan->rank, false, 1, 1}, send_other{other_plan->rank, true, 1, 1};
  // Five entries for a two-worker job (at most four), a rank outside it, a peer and way twice.
  w.send_numbered(Heartbeat{1, 1, {wait_me, send_me, wait_other, send_other, PendingLink{me, false, 2, 2}}, 0, 60000}, w.seq);
  EXPECT_NE(w.reject_reason().find("lists 5 pending links; a job of 2 workers has at most 4"), std::string::npos);
  w.send_numbered(Heartbeat{1, 1, {PendingLink{7, false, 1, 1}}, 0, 60000}, w.seq);
  EXPECT_NE(w.reject_reason().find("a pending link with rank 7"), std::string::npos);
  w.send_numbered(Heartbeat{1, 1, {wait_other, wait_other}, 0, 60000}, w.seq);
  EXPECT_NE(w.reject_reason().find("(receive) twice"), std::string::npos);
  EXPECT_EQ((*c)->rejected(), 3u);
  // Blocked for a minute waiting on itself, nothing on its way: before, a one-rank "cycle" rolled the job back.
  w.send_numbered(Heartbeat{1, 1, {wait_me}, 0, 60000}, w.seq);
  for (int i = 0; i < 12; ++i) {  // several ticks past the stall timeout; the other worker's heartbeats keep it in
    other.send_numbered(Heartbeat{1, 1, {}, 0, 0}, other.seq);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(rollbacks.load(), 0);
  EXPECT_EQ((*c)->epoch(), 1);
  EXPECT_FALSE((*c)->done());
  EXPECT_EQ((*c)->rejected(), 3u);
  // Barriers the other rank never reaches stay open: a member may wait at kMaxOpenBarriersPerMember at once, and
  // one more is refused, named. Its own earlier ids still count it in.
  for (uint64_t id = 100; id < 100 + Coordinator::kMaxOpenBarriersPerMember; ++id) w.send_next(Barrier{id});
  w.send_next(Barrier{999});
  EXPECT_NE(w.reject_reason().find("Barrier 999 from rank " + std::to_string(me) +
                                   ", which already waits at 8 open barriers (at most 8)"),
            std::string::npos);
  w.send_next(Barrier{100});  // an id it already waits at is no new one
  other.send_next(Barrier{100});
  ASSERT_TRUE(other.next<Barrier>().has_value());
  EXPECT_EQ((*c)->rejected(), 4u);
}

// A shard goes up in parts paced by the coordinator's acknowledgements (so heartbeats pass it on a slow link); the
// coordinator hands the hook the whole shard once, and a barrier waits until the shards sent before it arrived.
TEST(ControlClient, AShardGoesInPartsAndArrivesWholeBeforeTheNextBarrier) {
  std::mutex mu;
  std::vector<ShardSaved> shards;
  CoordinatorHooks hooks;
  hooks.on_shard = [&](const ShardSaved& sh) {
    std::lock_guard<std::mutex> lock(mu);
    shards.push_back(sh);
  };
  auto c = Coordinator::start(opts(1), hooks);
  ASSERT_TRUE(c.ok());
  auto cl = client((*c)->endpoint());
  ASSERT_TRUE(cl->join(fake_address(0), 10s).ok());
  ASSERT_TRUE(cl->ready(10s).ok());
  std::vector<uint8_t> big(3 * 1024 * 1024 + 17), small(100, 9);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 2654435761u >> 13);
  cl->send_shard(4, big);
  cl->send_shard(8, small);
  Status b = cl->barrier(5, 30s);
  ASSERT_TRUE(b.ok()) << b.to_string();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].step, 4);
  EXPECT_EQ(shards[0].rank, 0);
  EXPECT_TRUE(shards[0].bytes == big);
  EXPECT_EQ(shards[1].step, 8);
  EXPECT_TRUE(shards[1].bytes == small);
  EXPECT_EQ((*c)->rejected(), 0u);
}

// A shard the coordinator refuses (here: sent before the worker is ready) is dropped by the worker, so the next
// barrier does not wait for acknowledgements that will never come.
TEST(ControlClient, ARefusedShardIsDroppedAndTheBarrierDoesNotWaitForIt) {
  auto c = Coordinator::start(opts(1));
  ASSERT_TRUE(c.ok());
  auto cl = client((*c)->endpoint());
  ASSERT_TRUE(cl->join(fake_address(0), 10s).ok());
  cl->send_shard(3, std::vector<uint8_t>(1000, 5));
  auto ev = cl->wait_event(5s);
  ASSERT_TRUE(ev.has_value());
  auto* rej = std::get_if<Reject>(&*ev);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->about, uint16_t(MsgType::kShardSaved));
  EXPECT_NE(rej->reason.find("ShardSaved for rank 0 from rank 0 in state planned"), std::string::npos) << rej->reason;
  ASSERT_TRUE(cl->ready(10s).ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status b = cl->barrier(5, 20s);
  EXPECT_TRUE(b.ok()) << b.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// Parts out of order are refused, named, and drop the unfinished shard; each part is acknowledged with the bytes
// received so far. A worker that cannot load its plan's checkpoint says so once an epoch, for its plan's step only:
// the hook sets it aside and the job rolls back (or, when the hook cannot, ends naming why).
TEST(Coordinator, ShardPartsInOrderAreAcknowledgedAndAResumeFailureRollsBack) {
  std::mutex mu;
  std::vector<ShardSaved> shards;
  std::vector<ResumeFailed> failures;
  std::atomic<int> rollbacks{0};
  bool set_aside = true;
  CoordinatorHooks hooks;
  hooks.on_shard = [&](const ShardSaved& sh) {
    std::lock_guard<std::mutex> lock(mu);
    shards.push_back(sh);
  };
  hooks.on_resume_failed = [&](const ResumeFailed& rf) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(rf);
    return set_aside;
  };
  hooks.on_rollback = [&](int64_t, const std::string&) { ++rollbacks; };
  hooks.make_plans = [](const std::vector<WorkerInfo>& ws) -> Result<std::vector<Plan>> {
    std::vector<Plan> plans(ws.size());
    for (size_t i = 0; i < ws.size(); ++i) {
      plans[i].rank = int(i);
      plans[i].world_size = int(ws.size());
      plans[i].resume_step = 6;
      plans[i].shard = {1, 2, 3};
    }
    return plans;
  };
  CoordinatorOptions o = opts(1);
  o.heartbeat_timeout = 5s;
  o.replace_timeout = 30s;
  auto c = Coordinator::start(o, hooks);
  ASSERT_TRUE(c.ok());
  RawWorker w((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(w.join_and_start(fake_address(0)));
  w.send_next(ShardSaved{0, 10, std::vector<uint8_t>(100, 1), 0, 250});
  auto ack = w.next<ShardAck>();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->step, 10);
  EXPECT_EQ(ack->received, 100u);
  w.send_next(ShardSaved{0, 10, std::vector<uint8_t>(100, 2), 150, 250});  // skips bytes 100..149
  EXPECT_NE(w.reject_reason().find("a checkpoint shard part of step 10 at byte 150 from rank 0, which has sent 100 "
                                   "bytes of step 10"),
            std::string::npos);
  w.send_next(ShardSaved{0, 12, std::vector<uint8_t>(100, 3), 0, 150});
  w.send_next(ShardSaved{0, 12, std::vector<uint8_t>(50, 4), 100, 150});
  ack = w.next<ShardAck>();
  ASSERT_TRUE(ack.has_value());
  ack = w.next<ShardAck>();
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->received, 150u);
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!shards.empty()) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(shards.size(), 1u);
    EXPECT_EQ(shards[0].step, 12);
    ASSERT_EQ(shards[0].bytes.size(), 150u);
    EXPECT_EQ(shards[0].bytes[99], 3);
    EXPECT_EQ(shards[0].bytes[100], 4);
  }
  // Resume failures: another step than the plan's is refused; the plan's is taken once and rolls the job back.
  w.send_next(ResumeFailed{0, 4, "bad"});
  EXPECT_NE(w.reject_reason().find("ResumeFailed for rank 0 from rank 0 in state ready for step 4 (its plan resumes "
                                   "after step 6)"),
            std::string::npos);
  // Its words reach logs and the other workers with control characters (a forged log line, a terminal escape) made
  // harmless.
  w.send_next(ResumeFailed{0, 6, "the shard does not\nparse\x1b[2J"});
  auto back = w.next<Rollback>();
  ASSERT_TRUE(back.has_value());
  EXPECT_NE(back->reason.find("rank 0 ('raw') cannot load its shard of the checkpoint of step 6: the shard does not?"
                              "parse?[2J; the job goes back to an older checkpoint"),
            std::string::npos)
      << back->reason;
  EXPECT_EQ(rollbacks.load(), 1);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].reason, "the shard does not?parse?[2J");
}

// A worker of the running epoch that joins again as itself (it noticed lost messages and left its epoch) rolls the
// job back and is planned again at once; it gets no Rollback of its own.
TEST(Coordinator, ARunningWorkerJoiningAgainAsItselfRollsTheJobBack) {
  CoordinatorOptions o = opts(1);
  o.heartbeat_timeout = 5s;
  o.replace_timeout = 30s;
  auto c = Coordinator::start(o);
  ASSERT_TRUE(c.ok());
  RawWorker w((*c)->endpoint());
  ASSERT_NO_FATAL_FAILURE(w.join_and_start(fake_address(0)));
  w.seq = 0;
  w.send_next(Join{"secret", "raw", "cpu", 1, fake_address(1), 0});
  for (int i = 0; i < 200; ++i) {
    auto r = w.reply();
    ASSERT_TRUE(r.has_value()) << "no plan for the next epoch";
    ASSERT_FALSE(std::holds_alternative<Rollback>(*r)) << "the rejoined worker was told to roll back";
    if (auto* p = std::get_if<Plan>(&*r)) {
      EXPECT_EQ(p->epoch, 2);
      EXPECT_EQ(p->peers.at(0).ucx_address, fake_address(1));
      break;
    }
  }
}

// Joins are numbered attempts, so a worker can send one again when a reset connection may have lost it: the same
// attempt again changes nothing; a newer one before the plan replaces the old; a newer one from a planned worker
// (its Plan went missing) rolls the job back and plans it again. The coordinator's heartbeats say which attempt it
// has handled.
TEST(Coordinator, JoinAttemptsRepeatReplaceOrRejoin) {
  CoordinatorOptions o = opts(2);
  o.heartbeat_timeout = 5s;
  o.replace_timeout = 30s;
  auto c = Coordinator::start(o);
  ASSERT_TRUE(c.ok());
  RawWorker w((*c)->endpoint());
  auto join = [&](uint32_t attempt, int address) {
    Join j{"secret", "raw", "cpu", 1, fake_address(address), -1};
    j.attempt = attempt;
    w.seq = 0;
    w.send_next(j);
  };
  auto handled_attempt = [&]() -> int64_t {
    for (int i = 0; i < 50; ++i) {
      auto r = w.reply();
      if (!r) return -1;
      if (auto* rej = std::get_if<Reject>(&*r)) {
        ADD_FAILURE() << "refused: " << rej->reason;
        return -1;
      }
      if (auto* hb = std::get_if<Heartbeat>(&*r)) return hb->join_attempt;
    }
    return -1;
  };
  join(1, 0);
  EXPECT_EQ(handled_attempt(), 1);
  join(1, 0);  // the same join again: no refusal, still one worker
  EXPECT_EQ(handled_attempt(), 1);
  ASSERT_EQ((*c)->workers().size(), 1u);
  join(2, 5);  // a newer attempt before the plan replaces the first
  for (int i = 0; i < 20 && handled_attempt() != 2; ++i) {
  }
  ASSERT_EQ((*c)->workers().size(), 1u);
  EXPECT_EQ((*c)->workers()[0].join.ucx_address, fake_address(5));
  RawWorker other((*c)->endpoint());
  other.send_next(Join{"secret", "raw2", "cpu", 1, fake_address(1), -1});
  auto plan = w.next<Plan>();
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->epoch, 1);
  EXPECT_EQ(plan->peers.at(size_t(plan->rank)).ucx_address, fake_address(5));
  // Its Plan "went missing": a newer attempt that names no rank rolls the job back; it is planned again at once,
  // with its old rank, and is not told to roll back itself.
  const int rank = plan->rank;
  join(3, 6);
  auto back = other.next<Rollback>();
  ASSERT_TRUE(back.has_value());
  EXPECT_NE(back->reason.find("joined again"), std::string::npos) << back->reason;
  other.seq = 0;
  other.send_next(Join{"secret", "raw2", "cpu", 1, fake_address(1), 1 - rank});
  for (int i = 0; i < 200; ++i) {
    auto r = w.reply();
    ASSERT_TRUE(r.has_value()) << "no plan for the next epoch";
    ASSERT_FALSE(std::holds_alternative<Rollback>(*r)) << "the rejoined worker was told to roll back";
    if (auto* p = std::get_if<Plan>(&*r)) {
      EXPECT_EQ(p->epoch, 2);
      EXPECT_EQ(p->rank, rank);
      EXPECT_EQ(p->peers.at(size_t(rank)).ucx_address, fake_address(6));
      break;
    }
  }
}

// The worker's side: a Join that never reached the coordinator (its heartbeats still name an older attempt) is sent
// again, the same attempt; a Join the coordinator handled whose answer went missing (its heartbeat names this
// attempt and a numbered message this worker never got) becomes a new attempt.
TEST(ControlClient, AJoinOrItsAnswerLostOnTheWayIsSentAgain) {
  FakeCoordinator fc;
  void* router = fc.router;
  std::vector<std::pair<uint32_t, uint32_t>> joins;  // attempt, sequence number
  std::thread fake([&] {
    std::string id;
    auto send = [&](const ControlMessage& m, uint32_t seq) {
      auto b = encode_message(m, seq);
      zmq_send(router, id.data(), id.size(), ZMQ_SNDMORE);
      zmq_send(router, b.data(), b.size(), 0);
    };
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline && joins.size() < 3) {
      zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 20) > 0) {
        char buf[256];
        int idlen = zmq_recv(router, buf, sizeof(buf), 0);
        id.assign(buf, size_t(std::max(idlen, 0)));
        std::vector<uint8_t> body(4096);
        int n = zmq_recv(router, body.data(), body.size(), 0);
        body.resize(size_t(std::max(n, 0)));
        auto h = decode_header(body.data(), body.size());
        auto m = decode_message(body);
        if (h.ok() && m.ok())
          if (auto* j = std::get_if<Join>(&*m)) joins.emplace_back(j->attempt, h->seq);
      }
      if (id.empty()) continue;
      Heartbeat hb;
      if (joins.size() == 1) {
        hb.join_attempt = 0;  // the first Join "never arrived"
        send(hb, 0);
      } else if (joins.size() == 2) {
        hb.join_attempt = joins[1].first;  // handled it; its answer (number 0) "went missing"
        send(hb, 1);
      }
    }
    Plan plan;
    plan.rank = 0;
    plan.world_size = 1;
    plan.config = "third";
    send(plan, 0);
  });
  ControlClientOptions o;
  o.coordinator = fc.endpoint;
  o.token = "secret";
  o.heartbeat_interval = 50ms;
  auto c = ControlClient::connect(o);
  ASSERT_TRUE(c.ok());
  auto plan = (*c)->join(fake_address(0), 15s);
  fake.join();
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->config, "third");
  ASSERT_EQ(joins.size(), 3u);
  EXPECT_EQ(joins[0], std::make_pair(1u, 0u));
  EXPECT_EQ(joins[1], std::make_pair(1u, 0u));  // sent again, the same attempt
  EXPECT_EQ(joins[2], std::make_pair(2u, 0u));  // a new attempt
  c->reset();
}

// A key file that group or others may read is refused, naming chmod 600 (a committed or shared secret is no secret);
// 0600 and 0400 (a Kubernetes Secret mounted with defaultMode: 0400) are read. Text that is not a key is stretched
// with Argon2id: the same text gives the same secret, and not the unsalted BLAKE2b of before.
TEST(JobSecret, AKeyFileOthersCanReadIsRefusedAndTextIsStretched) {
  std::string dir = ::testing::TempDir() + "lh_key_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/job.key";
  const JobSecret secret = JobSecret::generate();
  ASSERT_TRUE(secret.save_new(path).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  for (unsigned mode : {0600u, 0400u}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto loaded = JobSecret::load(path, "--key-file");
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    EXPECT_EQ(loaded->join_proof(), secret.join_proof());
  }
  for (unsigned mode : {0644u, 0640u, 0604u, 0620u}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto loaded = JobSecret::load(path, "--key-file");
    ASSERT_FALSE(loaded.ok()) << std::oct << mode;
    char shown[8];
    std::snprintf(shown, sizeof(shown), "%03o", mode);
    EXPECT_NE(loaded.status().message().find("--key-file '" + path +
                                             "': other users of this machine can read or change the job secret (mode " +
                                             shown + "); chmod 600 '" + path + "'"),
              std::string::npos)
        << loaded.status().message();
  }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  {
    std::ofstream big(path, std::ios::app);
    big << std::string(5000, 'x');
  }
  EXPECT_NE(JobSecret::load(path, "--key-file").status().message().find("a key file is one line of 64 hex digits"),
            std::string::npos);
  EXPECT_NE(JobSecret::load(dir, "--key-file").status().message().find("not a regular file"), std::string::npos);
  bool weak = false;
  auto a = JobSecret::parse("correct horse battery", &weak), b = JobSecret::parse("correct horse battery");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(weak);
  EXPECT_EQ(a->to_hex(), b->to_hex());
  EXPECT_NE(a->to_hex(), JobSecret::parse("correct horse batterz")->to_hex());
  uint8_t fast[32];
  const std::string text = "correct horse battery";
  crypto_generichash(fast, sizeof(fast), reinterpret_cast<const uint8_t*>(text.data()), text.size(), nullptr, 0);
  char fast_hex[65];
  sodium_bin2hex(fast_hex, sizeof(fast_hex), fast, sizeof(fast));
  EXPECT_NE(a->to_hex(), std::string(fast_hex)) << "the text's plain hash is not the secret";
  // The secret once committed to the repository (launch_metrics.key) is public: refused, naming it.
  EXPECT_NE(JobSecret::parse("b03fd4eacdce9a6c3d20999f4750a2617d07894793aa0ddc3024964d58167159")
                .status()
                .message()
                .find("this job secret is public: it was committed to longhaul's repository as launch_metrics.key"),
            std::string::npos);
  EXPECT_EQ(secret.relay_rank_key().size(), 32u);
  EXPECT_NE(secret.relay_rank_key(), JobSecret::generate().relay_rank_key());
  std::filesystem::remove_all(dir);
}

// The control plane as the apps run it: CURVE keys derived from the job secret, a ZAP handler admitting the members'
// key only. A client with another job's secret cannot join or send a ctl request (its handshake fails; the
// coordinator counts it), nor can a plain ZeroMQ client; a member joins and is planned.
TEST(Coordinator, OnlyHoldersOfTheJobSecretGetIn) {
  const JobSecret secret = JobSecret::generate(), stranger = JobSecret::generate();
  EXPECT_NE(secret.to_hex(), stranger.to_hex());
  EXPECT_EQ(JobSecret::parse(secret.to_hex())->join_proof(), secret.join_proof());
  bool weak = false;
  EXPECT_NE(JobSecret::parse("an old token", &weak)->join_proof(), secret.join_proof());
  EXPECT_TRUE(weak);
  EXPECT_FALSE(JobSecret::parse("  \n").ok());
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
  CoordinatorOptions o = opts(1);
  o.token = secret.join_proof();
  o.curve = secret.server_curve();
  auto c = Coordinator::start(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto member = [&](const JobSecret& s) {
    ControlClientOptions co;
    co.coordinator = (*c)->endpoint();
    co.token = s.join_proof();
    co.curve = s.client_curve();
    co.hostname = "curve-test";
    co.heartbeat_interval = 50ms;
    return ControlClient::connect(co);
  };
  auto intruder = member(stranger);
  ASSERT_TRUE(intruder.ok());
  auto refused = (*intruder)->join(fake_address(9), 1500ms);
  EXPECT_FALSE(refused.ok());
  EXPECT_GE((*c)->refused_connections(), 1u);
  EXPECT_TRUE((*c)->workers().empty());
  auto ctl =
      ctl_request((*c)->endpoint(), CtlRequest{stranger.join_proof(), "status", ""}, 1500ms, stranger.client_curve());
  EXPECT_FALSE(ctl.ok());
  EXPECT_NE(ctl.status().message().find("--key-file"), std::string::npos) << ctl.status().message();
  // One who learned the coordinator's public key (it is not secret) but not the members' key pair: the ZAP handler
  // turns it away.
  const uint64_t before = (*c)->refused_connections();
  ZmqLoop::Curve half = stranger.client_curve();
  half.server_key = secret.server_curve().public_key;
  EXPECT_FALSE(ctl_request((*c)->endpoint(), CtlRequest{secret.join_proof(), "status", ""}, 1500ms, half).ok());
  EXPECT_GT((*c)->refused_connections(), before);
  RawDealer plain((*c)->endpoint());  // no CURVE at all
  plain.send({encode_message(Join{secret.join_proof(), "plain", "cpu", 1, fake_address(8), -1})});
  EXPECT_FALSE(plain.reply(1000).has_value());
  EXPECT_TRUE((*c)->workers().empty());
  // The member gets in and is planned; ctl with the secret works.
  auto ok = member(secret);
  ASSERT_TRUE(ok.ok());
  auto plan = (*ok)->join(fake_address(0), 5s);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto st = ctl_request((*c)->endpoint(), CtlRequest{secret.join_proof(), "status", ""}, 5s, secret.client_curve());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_TRUE(st->ok) << st->body;
}

TEST(ControlClient, LostCoordinatorBecomesAShutdownEvent) {
  auto c = Coordinator::start(opts(1));
  ASSERT_TRUE(c.ok());
  ControlClientOptions o;
  o.coordinator = (*c)->endpoint();
  o.token = "secret";
  auto w = ControlClient::connect(o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->join(fake_address(0), 5s).ok());  // plan says: timeout 600 ms
  c->reset();                                         // the coordinator vanishes without a word
  auto ev = (*w)->wait_event(5s);
  ASSERT_TRUE(ev.has_value() && std::holds_alternative<Shutdown>(*ev));
  EXPECT_NE(std::get<Shutdown>(*ev).reason.find("coordinator lost"), std::string::npos);
}

TEST(ControlClient, IgnoresGarbageFromAFakeCoordinator) {
  // A bare ROUTER plays coordinator: it answers the Join with garbage, a wrong-version Plan and a
  // two-frame message before the real Plan; the client must skip all three.
  FakeCoordinator fc;
  void* router = fc.router;
  const std::string ep = fc.endpoint;
  std::thread fake([&] {
    zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 5000) <= 0) return;
    char id[256];
    int idlen = zmq_recv(router, id, sizeof(id), 0);
    char body[4096];
    zmq_recv(router, body, sizeof(body), 0);  // the Join
    auto reply = [&](const std::vector<std::vector<uint8_t>>& frames) {
      zmq_send(router, id, size_t(idlen), ZMQ_SNDMORE);
      for (size_t i = 0; i < frames.size(); ++i)
        zmq_send(router, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    };
    Plan bad, good;
    bad.rank = good.rank = 0;
    bad.world_size = good.world_size = 1;
    bad.config = "bad";
    good.config = "good";
    auto wrong_version = encode_message(bad);
    wrong_version[4] = uint8_t(kProtocolVersion + 1);
    reply({{0xde, 0xad, 0xbe, 0xef}});
    reply({wrong_version});
    reply({encode_message(bad), encode_message(bad)});
    reply({encode_message(good)});
  });
  ControlClientOptions o;
  o.coordinator = ep;
  o.token = "secret";
  auto c = ControlClient::connect(o);
  ASSERT_TRUE(c.ok());
  auto plan = (*c)->join(fake_address(0), 5s);
  fake.join();
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->config, "good");
  c->reset();
}

// The worker's side of the numbering: a gap in the coordinator's messages (a lost barrier release, codec change …)
// makes the worker leave its epoch (a Rollback event) so that it joins again; its own messages are numbered from
// its Join on, under one routing id for its whole life.
TEST(ControlClient, AGapInTheCoordinatorsNumbersRollsTheWorkerBack) {
  FakeCoordinator fc;
  void* router = fc.router;
  const std::string ep = fc.endpoint;
  std::string identity;
  uint32_t join_seq = 99;
  std::atomic<bool> go_on{false};
  std::thread fake([&] {
    zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 5000) <= 0) return;
    char id[256];
    int idlen = zmq_recv(router, id, sizeof(id), 0);
    identity.assign(id, size_t(std::max(idlen, 0)));
    std::vector<uint8_t> body(4096);
    int n = zmq_recv(router, body.data(), body.size(), 0);
    if (auto h = decode_header(body.data(), size_t(std::max(n, 0))); h.ok()) join_seq = h->seq;
    auto reply = [&](const ControlMessage& m, uint32_t seq) {
      auto b = encode_message(m, seq);
      zmq_send(router, id, size_t(idlen), ZMQ_SNDMORE);
      zmq_send(router, b.data(), b.size(), 0);
    };
    Plan plan;
    plan.rank = 0;
    plan.world_size = 1;
    plan.heartbeat_interval_ms = 50;
    plan.heartbeat_timeout_ms = 5000;
    reply(plan, 0);
    reply(SetCodec{0, 1, "fwd", "int8", -1}, 1);
    while (!go_on) std::this_thread::sleep_for(5ms);
    reply(Heartbeat{}, 2);  // in step: nothing lost
    reply(Heartbeat{}, 4);  // number 2 and 3 went missing
  });
  ControlClientOptions o;
  o.coordinator = ep;
  o.token = "secret";
  auto c = ControlClient::connect(o);
  ASSERT_TRUE(c.ok());
  auto plan = (*c)->join(fake_address(0), 5s);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto ev = (*c)->wait_event(5s);
  ASSERT_TRUE(ev.has_value() && std::holds_alternative<SetCodec>(*ev));
  go_on = true;
  ev = (*c)->wait_event(5s);
  fake.join();
  ASSERT_TRUE(ev.has_value() && std::holds_alternative<Rollback>(*ev));
  EXPECT_NE(std::get<Rollback>(*ev).reason.find("2 message(s) from the coordinator were lost"), std::string::npos);
  EXPECT_EQ((*c)->lost_messages(), 2u);
  EXPECT_TRUE((*c)->rolled_back());
  EXPECT_EQ(join_seq, 0u);
  EXPECT_EQ(identity.rfind("lh-", 0), 0u) << identity;
  c->reset();
}

TEST(ControlClient, UnreachableCoordinatorTimesOut) {
  ControlClientOptions o;
  o.coordinator = "tcp://127.0.0.1:1";  // nothing listens on port 1
  o.token = "secret";
  auto w = ControlClient::connect(o);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->join(fake_address(0), 300ms).status().code(), StatusCode::kUnavailable);
  o.coordinator = "not-an-endpoint";
  EXPECT_FALSE(ControlClient::connect(o).ok());
}

}  // namespace
}  // namespace lh
