// Multi-process transport tests: a coordinator in the test process and 2 or 4 real worker processes (this
// binary re-executed) that join, get plans, connect UCX endpoints and exchange packets from 0 bytes to 64 MiB
// in shuffled order; and a worker killed with SIGKILL being declared dead and reported to the survivors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <random>

#include "core/log.h"
#include "tests/transport/child_process.h"
#include "transport/control_client.h"
#include "transport/coordinator.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using namespace std::chrono_literals;
using testing::packet_bytes;

std::vector<size_t> sizes_for(int world) {
  if (world == 2) return {0, 1, 3, 100, 4096, 100000, 1 << 20, 16 << 20, 64 << 20};
  return {0, 1, 100, 8192, 300000, 2 << 20};
}

// The worker process. Modes: "exchange" (all-to-all packets), "die" (the plan's last rank kills itself
// after the start barrier; the others must hear about it).
int child_main(const std::string& endpoint, const std::string& token, const std::string& mode) {
  UcxOptions uo;
  uo.tls = std::getenv("LH_TEST_UCX_TLS") ? std::getenv("LH_TEST_UCX_TLS") : "tcp";
  uo.peer_error_handling = std::getenv("LH_TEST_UCX_SHM") == nullptr;
  uo.net_devices = "lo";  // loopback only, whatever interfaces other tests add meanwhile
  auto plane_r = UcxDataPlane::create(uo);
  if (!plane_r.ok()) return (std::fprintf(stderr, "child: %s\n", plane_r.status().to_string().c_str()), 2);
  auto plane = std::move(plane_r).value();
  auto meter = std::make_shared<LinkMeter>();
  plane->set_meter(meter);
  ControlClientOptions co;
  co.coordinator = endpoint;
  co.token = token;
  co.heartbeat_interval = 100ms;
  auto cc_r = ControlClient::connect(co);
  if (!cc_r.ok()) return 3;
  auto cc = std::move(cc_r).value();
  auto plan = cc->join(plane->address(), 30s);
  if (!plan.ok()) return (std::fprintf(stderr, "child: %s\n", plan.status().to_string().c_str()), 4);
  set_log_role("worker " + std::to_string(plan->rank));
  std::map<int, Bytes> peers;
  for (auto& p : plan->peers)
    if (p.rank != plan->rank) peers[p.rank] = p.ucx_address;
  if (Status s = plane->connect(plan->rank, peers); !s.ok())
    return (std::fprintf(stderr, "child: %s\n", s.to_string().c_str()), 5);
  if (!cc->ready(30s).ok()) return 6;
  const int me = plan->rank, world = plan->world_size;

  if (mode == "die") {
    if (me == world - 1) {
      std::this_thread::sleep_for(100ms);
      kill(getpid(), SIGKILL);
    }
    // Survivors: a receive from the victim is pending when it dies; the PeerLost event fails it.
    Transfer pending = plane->recv(world - 1, make_tag(1, 0, Role::kActivation));
    for (int i = 0; i < 100; ++i) {
      auto ev = cc->wait_event(100ms);
      if (!ev) continue;
      if (auto* lost = std::get_if<PeerLost>(&*ev)) {
        if (lost->rank != world - 1) return 7;
        plane->fail_peer(lost->rank, lost->reason);
        Status s = pending.wait(10s);
        if (s.code() != StatusCode::kUnavailable) return 8;
        cc->leave("saw the loss");
        return 0;
      }
    }
    return 9;  // never told
  }

  std::vector<size_t> sizes = sizes_for(world);
  std::mt19937 rng(uint32_t(me) * 77 + 1);
  struct Op {
    int peer, i;
  };
  std::vector<Op> sends, recvs;
  for (int p = 0; p < world; ++p)
    if (p != me)
      for (int i = 0; i < int(sizes.size()); ++i) {
        sends.push_back({p, i});
        recvs.push_back({p, i});
      }
  std::shuffle(sends.begin(), sends.end(), rng);
  std::shuffle(recvs.begin(), recvs.end(), rng);
  std::vector<Transfer> st, rt;
  // Interleave: half the receives before any send, the rest after, so both the expected and the
  // unexpected paths run.
  size_t half = recvs.size() / 2;
  for (size_t k = 0; k < half; ++k)
    rt.push_back(plane->recv(recvs[k].peer, make_tag(recvs[k].i, 0, Role::kActivation)));
  for (auto& o : sends)
    st.push_back(plane->send(o.peer, make_tag(o.i, 0, Role::kActivation), packet_bytes(me, o.peer, o.i, sizes[o.i]),
                             4 * sizes[o.i]));
  for (size_t k = half; k < recvs.size(); ++k)
    rt.push_back(plane->recv(recvs[k].peer, make_tag(recvs[k].i, 0, Role::kActivation)));
  int bad = 0;
  for (size_t k = 0; k < rt.size(); ++k) {
    Status s = rt[k].wait(120s);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: recv %d/%d: %s\n", me, recvs[k].peer, recvs[k].i, s.to_string().c_str());
      ++bad;
      continue;
    }
    if (rt[k].take() != packet_bytes(recvs[k].peer, me, recvs[k].i, sizes[recvs[k].i])) {
      std::fprintf(stderr, "rank %d: packet %d from %d corrupted\n", me, recvs[k].i, recvs[k].peer);
      ++bad;
    }
  }
  for (auto& t : st)
    if (!t.wait(120s).ok()) ++bad;
  meter->set_self_rank(me);
  cc->send_metrics(1, meter->to_json().dump());
  if (!cc->barrier(1, 60s).ok()) ++bad;
  cc->leave(bad ? "failed" : "done");
  return bad ? 10 : 0;
}

struct Job {
  std::unique_ptr<Coordinator> coord;
  std::mutex mu;
  std::map<int, nlohmann::json> metrics;
  std::vector<std::pair<int, std::string>> lost;
  std::vector<pid_t> pids;

  Job(int n, std::chrono::milliseconds hb_timeout, const std::string& mode) {
    CoordinatorOptions o;
    o.token = "tok-" + std::to_string(getpid());
    o.expected_workers = n;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = hb_timeout;
    CoordinatorHooks h;
    h.on_metrics = [this](const StepMetrics& m) {
      std::lock_guard<std::mutex> lock(mu);
      metrics[m.rank] = nlohmann::json::parse(m.json);
    };
    h.on_worker_lost = [this](const WorkerInfo& w, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu);
      lost.push_back({w.rank, why});
    };
    auto c = Coordinator::start(o, h);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    coord = std::move(c).value();
    for (int i = 0; i < n; ++i)
      pids.push_back(testing::spawn_child("multiprocess", {coord->endpoint(), o.token, mode}));
  }
};

void run_exchange(int n) {
  Job job(n, 10s, "exchange");
  auto st = testing::reap_children(job.pids, 240s);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(testing::exited_ok(st[i])) << "child " << i << " status " << st[i];
  ASSERT_EQ(job.metrics.size(), size_t(n));
  uint64_t per_peer = 0;
  for (size_t s : sizes_for(n)) per_peer += s;
  for (auto& [rank, j] : job.metrics) {
    uint64_t sent = 0, recvd = 0, raw = 0;
    for (auto& l : j["links"]) {
      if (l["dir"] == "send")
        sent += l["wire_bytes"].get<uint64_t>(), raw += l["raw_bytes"].get<uint64_t>();
      else
        recvd += l["wire_bytes"].get<uint64_t>();
    }
    EXPECT_EQ(sent, per_peer * (n - 1)) << "rank " << rank;
    EXPECT_EQ(recvd, per_peer * (n - 1)) << "rank " << rank;
    EXPECT_EQ(raw, 4 * per_peer * (n - 1)) << "rank " << rank;
  }
  EXPECT_TRUE(job.coord->wait_done(10s));
  for (auto& [rank, why] : job.lost) EXPECT_NE(why.find("left: done"), std::string::npos) << why;
}

TEST(TransportMultiProcess, TwoProcessesExchangeZeroTo64MiB) {
  run_exchange(2);
}

TEST(TransportMultiProcess, FourProcessesAllToAll) {
  run_exchange(4);
}

TEST(TransportMultiProcess, KilledWorkerIsDeclaredDeadAndSurvivorsAreTold) {
  const auto timeout = 1500ms;
  Job job(3, timeout, "die");
  auto st = testing::reap_children(job.pids, 60s);
  int killed = 0, ok = 0;
  for (int s : st) {
    if (s != -1 && WIFSIGNALED(s) && WTERMSIG(s) == SIGKILL) ++killed;
    if (testing::exited_ok(s)) ++ok;
  }
  EXPECT_EQ(killed, 1);
  EXPECT_EQ(ok, 2);
  std::lock_guard<std::mutex> lock(job.mu);
  ASSERT_FALSE(job.lost.empty());
  EXPECT_EQ(job.lost[0].first, 2);
  EXPECT_NE(job.lost[0].second.find("no message for"), std::string::npos) << job.lost[0].second;
  int dead = 0;
  for (auto& w : job.coord->workers()) dead += w.state == WorkerInfo::State::kDead;
  EXPECT_EQ(dead, 1);
}

// This file's children (spawn_child("multiprocess", ...)), run by tests/transport/child_main.cpp.
const testing::ChildRegistration kChild("multiprocess", [](const std::vector<std::string>& a) {
  return a.size() == 3 ? child_main(a[0], a[1], a[2]) : 64;
});

}  // namespace
}  // namespace lh
