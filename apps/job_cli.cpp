// The job flags of `launch` and `coordinator`, their JobConfig, the token, and the progress and
// summary printing at the end of a job. Used by apps/cmd_launch.cpp and apps/cmd_coordinator.cpp.
#include "apps/job_cli.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "apps/commands.h"
#include "compress/spec.h"
#include "core/log.h"
#include "metrics/metrics_summary.h"

namespace lh::app {

namespace {

// add_job_flags' groups, in the order --help lists them. Each is a flat table of CLI11 registrations.

// The grid and its schedule: --workers, --pp, --tp, --dp, --partition, --schedule, --microbatches.
void add_grid_flags(CLI::App* cmd, JobFlags& f, const char* g) {
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
                  "blocks per stage, e.g. 3,3,2; 'speed': by reported speed; 'auto': planned from the reported "
                  "speeds, --slowdown, --link and the codecs (longhaul plan's model) (default: even)")
      ->group(g);
  cmd->add_option(
         "--schedule", f.schedule,
         "gpipe|1f1b|eager|async (eager: each stage runs what has arrived, backwards first, for slow, distant links; "
         "async: eager over two steps at once, each step computing with weights one update older, PipeDream-2BW; "
         "async:predict: the same with the update in flight extrapolated from the last one)")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--microbatches", f.job.microbatches, "microbatches per replica's share of the global batch")
      ->capture_default_str()
      ->group(g);
}

// The codecs of every link, replica group and tp group, auto's ladders, and --sync.
void add_codec_flags(CLI::App* cmd, JobFlags& f, const char* g) {
  cmd->add_option("--compress-fwd", f.job.compress_fwd,
                  "codec spec for activations on every link (or preset:lossless|safe|balanced), or auto: the auto "
                  "links' codecs of --auto-ladder, chosen together by the step the pipeline simulator predicts from "
                  "what the job measured (the least lossy within --auto-tolerance of the fastest), re-decided every "
                  "--auto-every steps")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--compress-bwd", f.job.compress_bwd, "codec spec for activation gradients on every link, or auto")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--compression", f.compression,
                  "a point of the compression frontier (scripts/bench_frontier.sh) for both directions: "
                  "lossless|safe|balanced (the codec presets), or frontier (a subspace model, --subspace-k = "
                  "d_model/8, with int4+zstd: the most bytes saved within 2% validation loss)")
      ->group(g);
  cmd->add_option("--auto-ladder", f.job.auto_ladder, "the codecs auto chooses from, least lossy first")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--auto-every", f.job.auto_every, "steps between auto's decisions")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000))
      ->group(g);
  cmd->add_option("--auto-tolerance", f.job.auto_tolerance,
                  "auto on pipeline links: a codec is taken over a less lossy one only when the planner's predicted "
                  "step (the pipeline simulator, from the measured rates, latencies and compute) is shorter by more "
                  "than this share")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1.0))
      ->group(g);
  cmd->add_option("--auto-fit", f.job.auto_fit,
                  "auto on gradient exchanges (--compress-grad auto): the share of the pipeline's compute per "
                  "microbatch an exchange may take")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 4.0))
      ->group(g);
  cmd->add_option("--compress-link", f.job.compress_link,
                  "per-link override LINK:DIR=SPEC, e.g. 1-2:fwd=int4; or a replica link's group, "
                  "s1d0-s1d1=int4 (repeatable; docs/grid.md names links)")
      ->group(g);
  cmd->add_option("--compress-grad", f.job.compress_grad,
                  "codec spec for weight gradients averaged between replicas (dp > 1), e.g. int8, ef+int4; or auto: "
                  "per stage's replica group, the least lossy of --auto-grad-ladder whose exchange fits under "
                  "--auto-fit of the compute per microbatch, re-decided every --auto-every steps")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--auto-grad-ladder", f.job.auto_grad_ladder,
                  "the gradient codecs auto chooses from, least lossy first")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--tp-split", f.job.tp_split,
                  "heads per tp shard: weights like 3:1 (shard 0 gets 3/4), or 'speed' (default: even)")
      ->group(g);
  cmd->add_option("--dp-split", f.job.dp_split,
                  "how the global batch is shared among the replicas: weights like 3:1 (replica 0 takes 3/4), or "
                  "'speed' (by each replica's slowest worker's reported speed over --slowdown); each share a "
                  "multiple of --microbatches, gradients weighted so the update is the whole batch's (default: equal)")
      ->group(g);
  cmd->add_option("--compress-tp", f.job.compress_tp,
                  "codec spec for the tp shards' partial sums (tp > 1), e.g. int8, bf16, lowrank:rank=8+int8; or "
                  "auto: the least lossy of --auto-tp-ladder whose step is within 5% of the fastest codec's")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--auto-tp-ladder", f.job.auto_tp_ladder, "the tp codecs auto chooses from, least lossy first")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--sync", f.job.sync,
                  "how replicas stay together: every-step, delayed:D=1[,predict=off] (each step's average applied D "
                  "steps later, the exchange under the next steps' compute), or "
                  "diloco:H=50,outer_lr=0.7,outer_momentum=0.9")
      ->capture_default_str()
      ->group(g);
}

// The metrics file, the job secret and the data plane's packet protection.
void add_security_flags(CLI::App* cmd, JobFlags& f, const char* g) {
  cmd->add_option("--metrics", f.metrics, "the job's JSON-lines metrics file (all workers)")
      ->capture_default_str()
      ->group(g);
  add_secret_flags(cmd, f.secret, g);
  auto* enc = cmd->add_flag("--encrypt-data", f.encrypt_data,
                            "encrypt data-plane packets too (AES-256-GCM where both machines have AES-NI, else "
                            "ChaCha20-Poly1305); without it packets are authenticated but travel in clear")
                  ->group(g);
  cmd->add_flag("--no-data-auth", f.no_data_auth,
                "send data-plane packets without a MAC: anyone who can reach a worker's data port can inject "
                "activations and gradients (trusted networks and benchmarks only)")
      ->excludes(enc)
      ->group(g);
}

// Emulated links and compute (tests and demos).
void add_emulation_flags(CLI::App* cmd, JobFlags& f) {
  const char* e = "Emulation (tests and demos)";
  cmd->add_option("--link", f.job.links,
                  "shape the workers' outgoing links in process: RATE[,DELAY] for every link (20M,30ms), or "
                  "LINK[:DIR]=RATE[,DELAY] for the links a name selects (0-1=100M,5ms, 1-2:bwd=5M,80ms, "
                  "s0d0-s0d1=1G); repeat it, later ones win; `ctl set-link` changes them while the job runs")
      ->group(e);
  cmd->add_option("--slowdown", f.job.slowdown,
                  "RANK=FACTOR: that worker's forward and backward compute takes FACTOR times as long (it sleeps "
                  "the difference after each); repeat it for several ranks")
      ->group(e);
}

// The live page, heartbeats and stalls, and the relay.
void add_control_flags(CLI::App* cmd, JobFlags& f, const char* g) {
  cmd->add_option("--http", f.http,
                  "serve a live page of the job at ADDR:PORT, with /metrics for Prometheus and /api/status "
                  "(127.0.0.1:8080; :0 picks a free port; any address beyond 127.0.0.1 needs the page token, "
                  "which `longhaul ctl page-url` prints: put TLS or an ssh tunnel in front of it)")
      ->group(g);
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
  cmd->add_flag("--no-relay", f.no_relay,
                "no relay: a pair of workers that cannot connect directly (NAT, a firewall) ends the job at its "
                "pre-flight, named, instead of going through the coordinator's host")
      ->group(g);
  cmd->add_option("--relay-port", f.relay_port,
                  "TCP port of the relay on the coordinator's host, for pairs of workers that cannot connect directly "
                  "(default: the --listen port + 1, any free port when that is '*')")
      ->check(CLI::Range(1, 65535))
      ->group(g);
  cmd->add_option("--relay", f.relay_at,
                  "tcp://HOST:PORT of a relay run elsewhere (`longhaul relay` on a machine every worker reaches) for "
                  "the pairs that cannot connect directly; the coordinator then runs none")
      ->group(g);
  cmd->add_option("--relay-key-file", f.relay_key_file,
                  "with --relay: a key file (`longhaul keygen`) given to that relay too and to no worker; each "
                  "worker's hello then binds only its own rank even against a member of the job (without it, "
                  "against strangers only)")
      ->group(g);
}

// Job checkpoints, --resume, replacements and --elastic.
void add_checkpoint_flags(CLI::App* cmd, JobFlags& f) {
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
}

}  // namespace

void add_job_flags(CLI::App* cmd, JobFlags& f, const std::string& metrics_default) {
  TrainConfig& c = f.job.train;
  f.metrics = metrics_default;
  const char* g = "Job";
  add_grid_flags(cmd, f, g);
  add_codec_flags(cmd, f, g);
  add_security_flags(cmd, f, g);
  add_emulation_flags(cmd, f);
  add_control_flags(cmd, f, g);
  add_checkpoint_flags(cmd, f);
  add_model_flags(cmd, f.model, c);
}

namespace {

// --compression NAME: the codecs of both directions (and, for frontier, the subspace model) from the frontier.
void apply_compression(const std::string& name, CLI::App* cmd, JobConfig* job) {
  for (const char* flag : {"--compress-fwd", "--compress-bwd"})
    if (cmd->count(flag) > 0) fail("--compression " + name + " sets " + flag + " itself; give one or the other", 2);
  std::string spec;
  if (name == "frontier") {
    if (cmd->count("--subspace-k") > 0)
      fail("--compression frontier sets --subspace-k itself (d_model/8); give one or the other", 2);
    GptConfig& m = job->train.model;
    m.subspace_k = std::max(1, m.d_model / 8);
    spec = "int4+zstd";
  } else {
    const compress::CodecPreset* p = compress::find_preset(name);
    if (!p) {
      std::string allowed;
      for (const compress::CodecPreset& q : compress::codec_presets()) allowed += std::string(q.name) + ", ";
      fail("--compression '" + name + "': choose " + allowed + "or frontier", 2);
    }
    spec = p->spec;
  }
  job->compress_fwd = job->compress_bwd = spec;
}

}  // namespace

JobConfig job_config_from_flags(const JobFlags& f, CLI::App* cmd) {
  JobConfig job = f.job;
  job.data_protection = f.encrypt_data ? "aead" : f.no_data_auth ? "none" : "mac";
  if (f.no_data_auth)
    LH_LOG_WARN("--no-data-auth: data-plane packets carry no MAC; anyone who can reach a worker can inject them");
  apply_model_flags(f.model, job.train);
  if (!f.compression.empty()) apply_compression(f.compression, cmd, &job);
  for (std::string* spec : {&job.compress_fwd, &job.compress_bwd, &job.compress_grad, &job.compress_tp})
    *spec = compress::expand_preset(*spec);
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
  if (job.schedule == ScheduleKind::kEager && job.tp > 1)
    fail("--schedule eager with --tp " + std::to_string(job.tp) +
             ": a stage's tensor shards must run their blocks in one order, and eager lets each choose; use 1f1b or "
             "gpipe",
         2);
  if (is_async(job.schedule)) {
    std::string what;
    if (job.tp > 1) what = "--tp";
    if (job.dp > 1) what = "--dp";
    if (job.train.model.subspace_k > 0) what = "--subspace-k";
    if (!f.checkpoint_dir.empty()) what = "--checkpoint-dir";
    if (job.sync != "every-step") what = "--sync";
    if (!what.empty())
      fail("--schedule " + f.schedule + " with " + what +
               ": the async schedule runs one pipeline of a plain model without checkpoints (for now); use eager",
           2);
  }
  if (job.train.model.layers < job.pp)
    fail("--pp " + std::to_string(job.pp) + ": more stages than the model's " + std::to_string(job.train.model.layers) +
             " blocks (use --layers)",
         2);
  if (!job.train.data.empty()) {
    std::ifstream in(job.train.data);
    if (!in) fail("--data '" + job.train.data + "': cannot read the file", 2);
  }
  if (f.elastic && !job.dp_split.empty())
    fail("--elastic with --dp-split is not supported: a lost replica's share would be skipped unevenly", 2);
  if (f.resume && f.checkpoint_dir.empty())
    fail("--resume needs --checkpoint-dir (where the job's checkpoints are)", 2);
  if (cmd->count("--checkpoint-every") > 0 && f.checkpoint_dir.empty())
    fail("--checkpoint-every needs --checkpoint-dir", 2);
  job.checkpoint_every = f.checkpoint_dir.empty() ? 0 : f.checkpoint_every;
  Status s = job.validate();
  if (!s.ok()) fail(s.message(), 2);
  return job;
}

void add_secret_flags(CLI::App* cmd, SecretFlags& f, const std::string& group) {
  auto* key = cmd->add_option("--key-file", f.key_file,
                              "the job secret: a file from `longhaul keygen` (default: $LH_JOB_KEY; a coordinator "
                              "without one makes one next to --metrics)");
  auto* file = cmd->add_option("--token-file", f.token_file, "deprecated: --key-file");
  auto* text = cmd->add_option("--token", f.token,
                               "deprecated: the job secret itself, on the command line where `ps` shows it; use "
                               "--key-file");
  if (!group.empty())
    for (auto* o : {key, file, text}) o->group(group);
}

JobSecret load_secret_file(const std::string& path, const std::string& flag, bool* weak) {
  auto s = JobSecret::load(path, flag, weak);
  if (!s.ok()) fail(s.status().message(), 2);
  return *s;
}

std::optional<JobSecret> resolve_secret(const SecretFlags& f) {
  bool weak = false;
  std::optional<JobSecret> secret;
  if (!f.key_file.empty() || !f.token_file.empty()) {
    const bool key = !f.key_file.empty();
    secret = load_secret_file(key ? f.key_file : f.token_file, key ? "--key-file" : "--token-file", &weak);
  } else if (!f.token.empty()) {
    LH_LOG_WARN(
        "--token puts the job secret on the command line, where `ps` shows it to every user of this machine; use "
        "--key-file (`longhaul keygen FILE` makes one)");
    auto s = JobSecret::parse(f.token, &weak);
    if (!s.ok()) fail("--token: " + s.status().message(), 2);
    secret = *s;
  } else {
    for (const char* name : {"LH_JOB_KEY", "LH_JOB_TOKEN"})
      if (const char* env = std::getenv(name); env && *env) {
        auto s = JobSecret::parse(env, &weak);
        if (!s.ok()) fail(std::string("$") + name + ": " + s.status().message(), 2);
        secret = *s;
        break;
      }
  }
  if (secret && weak)
    LH_LOG_WARN(
        "the job secret is not a key from `longhaul keygen` (64 hex digits): the job's keys are derived from its "
        "text, which makes them only as strong as that text");
  return secret;
}

JobSecret required_secret(const SecretFlags& f, const std::string& command) {
  auto s = resolve_secret(f);
  if (!s)
    fail(command +
             ": no job secret: give --key-file FILE (the key file the coordinator names when it starts; copy it "
             "here) or set $LH_JOB_KEY",
         2);
  return *s;
}

JobSecret coordinator_secret(const SecretFlags& f, const std::string& metrics, std::string* path, bool* wrote) {
  *wrote = false;
  *path = !f.key_file.empty() ? f.key_file : f.token_file;
  if (auto s = resolve_secret(f)) return *s;
  // Never an open job: a secret of its own, kept next to the metrics (a restarted coordinator finds it again).
  std::string base = metrics.empty() ? std::string("longhaul-job") : metrics;
  const size_t slash = base.rfind('/'), dot = base.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) base.resize(dot);
  *path = base + ".key";
  if (::access(path->c_str(), F_OK) == 0) {
    return load_secret_file(*path, "the job's key file");
  }
  JobSecret s = JobSecret::generate();
  Status saved = s.save_new(*path);
  if (!saved.ok()) fail("cannot write the job's key file: " + saved.message() + " (or give --key-file)", 2);
  *wrote = true;
  return s;
}

CoordinatorOptions control_options(const std::string& listen, const JobSecret& secret, double heartbeat_timeout_s) {
  CoordinatorOptions o;
  o.listen = listen;
  o.token = secret.join_proof();
  o.curve = secret.server_curve();
  o.relay_rank_key = secret.relay_rank_key();  // what `longhaul relay` derives from the same secret
  o.heartbeat_timeout = std::chrono::milliseconds(int64_t(heartbeat_timeout_s * 1000));
  o.heartbeat_interval = std::max(std::chrono::milliseconds(20), o.heartbeat_timeout / 10);
  return o;
}

void print_page_address(const JobCoordinator& coord, const std::string& key_path) {
  const HttpServer* http = coord.http();
  if (!http) return;
  std::printf("live page: %s  (Prometheus: %smetrics)\n", http->url().c_str(), http->url().c_str());
  if (http->needs_token())
    std::printf("  beyond loopback the page needs its token: longhaul ctl --coordinator %s --key-file %s page-url\n",
                coord.endpoint().c_str(), key_path.empty() ? "<the job's key file>" : key_path.c_str());
}

JobCoordinatorOptions coordinator_options(const JobFlags& f, const std::string& listen, const JobSecret& secret) {
  JobCoordinatorOptions o;
  o.control = control_options(listen, secret, f.heartbeat_timeout_s);
  o.control.replace_timeout = std::chrono::milliseconds(int64_t(f.replace_timeout_s * 1000));
  o.control.stall_timeout = std::chrono::milliseconds(int64_t(f.stall_timeout_s * 1000));
  o.http = f.http;
  o.http_token = secret.page_token();
  if (f.no_relay && f.relay_port > 0) fail("--no-relay and --relay-port exclude each other: choose one", 2);
  o.control.relay = !f.no_relay;
  if (!f.relay_at.empty()) {
    if (f.no_relay || f.relay_port > 0) fail("--relay excludes --no-relay and --relay-port: choose one", 2);
    auto at = parse_tcp_endpoint(f.relay_at);
    if (!at.ok()) fail("--relay '" + f.relay_at + "': " + at.status().message(), 2);
    o.control.relay_at = f.relay_at;
    if (!f.relay_key_file.empty())
      o.control.relay_rank_key = load_secret_file(f.relay_key_file, "--relay-key-file").relay_rank_key();
  } else if (!f.relay_key_file.empty()) {
    fail("--relay-key-file is for a relay run elsewhere (--relay tcp://HOST:PORT); the coordinator's own relay keys "
         "each rank's hello by itself",
         2);
  }
  if (f.relay_port > 0) {
    auto at = parse_tcp_endpoint(listen, /*any_port=*/true);
    if (!at.ok())
      fail("--relay-port needs a tcp:// --listen address; --listen '" + listen + "': " + at.status().message(), 2);
    o.control.relay_listen = at->with_port(f.relay_port);
  }
  o.metrics_path = f.metrics;
  o.checkpoint_dir = f.checkpoint_dir;
  o.keep_checkpoints = f.keep_checkpoints;
  o.resume = f.resume;
  o.elastic = f.elastic;
  return o;
}

std::string resume_hint(const JobCoordinator& coord, const JobFlags& f, const std::string& command) {
  if (f.checkpoint_dir.empty()) return "";
  const int64_t step = coord.last_checkpoint();
  return (step > 0 ? "its last checkpoint is step " + std::to_string(step) + " in '" + f.checkpoint_dir + "'"
                   : "no checkpoint was committed in '" + f.checkpoint_dir + "'") +
         "; to go on, run the same `longhaul " + command + "` command with --resume";
}

void print_progress(const JobCoordinator& coord, int64_t steps, int64_t& last_printed, int loss_reporters) {
  auto s = coord.summary();
  if (!s.ok() || s->loss.empty()) return;
  // The newest step whose loss every replica has reported: a step seen from one replica alone would
  // print that replica's loss, not the job's. A step two behind the newest is taken as it is (a job
  // that lost a replica has fewer reporters from then on).
  const int64_t newest = s->loss.back().step;
  auto point = std::find_if(s->loss.rbegin(), s->loss.rend(),
                            [&](const StepPoint& p) { return p.count >= loss_reporters || p.step + 2 <= newest; });
  if (point == s->loss.rend() || point->step <= last_printed) return;
  last_printed = point->step;
  double tps = 0;
  for (const StepPoint& t : s->tokens_per_s)
    if (t.step == last_printed) tps = t.value;
  std::string val;
  if (!s->val_loss.empty() && s->val_loss.back().step == last_printed) {
    char b[32];
    std::snprintf(b, sizeof(b), "  val %.4f", s->val_loss.back().value);
    val = b;
  }
  std::printf("step %lld/%lld  loss %.4f%s  %.0f tok/s\n", static_cast<long long>(last_printed),
              static_cast<long long>(steps), point->value, val.c_str(), tps);
  std::fflush(stdout);
}

void print_job_summary(const JobCoordinator& coord, const std::string& metrics_path) {
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

namespace {
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) {
  g_stop_signal = sig;
}
}  // namespace

void catch_stop_signals(std::initializer_list<int> signals, bool restart) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = restart ? SA_RESTART : 0;
  for (int sig : signals) sigaction(sig, &sa, nullptr);
}

int stop_signal() {
  return g_stop_signal;
}

int preempt_or_stop_signal(JobCoordinator& coord, bool& preempting, const char* lead, const std::string& reason) {
  if (g_stop_signal == SIGTERM && !preempting) {
    // What a scheduler sends before its kill: the job saves a checkpoint and stops (a second signal stops it now).
    preempting = true;
    g_stop_signal = 0;
    std::printf("%sSIGTERM: the job saves a checkpoint and stops (send it again to stop at once)\n", lead);
    std::fflush(stdout);
    coord.preempt(reason);
  }
  return g_stop_signal;
}

}  // namespace lh::app
