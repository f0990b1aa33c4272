// End-to-end over real emulated links: scripts/wan.sh puts two worker processes in network namespaces joined by
// a bridge with tc tbf on each egress; they join a coordinator on the bridge address and move packets over UCX/tcp.
// Checks integrity and that the achieved rate sits at the tbf rate. Root only (skips otherwise).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "tests/common/netns_support.h"
#include "tests/transport/child_process.h"
#include "transport/control_client.h"
#include "transport/coordinator.h"
#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

using namespace std::chrono_literals;

const double kRate = 40e6;  // bit/s on each namespace's egress
const size_t kPacket = 1 << 20;
const int kPackets = 8;  // 8 MiB: ~1.7 s at 40 Mbit/s

int child_main(const std::string& endpoint, const std::string& token) {
  UcxOptions uo;
  uo.tls = "tcp";
  uo.net_devices = "eth0";  // the namespace's veth (its lo would loop back into the same namespace)
  auto plane = UcxDataPlane::create(uo);
  if (!plane.ok()) return (std::fprintf(stderr, "%s\n", plane.status().to_string().c_str()), 2);
  ControlClientOptions co;
  co.coordinator = endpoint;
  co.token = token;
  auto cc = ControlClient::connect(co);
  if (!cc.ok()) return 3;
  auto plan = (*cc)->join((*plane)->address(), 30s);
  if (!plan.ok()) return (std::fprintf(stderr, "%s\n", plan.status().to_string().c_str()), 4);
  int me = plan->rank, other = 1 - me;
  if (!(*plane)->connect(me, {{other, plan->peers[size_t(other)].ucx_address}}).ok()) return 5;
  if (!(*cc)->ready(30s).ok()) return 6;
  if (me == 0) {
    std::vector<Transfer> ts;
    for (int i = 0; i < kPackets; ++i)
      ts.push_back((*plane)->send(1, make_tag(i, 0, Role::kActivation), testing::packet_bytes(0, 1, i, kPacket)));
    for (auto& t : ts)
      if (!t.wait(120s).ok()) return 7;
  } else {
    std::vector<Transfer> ts;
    for (int i = 0; i < kPackets; ++i) ts.push_back((*plane)->recv(0, make_tag(i, 0, Role::kActivation)));
    Clock::time_point first{}, last{};
    for (int i = 0; i < kPackets; ++i) {
      if (!ts[i].wait(120s).ok()) return 8;
      (i == 0 ? first : last) = Clock::now();
      if (ts[i].take() != testing::packet_bytes(0, 1, i, kPacket)) return 9;
    }
    double bps = double(kPackets - 1) * kPacket * 8 / std::chrono::duration<double>(last - first).count();
    (*cc)->send_metrics(0, nlohmann::json{{"bps", bps}}.dump());
  }
  Status b = (*cc)->barrier(1, 60s);
  (*cc)->leave("done");
  return b.ok() ? 0 : 10;
}

TEST(TransportNetns, TwoNamespacesOverTbfLink) {
  if (std::string why = netns_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string prefix = "lht" + std::to_string(getpid() % 10000);
  const std::string subnet = "10.213." + std::to_string(100 + getpid() % 100);
  setenv("LH_WAN_PREFIX", prefix.c_str(), 1);
  setenv("LH_WAN_SUBNET", subnet.c_str(), 1);
  const std::string wan = wan_script();
  std::string up = "bash " + wan + " up 2 " + std::to_string(int64_t(kRate)) + " >&2";
  if (std::system(up.c_str()) != 0) GTEST_SKIP() << "could not create namespaces with " << wan;
  struct Down {
    std::string cmd;
    ~Down() { (void)!std::system(cmd.c_str()); }
  } down{"bash " + wan + " down"};

  CoordinatorOptions o;
  o.listen = "tcp://" + subnet + ".254:*";
  o.token = "netns";
  o.expected_workers = 2;
  o.heartbeat_timeout = 10s;
  std::mutex mu;
  double bps = 0;
  CoordinatorHooks h;
  h.on_metrics = [&](const StepMetrics& m) {
    std::lock_guard<std::mutex> lock(mu);
    bps = nlohmann::json::parse(m.json)["bps"].get<double>();
  };
  auto c = Coordinator::start(o, h);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i)
    pids.push_back(testing::spawn_child("netns", {(*c)->endpoint(), o.token},
                                        {"ip", "netns", "exec", prefix + std::to_string(i)}));
  auto st = testing::reap_children(pids, 120s);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(testing::exited_ok(st[i])) << "child " << i << " status " << st[i];
  std::lock_guard<std::mutex> lock(mu);
  std::printf("netns tbf link: achieved %.2f Mbit/s of %.2f configured (%.1f%%)\n", bps / 1e6, kRate / 1e6,
              100 * bps / kRate);
  // tbf counts Ethernet/IP/TCP headers too, so the payload rate sits a few percent below the configured one.
  EXPECT_GT(bps, 0.80 * kRate);
  EXPECT_LT(bps, 1.10 * kRate);
}

// This file's children (spawn_child("netns", ...)), run by tests/transport/child_main.cpp.
const testing::ChildRegistration kChild("netns", [](const std::vector<std::string>& a) {
  return a.size() == 2 ? child_main(a[0], a[1]) : 64;
});

}  // namespace
}  // namespace lh
