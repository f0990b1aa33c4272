// DataPortAllowList: an nftables table per worker process that drops TCP packets to its data ports from addresses
// outside the job (nft run as a child process, its ruleset on stdin); listening_tcp_ports from /proc.
#include "transport/allow_list.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "core/log.h"

namespace lh {
namespace {

// Runs `nft ARGS…` with `input` on its stdin; its output (stdout and stderr) on success, else an error naming it.
Result<std::string> run_nft(const std::vector<std::string>& args, const std::string& input) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return io_error(std::string("pipe: ") + std::strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return io_error(std::string("pipe: ") + std::strerror(errno));
  }
  std::vector<char*> argv;  // made before fork: the child of a threaded process only calls what is async-signal-safe
  argv.push_back(const_cast<char*>("nft"));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    return io_error(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    execvp("nft", argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  // The ruleset is a few hundred bytes, well under a pipe's buffer: written whole before reading.
  const struct sigaction ignore_pipe = [] {
    struct sigaction sa {};
    sa.sa_handler = SIG_IGN;
    return sa;
  }();
  struct sigaction before {};
  sigaction(SIGPIPE, &ignore_pipe, &before);
  size_t off = 0;
  while (off < input.size()) {
    const ssize_t n = write(in[1], input.data() + off, input.size() - off);
    if (n <= 0) break;
    off += size_t(n);
  }
  close(in[1]);
  sigaction(SIGPIPE, &before, nullptr);
  std::string output;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR);)
    if (n > 0 && output.size() < 64 * 1024) output.append(buf, size_t(n));
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return unavailable("nft (nftables) is not installed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return unavailable("nft " + (args.empty() ? std::string() : args[0]) + " failed: " +
                       output.substr(0, std::min<size_t>(output.size(), 500)));
  return output;
}

std::string table_of(pid_t pid) {
  return "longhaul_w" + std::to_string(pid);
}

// Deletes the tables of worker processes that are gone (killed before their destructor ran).
void delete_stale_tables() {
  auto listed = run_nft({"list", "tables"}, "");
  if (!listed.ok()) return;
  std::istringstream lines(*listed);
  for (std::string line; std::getline(lines, line);) {
    const std::string prefix = "table inet longhaul_w";
    if (line.rfind(prefix, 0) != 0) continue;
    const std::string pid_text = line.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (run_nft({"delete", "table", "inet", table_of(pid)}, "").ok())
      LH_LOG_INFO("allow-list: deleted the table of worker process {}, which is gone", pid);
  }
}

}  // namespace

std::vector<int> listening_tcp_ports() {
  std::map<std::string, int> listening;  // socket inode → port, from /proc/net/tcp{,6} (state 0A: LISTEN)
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string field, local, state, inode;
      for (int i = 0; f >> field; ++i) {
        if (i == 1) local = field;
        if (i == 3) state = field;
        if (i == 9) inode = field;
      }
      const size_t colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos)
        listening[inode] = int(std::stoul(local.substr(colon + 1), nullptr, 16));
    }
  }
  std::set<int> ports;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), link_ec).string();
    if (link_ec || target.rfind("socket:[", 0) != 0) continue;
    auto it = listening.find(target.substr(8, target.size() - 9));
    if (it != listening.end()) ports.insert(it->second);
  }
  return std::vector<int>(ports.begin(), ports.end());
}

std::set<std::string> parse_ip_list(const std::string& text) {
  std::set<std::string> out;
  std::string word;
  auto take = [&] {
    in6_addr a6{};
    in_addr a4{};
    if (!word.empty() && (inet_pton(AF_INET, word.c_str(), &a4) == 1 || inet_pton(AF_INET6, word.c_str(), &a6) == 1))
      out.insert(word);
    word.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\t' || c == '\n')
      take();
    else
      word += c;
  }
  take();
  return out;
}

Result<std::pair<int, int>> free_tcp_port_range(int count) {
  if (count < 1 || count > 1024) return invalid_argument("a port range of " + std::to_string(count) + " ports");
  // Below Linux's usual ephemeral ports (32768 and up), where outgoing connections take theirs.
  constexpr int kLow = 20000, kHigh = 32000;
  const int slots = (kHigh - kLow) / count;
  std::random_device rd;
  std::mt19937 rng(rd());
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int lo = kLow + int(rng() % uint32_t(slots)) * count;
    bool free = true;
    for (int port = lo; port < lo + count && free; ++port) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return io_error(std::string("socket: ") + std::strerror(errno));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(uint16_t(port));
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(fd);
    }
    if (free) return std::make_pair(lo, lo + count - 1);
  }
  return unavailable("no " + std::to_string(count) + " consecutive free TCP ports between " + std::to_string(kLow) +
                     " and " + std::to_string(kHigh));
}

Status DataPortAllowList::available() {
  if (geteuid() != 0) return unavailable("not root: nftables needs CAP_NET_ADMIN");
  auto listed = run_nft({"list", "tables"}, "");
  return listed.ok() ? Status::Ok() : Status(listed.status());
}

std::string DataPortAllowList::ruleset(const std::string& table, const std::vector<int>& ports,
                                       const std::set<std::string>& allowed) {
  std::string v4, v6, port_list;
  for (const std::string& a : allowed) {
    in_addr a4{};
    std::string& set = inet_pton(AF_INET, a.c_str(), &a4) == 1 ? v4 : v6;
    set += (set.empty() ? "" : ", ") + a;
  }
  // Runs of three or more consecutive ports as one interval ("40000-40015"): a whole --data-ports range stays short.
  std::vector<int> sorted(ports.begin(), ports.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    const std::string item = j - i >= 2 ? std::to_string(sorted[i]) + "-" + std::to_string(sorted[j])
                                        : std::to_string(sorted[i]);
    port_list += (port_list.empty() ? "" : ", ") + item;
    if (j - i == 1) port_list += ", " + std::to_string(sorted[j]);
    i = j + 1;
  }
  std::ostringstream r;
  r << "table inet " << table << " {\n"
    << "  set members4 {\n    type ipv4_addr\n" << (v4.empty() ? "" : "    elements = { " + v4 + " }\n") << "  }\n"
    << "  set members6 {\n    type ipv6_addr\n" << (v6.empty() ? "" : "    elements = { " + v6 + " }\n") << "  }\n"
    << "  chain input {\n"
    << "    type filter hook input priority filter - 10; policy accept;\n"
    << "    iif \"lo\" accept\n"
    << "    meta nfproto ipv4 tcp dport { " << port_list << " } ip saddr != @members4 counter drop\n"
    << "    meta nfproto ipv6 tcp dport { " << port_list << " } ip6 saddr != @members6 counter drop\n"
    << "  }\n"
    << "}\n";
  return r.str();
}

Status DataPortAllowList::set(const std::vector<int>& ports, const std::set<std::string>& allowed) {
  if (ports.empty()) {
    clear();
    return Status::Ok();
  }
  if (table_.empty()) delete_stale_tables();
  const std::string table = table_of(getpid());
  // One transaction: the old table (if any) goes and the new one comes at once, so no packet slips between them.
  std::string script = table_.empty() ? "" : "delete table inet " + table + "\n";
  script += ruleset(table, ports, allowed);
  auto done = run_nft({"-f", "-"}, script);
  if (!done.ok()) return Status(done.status()).prepend("the data ports' allow-list");
  table_ = table;
  return Status::Ok();
}

void DataPortAllowList::clear() {
  if (table_.empty()) return;
  auto done = run_nft({"delete", "table", "inet", table_}, "");
  if (!done.ok()) LH_LOG_WARN("allow-list: could not delete table {}: {}", table_, done.status().message());
  table_.clear();
}

DataPortAllowList::~DataPortAllowList() {
  clear();
}

}  // namespace lh
