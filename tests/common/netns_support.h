// defines: source_script(name) (the source tree's scripts/<name>), wan_script() (scripts/wan.sh),
// netns_unavailable_reason() and nat_unavailable_reason() — whether this machine can build emulated links or NAT'd
// sites. Used by the integration tests that run jobs in network namespaces and those that run the scripts.
#pragma once

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/common/run_command.h"

namespace lh {

// The source tree's scripts/<name> (LH_SOURCE_DIR, else the build tree's CMake cache, else relative).
inline std::string source_script(const std::string& name) {
  const char* src = std::getenv("LH_SOURCE_DIR");
  if (src) return std::string(src) + "/scripts/" + name;
  // The test binary lives in <build>/bin; the source tree is found through the CMake cache.
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, size_t(n)) : "";
  dir = dir.substr(0, dir.rfind('/'));  // bin
  dir = dir.substr(0, dir.rfind('/'));  // build dir
  std::ifstream c(dir + "/CMakeCache.txt");
  std::string line;
  while (std::getline(c, line))
    if (line.rfind("longhaul_SOURCE_DIR:STATIC=", 0) == 0) return line.substr(27) + "/scripts/" + name;
  return "scripts/" + name;
}

inline std::string wan_script() {
  return source_script("wan.sh");
}

// "" when `script probe` says this machine can build what the script builds; else why not.
inline std::string script_probe_reason(const std::string& script) {
  if (geteuid() != 0) return "needs root for network namespaces";
  testing::CommandRun probe = testing::run_command("bash '" + script + "' probe");
  if (probe.code == -1) return "cannot run " + wan_script();
  if (probe.code == 0) return "";
  std::string out = probe.output;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out.empty() ? "`" + script + " probe` failed" : out;
}

// "" when namespaces, veth links and tc tbf can be made here (`wan.sh probe` builds and removes one);
// else why not: not root, no CAP_SYS_ADMIN (a container), a chroot whose / is not a mount point …
inline std::string netns_unavailable_reason() {
  return script_probe_reason(wan_script());
}

// "" when sites behind NAT routers can be made here (`nat.sh probe`: namespaces, nftables masquerade); else why not.
inline std::string nat_unavailable_reason() {
  const std::string wan = wan_script();
  return script_probe_reason(wan.substr(0, wan.rfind('/') + 1) + "nat.sh");
}

}  // namespace lh
