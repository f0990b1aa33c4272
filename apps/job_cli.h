// defines: the flags shared by `longhaul launch` and `longhaul coordinator` (model, training, grid, schedule,
// codecs, metrics, token, heartbeats), their conversion into a PipelineJobConfig, and the end-of-job tables.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>

#include "apps/model_flags.h"
#include "parallel/job_config.h"
#include "parallel/pipeline_coordinator.h"

namespace lh::app {

struct JobFlags {
  ModelFlags model;
  std::string schedule = "1f1b";
  PipelineJobConfig job;  // training, grid and codec fields are bound to it directly
  std::string metrics;
  std::string token, token_file;
  double heartbeat_timeout_s = 5;
  double stall_timeout_s = 60;
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
PipelineJobConfig job_config_from_flags(const JobFlags& f, CLI::App* cmd);

// The shared join/ctl token: --token, else --token-file's first line, else $LH_JOB_TOKEN, else
// (when `generate`) a fresh random one, else "". A bad --token-file ends the command.
std::string resolve_token(const std::string& token, const std::string& token_file, bool generate);

// Heartbeats every timeout/10 (at least 20 ms), declared dead after the timeout.
CoordinatorOptions control_options(const std::string& listen, const std::string& token, double heartbeat_timeout_s);
// The coordinator's options from the job flags: control (heartbeats, --replace-timeout), metrics, checkpoints.
PipelineCoordinatorOptions coordinator_options(const JobFlags& f, const std::string& listen, const std::string& token);
// After a failed job with checkpoints: "its last checkpoint is step N in DIR; resume it with …" ("" without).
std::string resume_hint(const PipelineCoordinator& coord, const JobFlags& f, const std::string& command);

// "step 12/150  loss 3.1234  812 tok/s" when a new step was reported since `last_printed`.
void print_progress(const PipelineCoordinator& coord, int64_t steps, int64_t& last_printed);
// The link table, the step summary and where the metrics went.
void print_job_summary(const PipelineCoordinator& coord, const std::string& metrics_path);

}  // namespace lh::app
