// defines: plots of a job's step metrics — loss vs step and wire MB per step for every link — drawn
// by gnuplot from a generated script. Used by `longhaul report --png`.
#pragma once

#include <string>

#include "core/status.h"
#include "parallel/metrics_summary.h"

namespace lh {

// Writes loss.dat, wire.dat and plot.gp into `dir` (which must exist); plot.gp draws into png_path.
// Panels without data are left out; with neither loss nor link traffic there is nothing to draw
// and the result is an error. Returns the script's path.
Result<std::string> write_metrics_gnuplot(const MetricsSummary& summary, const std::string& dir,
                                          const std::string& png_path, const std::string& title);

// Writes the files into a fresh temporary folder, runs `gnuplot_program` on the script, checks that
// a PNG came out and removes the folder. A missing gnuplot, a failing run (its messages quoted) or
// an unwritable png_path is an error that says so.
Status render_metrics_png(const MetricsSummary& summary, const std::string& png_path, const std::string& title,
                          const std::string& gnuplot_program = "gnuplot");

}  // namespace lh
