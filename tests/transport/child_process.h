// defines: helpers for transport integration tests that run real worker processes: spawning this test binary
// again as a child (`--lh-child NAME ...`, run by the entry a test file registered as NAME: the room's tests share
// one executable, whose main is tests/transport/child_main.cpp), reaping children with a deadline, and deterministic
// packet contents. Used by tests/transport/test_transport_*.cpp.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace lh::testing {

// What a child started as `--lh-child NAME args...` runs: the entry registered as NAME, given args; its result is
// the child's exit code.
using ChildEntry = int (*)(const std::vector<std::string>& args);
inline std::map<std::string, ChildEntry>& child_entries() {
  static std::map<std::string, ChildEntry> entries;
  return entries;
}
// A namespace-scope `const ChildRegistration reg("name", entry);` in a test file registers its child entry.
struct ChildRegistration {
  ChildRegistration(const char* name, ChildEntry entry) { child_entries()[name] = entry; }
};

// Starts `prefix... /proc/self/exe --lh-child name args...` (prefix e.g. {"ip","netns","exec","ns0"}).
inline pid_t spawn_child(const std::string& name, const std::vector<std::string>& args,
                         const std::vector<std::string>& prefix = {}) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return -1;
  self[n] = 0;
  std::vector<std::string> all = prefix;
  all.push_back(self);
  all.push_back("--lh-child");
  all.push_back(name);
  all.insert(all.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for every child until `timeout`; kills the stragglers. Returns each child's wait status
// (-1 for one that had to be killed).
inline std::vector<int> reap_children(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  std::vector<int> status(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t left = pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        done[i] = true;
        --left;
      }
    }
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i)
    if (!done[i]) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], nullptr, 0);
    }
  return status;
}

inline bool exited_ok(int st) {
  return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// The contents of packet `i` from `src` to `dst`: a cheap LCG stream that differs per packet.
inline std::vector<uint8_t> packet_bytes(int src, int dst, int i, size_t n) {
  std::vector<uint8_t> b(n);
  uint32_t x = uint32_t(src * 1000003 + dst * 9176 + i * 31 + 7);
  for (size_t k = 0; k < n; ++k) {
    x = x * 1664525u + 1013904223u;
    b[k] = uint8_t(x >> 24);
  }
  return b;
}

}  // namespace lh::testing
