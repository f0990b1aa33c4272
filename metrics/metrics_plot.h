// defines: plots of a job's step metrics — loss vs step, and per link and direction the cumulative
// raw and wire bytes with its codecs and the steps they changed — drawn by gnuplot from a generated
// script. Used by `longhaul report --png`.
#pragma once

#include <string>

#include "core/status.h"
#include "metrics/metrics_summary.h"

namespace lh {

// Writes loss.dat, links.dat and plot.gp into `dir` (which must exist); plot.gp draws into png_path.
// The bytes panel has one colour per row of folded_links (the `other` pairs summed into one line):
// cumulative wire bytes solid, cumulative raw (fp32) bytes dashed, the key naming the link, its
// direction and its codecs ("0→1 fwd int8→int4"), and a dotted line labelled with the new codec at
// each codec switch. links.dat holds one block per row, in that order, of lines
// "step raw_bytes wire_bytes cumulative_raw_bytes cumulative_wire_bytes".
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
