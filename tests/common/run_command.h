// defines: lh::testing::run_command — a shell command run to its end with stdout and stderr captured together, the
// one copy of what the CLI, script, Slurm and web tests each had (tests/apps, tests/integration, tests/common).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace lh::testing {

struct CommandRun {
  // The exit status; 128 + the signal when a signal ended it (as a shell says); -1 when it could not be started.
  int code = -1;
  std::string output;  // stdout and stderr, in the order written
};

// `command` through /bin/sh with its stderr joined to its stdout.
inline CommandRun run_command(const std::string& command) {
  CommandRun r;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  if (st == -1) return r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

}  // namespace lh::testing
