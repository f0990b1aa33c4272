// `longhaul coordinator --listen tcp://HOST:PORT --workers N [job flags]`: plans a pipeline job for the
// workers that join, gathers their metrics, serves `longhaul ctl`, and prints the job's tables at the end.
#include <csignal>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "apps/job_cli.h"
#include "core/log.h"

namespace lh::app {
namespace {

struct CoordinatorFlags {
  JobFlags job;
  std::string listen = "tcp://0.0.0.0:5555";
};

void run_coordinator(CoordinatorFlags& f, CLI::App* cmd) {
  JobConfig job = job_config_from_flags(f.job, cmd);
  if (f.listen.rfind("tcp://", 0) != 0) fail("--listen '" + f.listen + "': expected tcp://HOST:PORT", 2);
  std::string key_path;
  bool wrote = false;
  const JobSecret secret = coordinator_secret(f.job.secret, f.job.metrics, &key_path, &wrote);
  set_log_role("coordinator");
  auto coord = JobCoordinator::start(job, coordinator_options(f.job, f.listen, secret));
  if (!coord.ok()) fail("--listen " + f.listen + ": " + coord.status().to_string());
  std::printf(
      "longhaul coordinator: %s, %d workers (pp %d × tp %d × dp %d), %lld steps, schedule %s, %d microbatches\n",
      job.train.model.describe().c_str(), job.workers, job.pp, job.tp, job.dp, static_cast<long long>(job.train.steps),
      schedule_kind_name(job.schedule), job.microbatches);
  if (wrote)
    std::printf("wrote a new job secret to %s (mode 0600): copy it to each worker's machine\n", key_path.c_str());
  std::printf(
      "listening on %s (encrypted; only holders of the job secret get in); start each worker with:\n"
      "  longhaul worker --coordinator tcp://<this host>:%s --key-file %s\n",
      (*coord)->endpoint().c_str(), (*coord)->endpoint().substr((*coord)->endpoint().rfind(':') + 1).c_str(),
      key_path.empty() ? "<the job's key file>" : key_path.c_str());
  print_page_address(**coord, key_path);
  if ((*coord)->resumed_from() > 0)
    std::printf("resuming from the checkpoint of step %lld in '%s'\n", static_cast<long long>((*coord)->resumed_from()),
                f.job.checkpoint_dir.c_str());
  std::fflush(stdout);
  catch_stop_signals({SIGINT, SIGTERM}, /*restart=*/true);
  int64_t printed = 0;
  Status result = unavailable("not finished");
  bool preempting = false;
  for (;;) {
    result = (*coord)->wait(std::chrono::milliseconds(200));
    if (result.code() != StatusCode::kUnavailable || result.message() != "the job did not finish within the timeout")
      break;
    print_progress(**coord, job.train.steps, printed, job.dp);
    if (const int sig = preempt_or_stop_signal(**coord, preempting, "\n", "the coordinator was sent SIGTERM")) {
      std::printf("\nstopping: signal %d; the workers are told to stop\n", sig);
      result = unavailable("interrupted by signal " + std::to_string(sig));
      (*coord)->stop("the coordinator was stopped by signal " + std::to_string(sig));
      break;
    }
  }
  print_progress(**coord, job.train.steps, printed, job.dp);
  print_job_summary(**coord, f.job.metrics);
  if (!result.ok()) {
    const std::string hint = resume_hint(**coord, f.job, "coordinator");
    if ((*coord)->preempted())  // EX_TEMPFAIL: try again (a scheduler's requeue, or the same command with --resume)
      fail("the job stopped: " + result.message() + (hint.empty() ? "" : "\n" + hint), kPreemptedExitCode);
    fail("the job failed: " + result.message() + (hint.empty() ? "" : "\n" + hint));
  }
}

RegisterCommand reg("", 30, [](CLI::App& app) {
  auto f = std::make_shared<CoordinatorFlags>();
  auto* cmd = app.add_subcommand("coordinator", "run a pipeline job's coordinator for workers on other machines");
  cmd->add_option("--listen", f->listen, "tcp://HOST:PORT to bind (PORT '*': any free port)")->capture_default_str();
  add_job_flags(cmd, f->job, "coordinator_metrics.jsonl");
  cmd->callback([f, cmd] { run_coordinator(*f, cmd); });
});

}  // namespace
}  // namespace lh::app
