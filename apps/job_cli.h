// defines: the flags shared by `longhaul launch` and `longhaul coordinator` (model, training, grid, schedule,
// codecs, metrics, token, heartbeats), their conversion into a JobConfig, and the end-of-job tables.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>

#include "apps/model_flags.h"
#include "job/job_coordinator.h"
#include "plan/job_config.h"
#include "transport/job_secret.h"

namespace lh::app {

// Where a command's job secret comes from: --key-file, else the deprecated --token-file / --token, else $LH_JOB_KEY
// (or the older $LH_JOB_TOKEN).
struct SecretFlags {
  std::string key_file, token_file, token;
};

struct JobFlags {
  ModelFlags model;
  std::string schedule = "1f1b";
  std::string compression;  // --compression: a frontier point that sets the codecs (and, for frontier, the model)
  JobConfig job;            // training, grid and codec fields are bound to it directly
  std::string metrics;
  SecretFlags secret;
  bool encrypt_data = false, no_data_auth = false;
  double heartbeat_timeout_s = 5;
  double stall_timeout_s = 60;
  std::string http;  // --http ADDR:PORT: the live page and /metrics
  // The data-plane relay for pairs that cannot connect directly (on the coordinator's host).
  bool no_relay = false;
  int relay_port = 0;  // 0: the control port + 1 (any free port when that is '*')
  std::string relay_at;  // --relay tcp://HOST:PORT: a relay run elsewhere (`longhaul relay`)
  std::string relay_key_file;  // --relay-key-file: the key that relay checks each rank's hello with
  // Job checkpoints and recovery.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
  bool resume = false;
  double replace_timeout_s = 600;
  bool elastic = false;
  // The grid as set here stands when neither --workers nor --pp is given (`demo`); otherwise one of
  // them is required.
  bool grid_has_defaults = false;
};

// Adds the job flags to `cmd`; `metrics_default` is the --metrics default shown in --help.
void add_job_flags(CLI::App* cmd, JobFlags& f, const std::string& metrics_default);
// The validated job; a bad flag ends the command with an error naming it.
JobConfig job_config_from_flags(const JobFlags& f, CLI::App* cmd);

void add_secret_flags(CLI::App* cmd, SecretFlags& f, const std::string& group = "");
// A key file's secret (`flag` names it in the error that exits 2; *weak: JobSecret::load's).
JobSecret load_secret_file(const std::string& path, const std::string& flag, bool* weak = nullptr);
// The secret, or nullopt when none is given. A bad key file ends the command; --token warns (`ps` shows it).
std::optional<JobSecret> resolve_secret(const SecretFlags& f);
// A worker's or ctl's secret: required (the error says where to find it).
JobSecret required_secret(const SecretFlags& f, const std::string& command);
// A coordinator's (or launch's): the one given, else the key file next to `metrics` (FILE.key for FILE.jsonl),
// reused when it exists and written (0600) when not. *path is the key file to give workers and ctl ("" when the
// secret came from --token or the environment); *wrote says it was just made.
JobSecret coordinator_secret(const SecretFlags& f, const std::string& metrics, std::string* path, bool* wrote);

// Heartbeats every timeout/10 (at least 20 ms), declared dead after the timeout.
CoordinatorOptions control_options(const std::string& listen, const JobSecret& secret, double heartbeat_timeout_s);
// The coordinator's options from the job flags: control (heartbeats, --replace-timeout), metrics, checkpoints.
JobCoordinatorOptions coordinator_options(const JobFlags& f, const std::string& listen, const JobSecret& secret);
// "live page: URL" when the job serves one (--http), with how to get its token when the address needs one.
void print_page_address(const JobCoordinator& coord, const std::string& key_path);
// After a failed job with checkpoints: "its last checkpoint is step N in DIR; resume it with …" ("" without).
std::string resume_hint(const JobCoordinator& coord, const JobFlags& f, const std::string& command);

// "step 12/150  loss 3.1234  812 tok/s" when a new step was reported since `last_printed`.
// Prints "step N/M  loss ..." for the newest step not printed yet whose loss all `loss_reporters`
// workers (one per replica) have sent.
void print_progress(const JobCoordinator& coord, int64_t steps, int64_t& last_printed, int loss_reporters);
// The link table, the step summary and where the metrics went.
void print_job_summary(const JobCoordinator& coord, const std::string& metrics_path);

// The signals that stop a job's process (launch, coordinator): the first SIGTERM, what a scheduler sends before its
// kill, checkpoints the job and stops it; any other, or SIGTERM again, stops it at once. `restart`: calls the signal
// interrupts resume (as std::signal's handlers do).
void catch_stop_signals(std::initializer_list<int> signals, bool restart);
// The signal that stops the job now (0: none).
int stop_signal();
// Once per turn of a job's wait loop: at the first SIGTERM, prints so (after `lead`) and preempts `coord` with `reason`
// (`preempting` remembers it). Returns stop_signal().
int preempt_or_stop_signal(JobCoordinator& coord, bool& preempting, const char* lead, const std::string& reason);

}  // namespace lh::app
