// defines: lh::DataPortAllowList (an nftables table that lets only the job's members reach this worker's data
// ports), lh::listening_tcp_ports (the TCP ports this process listens on) and lh::parse_ip_list. Used by the pipeline
// worker (one allow-list per process, renewed at every epoch) and the transport tests.
#pragma once

#include <set>
#include <utility>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

// The TCP ports this process listens on (IPv4 and IPv6; from /proc/net/tcp{,6} and /proc/self/fd), sorted.
std::vector<int> listening_tcp_ports();

// `count` consecutive TCP ports, all free on every IPv4 address of this host now (a random choice between 20000 and
// 32000): what a worker's data ports may use (UcxOptions::data_ports) when its allow-list must guard them before they
// open. Unavailable when none is found.
Result<std::pair<int, int>> free_tcp_port_range(int count);

// The IP addresses in `text` ("10.1.0.5, fe80::1" as interface_addresses() writes them, or separated by spaces);
// anything that is not an IPv4 or IPv6 address (an "advertised HOST:PORT", "…") is skipped.
std::set<std::string> parse_ip_list(const std::string& text);

// UCX 1.13.1 reads its sockets before longhaul sees a byte (and can crash on a stranger's garbage), so the only sure
// way to keep strangers' bytes from it is not to let them in: an nftables table of this process ("inet
// longhaul_w<pid>") that drops TCP packets to the given ports unless they come from an allowed address or the
// loopback interface. Needs root (CAP_NET_ADMIN) and nft; without them, available() says why and nothing is
// filtered. The table is replaced by each set() and deleted by the destructor; tables of processes that are gone
// (killed) are deleted by the first set() of another.
class DataPortAllowList {
 public:
  DataPortAllowList() = default;
  ~DataPortAllowList();
  DataPortAllowList(const DataPortAllowList&) = delete;
  DataPortAllowList& operator=(const DataPortAllowList&) = delete;

  // OK when the table can be made here (root and nft), else why not.
  static Status available();
  // Lets only `allowed` (IPv4/IPv6 addresses) and the loopback reach `ports`; an empty `allowed` admits only the
  // loopback. Empty `ports`: removes the table.
  Status set(const std::vector<int>& ports, const std::set<std::string>& allowed);
  // Deletes the table (if any).
  void clear();
  const std::string& table() const { return table_; }
  // The ruleset set() loads (for tests and logs).
  static std::string ruleset(const std::string& table, const std::vector<int>& ports,
                             const std::set<std::string>& allowed);

 private:
  std::string table_;  // "longhaul_w<pid>" once set() made it
};

}  // namespace lh
