// `longhaul report METRICS.jsonl [--png FILE] [--html FILE]`: the per-link bytes table (raw vs wire, ratio, busy
// time), the loss and tokens/s summary and codec changes of a job's metrics, optionally plotted.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "metrics/job_history.h"
#include "metrics/metrics_plot.h"
#include "metrics/metrics_summary.h"
#include "metrics/step_metrics.h"
#include "web/page.h"

namespace lh::app {
namespace {

struct ReportOptions {
  std::string metrics;
  std::string png;
  std::string html;
  int rows = 10;
};

void run_report(const ReportOptions& o) {
  auto records = read_step_metrics_file(o.metrics);
  if (!records.ok()) fail(records.status().message());
  auto summary = summarize_step_metrics(*records);
  if (!summary.ok()) fail(o.metrics + ": " + summary.status().message());
  std::printf("%s\n", o.metrics.c_str());
  std::printf("\nlink traffic\n%s", format_link_table(*summary).c_str());
  std::printf("\nsteps\n%s", format_step_summary(*summary, o.rows).c_str());
  if (!o.png.empty()) {
    Status s = render_metrics_png(*summary, o.png, "longhaul: " + o.metrics);
    if (!s.ok()) fail("--png " + o.png + ": " + s.message());
    std::printf("\nwrote %s\n", o.png.c_str());
  }
  if (!o.html.empty()) {
    const std::string page = report_page_html(report_page_data(*records, *summary, "report of " + o.metrics));
    std::FILE* f = std::fopen(o.html.c_str(), "wb");
    if (!f || std::fwrite(page.data(), 1, page.size(), f) != page.size() || std::fclose(f) != 0)
      fail("--html " + o.html + ": cannot write it (" + std::string(std::strerror(errno)) + ")");
    std::printf("\nwrote %s (the live page, with this job's data inside: open it in a browser)\n", o.html.c_str());
  }
  std::fflush(stdout);
}

RegisterCommand reg("", 70, [](CLI::App& app) {
  auto opts = std::make_shared<ReportOptions>();
  auto* cmd = app.add_subcommand("report", "tables and plots of a job's loss and per-link bytes (raw vs wire)");
  cmd->add_option("metrics", opts->metrics, "metrics file: JSON lines from train, launch or the coordinator")
      ->required();
  cmd->add_option("--png", opts->png,
                  "also draw loss vs step and cumulative raw vs wire bytes per link into this PNG (needs gnuplot)");
  cmd->add_option("--html", opts->html,
                  "also write the job's page (the one `--http` serves live) with this file's data inside, to open in "
                  "a browser");
  cmd->add_option("--rows", opts->rows, "loss rows in the step summary")
      ->check(CLI::Range(2, 1000))
      ->capture_default_str();
  cmd->callback([opts] { run_report(*opts); });
});

}  // namespace
}  // namespace lh::app
