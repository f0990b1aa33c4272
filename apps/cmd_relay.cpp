// `longhaul relay --listen tcp://HOST:PORT --key-file job.key`: the data-plane relay on a machine of its own (one that
// every worker reaches, when the coordinator's host is not well connected), for jobs whose coordinator is started with
// `--relay tcp://HOST:PORT`. The same relay a coordinator runs beside its control socket (transport/relay.h).
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "apps/commands.h"
#include "apps/job_cli.h"
#include "core/log.h"
#include "transport/relay.h"

namespace lh::app {
namespace {

volatile std::sig_atomic_t g_relay_stop = 0;
void on_relay_signal(int) {
  g_relay_stop = 1;
}

struct RelayFlags {
  std::string listen = "tcp://0.0.0.0:5556";
  SecretFlags secret;
  std::string relay_key_file;
  double stats_every_s = 60;
};

void run_relay(const RelayFlags& f) {
  const JobSecret secret = required_secret(f.secret, "relay");
  RelayOptions o;
  o.listen = f.listen;
  o.token = secret.join_proof();
  o.curve = secret.server_curve();
  o.rank_key = f.relay_key_file.empty() ? secret.relay_rank_key()
                                        : load_secret_file(f.relay_key_file, "--relay-key-file").relay_rank_key();
  set_log_role("relay");
  auto relay = Relay::start(o);
  if (!relay.ok()) fail("--listen " + f.listen + ": " + relay.status().message(), 2);
  std::printf("longhaul relay: listening on %s; start the job's coordinator with --relay tcp://THIS-HOST:%u\n",
              (*relay)->endpoint().c_str(), unsigned((*relay)->port()));
  std::fflush(stdout);
  std::signal(SIGINT, on_relay_signal);
  std::signal(SIGTERM, on_relay_signal);
  auto print = [&] {
    uint64_t packets = 0, bytes = 0;
    for (const auto& [pair, c] : (*relay)->forwarded()) {
      packets += c.packets;
      bytes += c.bytes;
    }
    std::printf("relay: %d worker(s) connected; forwarded %llu packets, %.2f MB; dropped %llu\n", (*relay)->connected(),
                static_cast<unsigned long long>(packets), double(bytes) / 1e6,
                static_cast<unsigned long long>((*relay)->dropped()));
    std::fflush(stdout);
  };
  auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(f.stats_every_s * 1000));
  while (!g_relay_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (f.stats_every_s > 0 && std::chrono::steady_clock::now() >= next) {
      print();
      next += std::chrono::milliseconds(int64_t(f.stats_every_s * 1000));
    }
  }
  print();
}

RegisterCommand reg("", 45, [](CLI::App& app) {
  auto f = std::make_shared<RelayFlags>();
  auto* cmd = app.add_subcommand("relay",
                                 "forward data-plane packets for the workers of a job that cannot connect directly "
                                 "(start the coordinator with --relay tcp://HOST:PORT)");
  cmd->add_option("--listen", f->listen, "tcp://HOST:PORT to bind")->capture_default_str();
  add_secret_flags(cmd, f->secret);
  cmd->add_option("--relay-key-file", f->relay_key_file,
                  "a key file (`longhaul keygen`) given to the coordinator's --relay-key-file too and to no worker: a "
                  "member of the job then cannot bind another member's rank here (without it, a member could)");
  cmd->add_option("--stats-every", f->stats_every_s, "seconds between lines of counts (0: only at exit)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->callback([f] { run_relay(*f); });
});

}  // namespace
}  // namespace lh::app
