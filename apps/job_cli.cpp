// The job flags of `launch` and `coordinator`, their PipelineJobConfig, the token, and the progress and
// summary printing at the end of a job. Used by apps/cmd_launch.cpp and apps/cmd_coordinator.cpp.
#include "apps/job_cli.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "apps/commands.h"
#include "parallel/metrics_summary.h"

namespace lh::app {

void add_job_flags(CLI::App* cmd, JobFlags& f, const std::string& metrics_default) {
  TrainConfig& c = f.job.train;
  f.metrics = metrics_default;
  const char* g = "Job";
  cmd->add_option("--workers", f.job.workers, "worker processes (default: pp × tp × dp)")
      ->check(CLI::Range(1, 4096))
      ->group(g);
  cmd->add_option("--pp", f.job.pp, "pipeline stages (default: --workers)")->check(CLI::Range(1, 4096))->group(g);
  cmd->add_option("--tp", f.job.tp, "tensor-parallel shards per stage: each holds its share of every block's heads")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->group(g);
  cmd->add_option("--dp", f.job.dp, "data-parallel replicas; each trains on its slice of the global batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->group(g);
  cmd->add_option("--partition", f.job.partition,
                  "blocks per stage, e.g. 3,3,2; 'speed': by reported speed (default: even)")
      ->group(g);
  cmd->add_option("--schedule", f.schedule, "gpipe|1f1b")->capture_default_str()->group(g);
  cmd->add_option("--microbatches", f.job.microbatches, "microbatches per replica's share of the global batch")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--compress-fwd", f.job.compress_fwd, "codec spec for activations on every link")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--compress-bwd", f.job.compress_bwd, "codec spec for activation gradients on every link")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--compress-link", f.job.compress_link,
                  "per-link override LINK:DIR=SPEC, e.g. 1-2:fwd=int4; or a replica link's group, "
                  "s1d0-s1d1=int4 (repeatable; docs/grid.md names links)")
      ->group(g);
  cmd->add_option("--compress-grad", f.job.compress_grad,
                  "codec spec for weight gradients averaged between replicas (dp > 1), e.g. int8, ef+int4")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--tp-split", f.job.tp_split,
                  "heads per tp shard: weights like 3:1 (shard 0 gets 3/4), or 'speed' (default: even)")
      ->group(g);
  cmd->add_option("--compress-tp", f.job.compress_tp,
                  "codec spec for the tp shards' partial sums (tp > 1), e.g. int8, bf16, lowrank:rank=8+int8")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--sync", f.job.sync,
                  "how replicas stay together: every-step, delayed:D=1[,predict=off] (each step's average applied D "
                  "steps later, the exchange under the next steps' compute), or "
                  "diloco:H=50,outer_lr=0.7,outer_momentum=0.9")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--metrics", f.metrics, "the job's JSON-lines metrics file (all workers)")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--token", f.token, "join/ctl token (default: --token-file, $LH_JOB_TOKEN)")->group(g);
  cmd->add_option("--token-file", f.token_file, "read the token from this file's first line")->group(g);
  cmd->add_option("--heartbeat-timeout", f.heartbeat_timeout_s, "seconds of silence before a worker is declared dead")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0))
      ->group(g);
  cmd->add_option("--stall-timeout", f.stall_timeout_s,
                  "seconds a data-plane link may move nothing while a worker waits on it before it is named as "
                  "stalled (judged per packet: one packet slower than this also counts; 0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 7.0 * 24 * 3600))
      ->group(g);

  const char* r = "Checkpoints and recovery";
  cmd->add_option("--checkpoint-dir", f.checkpoint_dir,
                  "commit a job checkpoint here (every worker's state) every --checkpoint-every steps and at the end")
      ->group(r);
  cmd->add_option("--checkpoint-every", f.checkpoint_every, "steps between job checkpoints (with --checkpoint-dir)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->group(r);
  cmd->add_option("--keep-checkpoints", f.keep_checkpoints, "committed checkpoints kept in --checkpoint-dir")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000))
      ->group(r);
  cmd->add_flag("--resume", f.resume,
                "start from the newest usable checkpoint in --checkpoint-dir (none: from step 0, with a warning)")
      ->group(r);
  cmd->add_option("--replace-timeout", f.replace_timeout_s,
                  "seconds a lost worker's place waits for a replacement before the job stops (0: a lost worker "
                  "stops the job); the job rolls back to its last checkpoint meanwhile")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 7.0 * 24 * 3600))
      ->group(r);
  cmd->add_flag("--elastic", f.elastic,
                "with --dp > 1: when a worker is lost and no standby waits, go on without its replica at once "
                "(dp − 1; that replica's other workers leave; its slice of each global batch is skipped, the "
                "learning rate is unchanged) instead of waiting for a replacement")
      ->group(r);

  add_model_flags(cmd, f.model, c);
}

PipelineJobConfig job_config_from_flags(const JobFlags& f, CLI::App* cmd) {
  PipelineJobConfig job = f.job;
  apply_model_flags(f.model, job.train);
  auto kind = parse_schedule_kind(f.schedule);
  if (!kind.ok()) fail("--schedule: " + kind.status().message(), 2);
  job.schedule = *kind;
  const bool workers_given = cmd->count("--workers") > 0, pp_given = cmd->count("--pp") > 0;
  // --tp or --dp alone is a one-stage job of that many workers.
  const bool grid_given = cmd->count("--tp") > 0 || cmd->count("--dp") > 0;
  if (!workers_given && !pp_given && !f.grid_has_defaults && !grid_given)
    fail("give --workers N (and optionally --pp S), or --tp / --dp", 2);
  if (!pp_given && workers_given) job.pp = job.workers / std::max(1, job.tp * job.dp);
  if (!workers_given) job.workers = job.pp * job.tp * job.dp;
  if (job.workers != job.pp * job.tp * job.dp)
    fail("--workers " + std::to_string(job.workers) +
             " must equal --pp × --tp × --dp = " + std::to_string(job.pp * job.tp * job.dp),
         2);
  if (job.train.model.layers < job.pp)
    fail("--pp " + std::to_string(job.pp) + ": more stages than the model's " + std::to_string(job.train.model.layers) +
             " blocks (use --layers)",
         2);
  if (!job.train.data.empty()) {
    std::ifstream in(job.train.data);
    if (!in) fail("--data '" + job.train.data + "': cannot read the file", 2);
  }
  if (f.resume && f.checkpoint_dir.empty())
    fail("--resume needs --checkpoint-dir (where the job's checkpoints are)", 2);
  if (cmd->count("--checkpoint-every") > 0 && f.checkpoint_dir.empty())
    fail("--checkpoint-every needs --checkpoint-dir", 2);
  job.checkpoint_every = f.checkpoint_dir.empty() ? 0 : f.checkpoint_every;
  Status s = job.validate();
  if (!s.ok()) fail(s.message(), 2);
  return job;
}

std::string resolve_token(const std::string& token, const std::string& token_file, bool generate) {
  if (!token.empty()) return token;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    std::string line;
    if (!in || !std::getline(in, line)) fail("--token-file '" + token_file + "': cannot read a token from it", 2);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) fail("--token-file '" + token_file + "': the first line is empty", 2);
    return line;
  }
  if (const char* env = std::getenv("LH_JOB_TOKEN"); env && *env) return env;
  if (!generate) return "";
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + 8 * i, 9, "%08x", rd());
  return buf;
}

CoordinatorOptions control_options(const std::string& listen, const std::string& token, double heartbeat_timeout_s) {
  CoordinatorOptions o;
  o.listen = listen;
  o.token = token;
  o.heartbeat_timeout = std::chrono::milliseconds(int64_t(heartbeat_timeout_s * 1000));
  o.heartbeat_interval = std::max(std::chrono::milliseconds(20), o.heartbeat_timeout / 10);
  return o;
}

PipelineCoordinatorOptions coordinator_options(const JobFlags& f, const std::string& listen, const std::string& token) {
  PipelineCoordinatorOptions o;
  o.control = control_options(listen, token, f.heartbeat_timeout_s);
  o.control.replace_timeout = std::chrono::milliseconds(int64_t(f.replace_timeout_s * 1000));
  o.control.stall_timeout = std::chrono::milliseconds(int64_t(f.stall_timeout_s * 1000));
  o.metrics_path = f.metrics;
  o.checkpoint_dir = f.checkpoint_dir;
  o.keep_checkpoints = f.keep_checkpoints;
  o.resume = f.resume;
  o.elastic = f.elastic;
  return o;
}

std::string resume_hint(const PipelineCoordinator& coord, const JobFlags& f, const std::string& command) {
  if (f.checkpoint_dir.empty()) return "";
  const int64_t step = coord.last_checkpoint();
  return (step > 0 ? "its last checkpoint is step " + std::to_string(step) + " in '" + f.checkpoint_dir + "'"
                   : "no checkpoint was committed in '" + f.checkpoint_dir + "'") +
         "; to go on, run the same `longhaul " + command + "` command with --resume";
}

void print_progress(const PipelineCoordinator& coord, int64_t steps, int64_t& last_printed) {
  auto s = coord.summary();
  if (!s.ok() || s->loss.empty() || s->loss.back().step <= last_printed) return;
  last_printed = s->loss.back().step;
  double tps = s->tokens_per_s.empty() ? 0 : s->tokens_per_s.back().value;
  std::string val;
  if (!s->val_loss.empty() && s->val_loss.back().step == last_printed) {
    char b[32];
    std::snprintf(b, sizeof(b), "  val %.4f", s->val_loss.back().value);
    val = b;
  }
  std::printf("step %lld/%lld  loss %.4f%s  %.0f tok/s\n", static_cast<long long>(last_printed),
              static_cast<long long>(steps), s->loss.back().value, val.c_str(), tps);
  std::fflush(stdout);
}

void print_job_summary(const PipelineCoordinator& coord, const std::string& metrics_path) {
  auto s = coord.summary();
  if (!s.ok()) {
    std::printf("no summary: %s\n", s.status().message().c_str());
    return;
  }
  std::printf("\nlink traffic\n%s", format_link_table(*s).c_str());
  std::printf("\nsteps\n%s", format_step_summary(*s).c_str());
  if (!metrics_path.empty()) std::printf("metrics: %s\n", metrics_path.c_str());
  std::fflush(stdout);
}

}  // namespace lh::app
