// `longhaul worker --coordinator tcp://HOST:PORT`: one worker process of a pipeline job (its stage, codecs and
// training settings come from the coordinator's plan). Started by users on each machine and by `launch`.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "apps/job_cli.h"
#include "core/log.h"
#include "job/pipeline_worker.h"

namespace lh::app {
namespace {

struct WorkerFlags {
  std::string coordinator;
  SecretFlags secret;
  std::string hostname;
  std::string link;
  std::string ucx_tls;
  double compute_speed = 0;
  double join_timeout_s = 600, receive_timeout_s = 600, coordinator_timeout_s = 600;
  int rank = -1;
  double connect_timeout_s = 5;
  std::string data_ports;
  std::string advertise;
  std::string data_bind;
  bool relay_only = false;
  bool no_allow_list = false;
};

void run_worker(const WorkerFlags& f) {
  if (f.coordinator.rfind("tcp://", 0) != 0 || f.coordinator.rfind(':') <= 6)
    fail("--coordinator '" + f.coordinator + "': expected tcp://HOST:PORT", 2);
  PipelineWorkerOptions o;
  o.coordinator = f.coordinator;
  o.hostname = f.hostname;
  if (o.hostname.empty()) {
    // Several workers may share a machine: the pid tells them apart in the coordinator's messages.
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    o.hostname = std::string(buf) + " pid " + std::to_string(getpid());
  }
  o.compute_speed = f.compute_speed;
  o.ucx.tls = f.ucx_tls;
  if (!f.data_ports.empty()) {
    auto range = parse_port_range(f.data_ports);
    if (!range.ok()) fail("--data-ports '" + f.data_ports + "': " + range.status().message(), 2);
    o.ucx.data_ports = f.data_ports;
  }
  if (!f.advertise.empty()) {
    Status ok = check_advertised_host(f.advertise);
    if (!ok.ok()) fail("--advertise '" + f.advertise + "': " + ok.message(), 2);
    o.ucx.advertise = f.advertise;
  }
  if (!f.data_bind.empty()) {
    if (f.advertise.empty()) fail("--data-bind '" + f.data_bind + "' needs --advertise (the address peers connect to)", 2);
    o.ucx.data_bind = f.data_bind;
  }
  if (f.relay_only) {
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--advertise", &f.advertise},
                                      {"--data-ports", &f.data_ports},
                                      {"--data-bind", &f.data_bind},
                                      {"--ucx-tls", &f.ucx_tls}})
      if (!value->empty()) fail(std::string("--relay-only opens no data ports: it takes no ") + flag, 2);
    o.ucx.relay_only = true;
  }
  o.allow_list = !f.no_allow_list;
  o.rank = f.rank;
  o.connect_timeout = std::chrono::milliseconds(int64_t(f.connect_timeout_s * 1000));
  if (!f.link.empty()) {
    auto shape = parse_link_shape(f.link);
    if (!shape.ok()) fail("--link '" + f.link + "': " + shape.status().message(), 2);
    o.link = *shape;
  }
  const JobSecret secret = required_secret(f.secret, "worker");
  o.token = secret.join_proof();
  o.curve = secret.client_curve();
  o.join_timeout = std::chrono::milliseconds(int64_t(f.join_timeout_s * 1000));
  o.receive_timeout = std::chrono::milliseconds(int64_t(f.receive_timeout_s * 1000));
  o.coordinator_timeout = std::chrono::milliseconds(int64_t(f.coordinator_timeout_s * 1000));
  set_log_role("worker " + o.hostname);
  o.on_rank = [host = o.hostname](int rank) {
    // `ps -o comm`, `top` and `pgrep longhaul` then tell the workers of a machine apart.
    name_this_process("longhaul-w" + std::to_string(rank));
    set_log_role("worker " + std::to_string(rank) + " " + host);
  };
  Status s = run_pipeline_worker(o);
  if (!s.ok()) fail("worker " + o.hostname + ": " + s.message());
}

RegisterCommand reg("", 40, [](CLI::App& app) {
  auto f = std::make_shared<WorkerFlags>();
  auto* cmd = app.add_subcommand("worker", "join a pipeline job's coordinator and train the stage it assigns");
  cmd->add_option("--coordinator", f->coordinator, "the coordinator's tcp://HOST:PORT")->required();
  add_secret_flags(cmd, f->secret);
  cmd->add_option("--hostname", f->hostname, "name shown by the coordinator (default: host and pid)");
  cmd->add_option("--link", f->link, "in-process shaper on this worker's outgoing links: RATE[,DELAY], e.g. 20M,30ms");
  cmd->add_option("--ucx-tls", f->ucx_tls, "UCX transports (default: $UCX_TLS or UCX's choice)");
  cmd->add_option("--rank", f->rank,
                  "ask for this rank, i.e. this place in the grid (keep pipeline neighbours on one site); a rank "
                  "another worker holds is not given, and the worker takes a free one")
      ->check(CLI::Range(0, 4095));
  cmd->add_option("--data-ports", f->data_ports,
                  "LO-HI: the TCP ports the data plane listens on for its peers (one per network interface UCX "
                  "uses), so a firewall can open exactly these; default: any free port (as root with the "
                  "allow-list, 16 free ports between 20000 and 32000)")
      ->type_name("LO-HI");
  cmd->add_option("--advertise", f->advertise,
                  "HOST (DNS name or IPv4 address) peers should connect to for this worker's data, instead of the "
                  "addresses of its interfaces: the worker listens on a port of --data-ports (any free one without "
                  "it) and its peers connect there (UCX client-server mode)")
      ->type_name("HOST");
  cmd->add_option("--data-bind", f->data_bind,
                  "ADDR: the IPv4 address of this host's interface the --advertise listener binds, when the advertised "
                  "address is not this host's own (a forwarded port, NAT); default: the advertised address's interface "
                  "when it is local, else every interface")
      ->type_name("ADDR");
  cmd->add_flag("--relay-only", f->relay_only,
               "open no data port at all (UCX gets no network transport): every pair of this worker goes through the "
               "job's relay, for a worker that must expose nothing (the coordinator must run a relay: no --no-relay)");
  cmd->add_flag("--no-allow-list", f->no_allow_list,
               "as root, the worker lets only the job's members (and this host's loopback) reach its data ports, with "
               "an nftables table of its own; this flag leaves the ports open to every address");
  cmd->add_option("--connect-timeout", f->connect_timeout_s,
                  "seconds the pre-flight waits for a peer's direct connection before the pair goes through the "
                  "relay (or the job ends, with --no-relay)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  cmd->add_option("--compute-speed", f->compute_speed, "GFLOP/s reported for --partition speed (0: unknown)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--join-timeout", f->join_timeout_s, "seconds to wait for the plan and the start")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--receive-timeout", f->receive_timeout_s, "seconds a stage waits for a neighbour's tensor")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--coordinator-timeout", f->coordinator_timeout_s,
                  "seconds to wait for a lost coordinator to come back at the same address (restarted with --resume); "
                  "the job rolls back to its last checkpoint meanwhile (0: stop at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 7.0 * 86400));
  cmd->callback([f] { run_worker(*f); });
});

}  // namespace
}  // namespace lh::app
