// defines: LaunchFlags and run_launch — a whole job on this machine (the coordinator in this process, one
// `longhaul worker` process per worker, optional emulated links). Used by `longhaul launch` and `longhaul demo`.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/job_cli.h"

namespace lh::app {

struct LaunchFlags {
  JobFlags job;
  std::string listen = "tcp://127.0.0.1:*";
  std::string netns;
  int nat_sites = 0;  // workers in this many sites behind NAT routers (scripts/nat.sh; root)
  std::string site_rate;  // with nat_sites: each site's uplink limited to this rate (tc tbf)
  std::string ucx_tls;
  bool no_allow_list = false;  // workers leave their data ports open to every address (worker --no-allow-list)
  std::string wan_script;
  int worker_threads = 0;
  int restarts = 3;  // killed worker processes started again (in all)
  // --hosts FILE: the workers start over ssh on the hostfile's machines (apps/hostfile.h).
  std::string hosts, ssh = "ssh", remote_longhaul, coordinator_host;
};

// A codec change launch makes itself once step `after_step` was reported, through the same path as
// `longhaul ctl set-codec` (the demo's live switch).
struct ScheduledSwitch {
  int64_t after_step = 0;
  std::string link;  // "1-2"; "" for every pipeline link of the job's grid
  std::string dir;   // "fwd" | "bwd"
  std::string spec;  // a codec spec
};

// Adds the job flags and launch's own (--link, --netns, --listen, --ucx-tls, --worker-threads, --wan-script).
void add_launch_flags(CLI::App* cmd, LaunchFlags& f, const std::string& metrics_default);
// Runs the job to its end, printing progress, the link table and the step summary; a failed job ends
// the command with an error naming the cause (a dead worker's rank and pid first).
void run_launch(LaunchFlags& f, CLI::App* cmd, const std::vector<ScheduledSwitch>& switches = {});

}  // namespace lh::app
