// The `longhaul` entry point: builds the CLI from the command registry and runs the chosen subcommand.
// Used by users, scripts and the integration tests.
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/exec.h"
#include "core/log.h"

namespace lh::app {

std::vector<CommandRegistration>& command_registry() {
  static std::vector<CommandRegistration> r;
  return r;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

std::string find_wan_script(const std::string& given) {
  if (!given.empty()) return given;
  const std::string exe = self_exe();
  for (std::string dir = exe.substr(0, exe.rfind('/')); !dir.empty(); dir = dir.substr(0, dir.rfind('/'))) {
    std::string cand = dir + "/scripts/wan.sh";
    if (access(cand.c_str(), R_OK) == 0) return cand;
    if (dir.find('/') == std::string::npos) break;
  }
  return "scripts/wan.sh";
}

void name_this_process(const std::string& name) {
  prctl(PR_SET_NAME, name.substr(0, 15).c_str(), 0, 0, 0);
}

void fail(const std::string& message, int code) {
  std::fprintf(stderr, "longhaul: error: %s\n", message.c_str());
  throw CLI::RuntimeError(code);
}

}  // namespace lh::app

// libgomp reads OMP_WAIT_POLICY once, before main: spinning OpenMP threads make a loaded or shared
// machine (several workers per host, CI) several times slower, so unless the user chose a policy we
// re-exec once with PASSIVE. The re-exec goes through the binary's real path, not /proc/self/exe, so
// the process keeps the name `longhaul` (the kernel names a process after the file it executes).
static void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  const std::string self = lh::app::self_exe();
  if (self.empty()) return;  // no /proc: carry on with the default policy
  execv(self.c_str(), argv);
  // exec failed: carry on with the default policy.
}

int main(int argc, char** argv) {
  ensure_passive_openmp_wait(argv);
  using namespace lh::app;
  CLI::App app{
      "longhaul: train neural networks across far-apart machines over slow links,\n"
      "with compressed activations, gradients and partial sums."};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string("longhaul ") + LH_VERSION + " (" + lh::cuda_device_summary() + ")");
  std::string log_level = "info";
  int threads = 0;
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads for BLAS and OpenMP (default: all cores)")
      ->check(CLI::Range(0, 4096));

  CLI::App* bench = app.add_subcommand("bench", "benchmarks that print ratios against a baseline run beside them");
  bench->require_subcommand(1);

  auto regs = command_registry();
  std::stable_sort(regs.begin(), regs.end(), [](auto& a, auto& b) { return a.order < b.order; });
  for (auto& r : regs) r.add(r.parent_name == "bench" ? *bench : app);

  app.parse_complete_callback([&] {
    lh::Status s = lh::set_log_level(log_level);
    if (!s.ok()) fail(s.message(), 2);
    if (threads > 0) lh::set_num_threads(threads);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (argc == 1) {
    std::cout << app.help();
    return 0;
  }
  return 0;
}
