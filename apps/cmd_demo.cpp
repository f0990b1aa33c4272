// `longhaul demo`: what longhaul is for, in about two minutes on two cores — a 4-stage pipeline job in four
// worker processes over emulated slow links, activations and their gradients compressed, one codec switched
// live half-way, then the per-link table of bytes saved and a plot. The README's run command.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "apps/launch.h"
#include "compress/spec.h"
#include "metrics/metrics_plot.h"
#include "metrics/metrics_summary.h"
#include "metrics/step_metrics.h"

namespace lh::app {
namespace {

struct DemoFlags {
  LaunchFlags launch;
  int64_t switch_at = -1;  // -1: half the steps
  std::string switch_to = "int4";
  std::string png = "demo.png";
};

// Bytes over the pipeline links (activations and their gradients) against fp32.
void print_savings(const MetricsSummary& s) {
  uint64_t raw = 0, wire = 0;
  for (const LinkTotals& t : s.links)
    if (t.role == "act" || t.role == "act_grad") {
      raw += t.raw_bytes;
      wire += t.wire_bytes;
    }
  if (wire == 0) return;
  std::printf("\nthe stage links carried %.2f MB where fp32 would have sent %.2f MB: %.1fx fewer bytes\n",
              double(wire) / 1e6, double(raw) / 1e6, double(raw) / double(wire));
}

void run_demo(DemoFlags& f, CLI::App* cmd) {
  JobFlags& j = f.launch.job;
  if (auto spec = compress::parse_stages(f.switch_to); !spec.ok()) fail("--switch-to: " + spec.status().message(), 2);
  std::vector<ScheduledSwitch> switches;
  const int64_t steps = j.job.train.steps;
  const int64_t at = f.switch_at < 0 ? steps / 2 : f.switch_at;
  if (at > 0 && at < steps) switches.push_back({at, "", "fwd", f.switch_to});  // every forward link
  std::printf(
      "longhaul demo: one model split into pipeline stages, one worker process per stage, joined by\n"
      "emulated slow links; what crosses a link is compressed, and every link counts its bytes.\n\n");
  std::fflush(stdout);
  run_launch(f.launch, cmd, switches);

  auto records = read_step_metrics_file(j.metrics);
  if (!records.ok()) fail(records.status().message());
  auto summary = summarize_step_metrics(*records);
  if (!summary.ok()) fail(j.metrics + ": " + summary.status().message());
  print_savings(*summary);
  if (!f.png.empty()) {
    Status s = render_metrics_png(*summary, f.png, "longhaul demo");
    if (s.ok())
      std::printf("plot: %s (loss, and raw vs wire bytes per link; redraw with `longhaul report %s --png %s`)\n",
                  f.png.c_str(), j.metrics.c_str(), f.png.c_str());
    else
      std::printf("no plot: %s\n", s.message().c_str());
  }
  std::printf("the page, after the job: `longhaul report %s --html demo.html`, then open demo.html\n",
              j.metrics.c_str());
  std::printf("next: `longhaul launch --help` for your own jobs, `longhaul train` for the single-process reference\n");
  std::fflush(stdout);
}

RegisterCommand reg("", 5, [](CLI::App& app) {
  auto f = std::make_shared<DemoFlags>();
  JobFlags& j = f->launch.job;
  j.grid_has_defaults = true;
  j.job.workers = j.job.pp = 4;
  j.job.microbatches = 4;
  j.job.compress_fwd = "int8";
  j.job.compress_bwd = "int8";
  j.job.train.steps = 120;
  j.job.train.eval_every = 40;
  j.job.links = {"20M,20ms"};
  j.http = "127.0.0.1:0";  // a live page on a free loopback port (its address is printed; --http '' for none)
  auto* cmd = app.add_subcommand(
      "demo", "a 4-stage job over emulated 20 Mbit/s links with compression: the bytes it saves (~2 min)");
  add_launch_flags(cmd, f->launch, "demo_metrics.jsonl");
  cmd->add_option("--switch-at", f->switch_at,
                  "switch every forward link's codec after this step (default: half-way; 0: never)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 30));
  cmd->add_option("--switch-to", f->switch_to, "the codec the forward links switch to")->capture_default_str();
  cmd->add_option("--png", f->png, "draw loss and bytes per link here (needs gnuplot; '' for none)")
      ->capture_default_str();
  cmd->callback([f, cmd] { run_demo(*f, cmd); });
});

}  // namespace
}  // namespace lh::app
