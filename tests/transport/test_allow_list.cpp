// Tests of the data ports' allow-list (transport/allow_list.h): the addresses it reads, the ports it finds, the
// ruleset it writes, and (root, in a network namespace the test makes) that a stranger's connection is dropped until
// its address is allowed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "tests/common/netns_support.h"
#include "transport/allow_list.h"

namespace lh {
namespace {

TEST(AllowList, ReadsTheAddressesOfAnInterfaceList) {
  EXPECT_EQ(parse_ip_list("10.1.0.5, fe80::1, 192.168.1.7"),
            (std::set<std::string>{"10.1.0.5", "192.168.1.7", "fe80::1"}));
  EXPECT_EQ(parse_ip_list("advertised gpu7.example.org:40000"), std::set<std::string>{});
  EXPECT_EQ(parse_ip_list("10.1.0.5 …, 300.1.1.1, 10.2.0.1"), (std::set<std::string>{"10.1.0.5", "10.2.0.1"}));
  EXPECT_EQ(parse_ip_list(""), std::set<std::string>{});
}

// A TCP socket bound to `addr` (host order) on a free port, not yet listening; −1 on failure.
int bound_socket(uint32_t addr, int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  *port = ntohs(a.sin_port);
  return fd;
}

// A socket this process listens on is found, and no longer once it is closed.
TEST(AllowList, FindsThePortsThisProcessListensOn) {
  int port = 0;
  const int fd = bound_socket(INADDR_LOOPBACK, &port);
  ASSERT_GE(fd, 0);
  auto has = [&] {
    auto ports = listening_tcp_ports();
    return std::find(ports.begin(), ports.end(), port) != ports.end();
  };
  EXPECT_FALSE(has()) << "bound but not listening";
  ASSERT_EQ(listen(fd, 4), 0);
  EXPECT_TRUE(has());
  close(fd);
  EXPECT_FALSE(has());
}

TEST(AllowList, TheRulesetDropsOnlyStrangersOnTheDataPorts) {
  const std::string r = DataPortAllowList::ruleset("longhaul_w7", {40001, 40002}, {"10.0.0.2", "fe80::2", "10.0.0.3"});
  EXPECT_NE(r.find("table inet longhaul_w7"), std::string::npos) << r;
  EXPECT_NE(r.find("elements = { 10.0.0.2, 10.0.0.3 }"), std::string::npos) << r;
  EXPECT_NE(r.find("elements = { fe80::2 }"), std::string::npos) << r;
  EXPECT_NE(r.find("iif \"lo\" accept"), std::string::npos) << r;
  EXPECT_NE(r.find("tcp dport { 40001, 40002 } ip saddr != @members4 counter drop"), std::string::npos) << r;
  // A range (a worker's --data-ports, guarded before UCX opens a port of it) is one interval.
  const std::string range = DataPortAllowList::ruleset("longhaul_w7", {20003, 20000, 20001, 20002, 20010}, {});
  EXPECT_NE(range.find("tcp dport { 20000-20003, 20010 } ip saddr"), std::string::npos) << range;
  // No member yet: the sets are empty, so every address but the loopback is dropped.
  const std::string none = DataPortAllowList::ruleset("longhaul_w7", {40001}, {});
  EXPECT_EQ(none.find("elements"), std::string::npos) << none;
}

// The ports a worker with an allow-list takes when it is given none: consecutive, in range, and free (bindable) now.
TEST(AllowList, ChoosesAFreePortRange) {
  auto r = free_tcp_port_range(16);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->second - r->first, 15);
  EXPECT_GE(r->first, 20000);
  EXPECT_LT(r->second, 32000);
  for (int port = r->first; port <= r->second; ++port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << port;
    close(fd);
  }
  EXPECT_EQ(free_tcp_port_range(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(free_tcp_port_range(5000).status().code(), StatusCode::kInvalidArgument);
}

// Root only: a namespace (10.213.N.2) behind a veth reaches a port this process listens on until the allow-list
// (admitting only another address) is set, and again once its own address is admitted; the table goes with the
// object.
TEST(AllowList, AStrangersConnectionIsDroppedUntilItsAddressIsAllowedAsRoot) {
  if (Status ok = DataPortAllowList::available(); !ok.ok()) GTEST_SKIP() << ok.message();
  // Namespaces, veth and nftables (not in a chroot, where `ip netns add` cannot remount /).
  if (std::string why = nat_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const int n = int(getpid() % 200) + 20;
  const std::string ns = "lhal" + std::to_string(getpid() % 100000), host = "10.213." + std::to_string(n) + ".1",
                    stranger = "10.213." + std::to_string(n) + ".2", veth = "lhal" + std::to_string(n);
  auto sh = [](const std::string& cmd) { return std::system(cmd.c_str()); };
  struct Cleanup {
    std::string ns, veth;
    ~Cleanup() {
      (void)!std::system(("ip netns del " + ns + " 2>/dev/null; ip link del " + veth + "a 2>/dev/null").c_str());
    }
  } cleanup{ns, veth};
  ASSERT_EQ(sh("ip netns add " + ns + " && ip link add " + veth + "a type veth peer name " + veth + "b && ip link set " +
               veth + "b netns " + ns + " && ip addr add " + host + "/24 dev " + veth + "a && ip link set " + veth +
               "a up && ip netns exec " + ns + " ip addr add " + stranger + "/24 dev " + veth + "b && ip netns exec " +
               ns + " ip link set " + veth + "b up && ip netns exec " + ns + " ip link set lo up"),
            0);
  int port = 0;
  const int fd = bound_socket(INADDR_ANY, &port);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(listen(fd, 16), 0);
  // Exit 0 when the namespace's connection to the port is accepted within 2 s.
  auto reaches = [&] {
    return sh("timeout 2 ip netns exec " + ns + " bash -c 'exec 3<>/dev/tcp/" + host + "/" + std::to_string(port) +
              "' 2>/dev/null") == 0;
  };
  ASSERT_TRUE(reaches()) << "no allow-list yet: the check below could not fail";
  std::string table;
  {
    DataPortAllowList allow;
    ASSERT_TRUE(allow.set({port}, {"10.213.250.9"}).ok());
    table = allow.table();
    EXPECT_EQ(table, "longhaul_w" + std::to_string(getpid()));
    EXPECT_FALSE(reaches()) << "a stranger's connection got through the allow-list";
    ASSERT_TRUE(allow.set({port}, {"10.213.250.9", stranger}).ok());
    EXPECT_TRUE(reaches()) << "an allowed address was dropped";
  }
  EXPECT_NE(sh("nft list table inet " + table + " >/dev/null 2>&1"), 0) << "the table outlived its allow-list";
  EXPECT_TRUE(reaches());
  close(fd);
}

}  // namespace
}  // namespace lh
