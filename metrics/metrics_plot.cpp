// gnuplot scripts and data files for loss and per-link cumulative raw and wire bytes, and running
// gnuplot on them. Used by `longhaul report --png`.
#include "metrics/metrics_plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "core/role.h"

extern char** environ;

namespace lh {
namespace {

// A gnuplot single-quoted string: a quote inside is written twice.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) return io_error("cannot write '" + path + "'");
  return Status::Ok();
}

std::string number(double v, const char* format = "%.0f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Ten colours told apart easily (Tableau 10). Line i takes colour i % 10 and, past the first ten,
// point marks of type i / 10 so that two lines of one colour still differ.
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = sizeof kPalette / sizeof kPalette[0];

// A row of folded_links and what it carried at each step it carried anything: step → (raw, wire).
struct BytesSeries {
  LinkTotals row;
  std::map<int64_t, std::pair<double, double>> by_step;
};

std::vector<BytesSeries> bytes_series(const MetricsSummary& s) {
  std::vector<BytesSeries> out;
  for (const LinkTotals& row : folded_links(s)) {
    BytesSeries series{row, {}};
    for (const LinkKey& key : row.members) {
      if (auto it = s.raw_bytes_per_step.find(key); it != s.raw_bytes_per_step.end())
        for (const StepPoint& p : it->second) series.by_step[p.step].first += p.value;
      if (auto it = s.wire_bytes_per_step.find(key); it != s.wire_bytes_per_step.end())
        for (const StepPoint& p : it->second) series.by_step[p.step].second += p.value;
    }
    out.push_back(std::move(series));
  }
  return out;
}

// "0→1 fwd int8→int4"; "other (12 pairs)" for a folded row.
std::string series_title(const LinkTotals& row) {
  if (row.pairs > 1) return row.role + " (" + link_label(row) + ")";
  std::string title = link_label(row) + " " + role_dir_label(row.role);
  for (size_t i = 0; i < row.codecs.size(); ++i) title += (i ? "→" : " ") + row.codecs[i];
  return title;
}

// Display width in columns: UTF-8 code points, so "→" takes one column.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

Result<std::string> write_metrics_gnuplot(const MetricsSummary& summary, const std::string& dir,
                                          const std::string& png_path, const std::string& title) {
  const bool has_loss = !summary.loss.empty();
  const bool has_links = !summary.wire_bytes_per_step.empty();
  if (!has_loss && !has_links) return invalid_argument("nothing to plot: the metrics hold no loss and no link traffic");

  const std::vector<BytesSeries> series = bytes_series(summary);
  // The key sits right of the panels, its text left-aligned after the line sample; the panels give
  // it room for the longest title (a chained codec spec can be long), as gnuplot sizes the key: about
  // 9 pixels a character (UTF-8 code points, hence `set encoding utf8`) and 6 for the sample.
  size_t longest = 12;
  for (const BytesSeries& b : series) longest = std::max(longest, columns(series_title(b.row)));
  const double key_share = std::min(0.45, 9.0 * double(longest + 6) / 1100.0);
  std::string script = "set terminal pngcairo size 1100," + std::to_string(has_loss && has_links ? 800 : 450) +
                       " font 'sans,10' noenhanced\nset encoding utf8\nset output " + quoted(png_path) +
                       "\nset grid\nset key outside right top Left reverse\nset rmargin at screen " +
                       number(1.0 - key_share, "%.3f") + "\n";
  if (has_loss && has_links)
    script += "set multiplot layout 2,1 title " + quoted(title) + "\n";
  else
    script += "set title " + quoted(title) + "\n";

  if (has_loss) {
    std::string data = "# step loss\n";
    for (const StepPoint& p : summary.loss) data += std::to_string(p.step) + " " + std::to_string(p.value) + "\n";
    std::string val;
    for (const StepPoint& p : summary.val_loss) val += std::to_string(p.step) + " " + std::to_string(p.value) + "\n";
    LH_RETURN_IF_ERROR(write_file(dir + "/loss.dat", data + (val.empty() ? "" : "\n\n# step val_loss\n" + val)));
    script += "set xlabel 'step'\nset ylabel 'loss'\nplot " + quoted(dir + "/loss.dat") +
              " index 0 using 1:2 with lines lw 2 title 'train'";
    if (!val.empty())
      script += ", " + quoted(dir + "/loss.dat") + " index 1 using 1:2 with linespoints title 'validation'";
    script += "\n";
  }
  if (has_links) {
    // Cumulative bytes: what a link has cost so far reads off directly, and evaluation steps, which
    // carry a burst of extra activations, show as a small step rather than setting the scale.
    double top = 0;
    for (const BytesSeries& b : series) top = std::max(top, double(b.row.raw_bytes));
    const auto [scale, unit] = top >= 1e9   ? std::make_pair(1e9, "GB")
                               : top >= 1e6 ? std::make_pair(1e6, "MB")
                               : top >= 1e3 ? std::make_pair(1e3, "kB")
                                            : std::make_pair(1.0, "bytes");
    const std::string file = quoted(dir + "/links.dat"), div = "/" + number(scale);
    std::string data, plots;
    for (size_t i = 0; i < series.size(); ++i) {
      const BytesSeries& b = series[i];
      data += "# " + link_label(b.row) + " " + b.row.role +
              ": step raw_bytes wire_bytes cumulative_raw_bytes cumulative_wire_bytes\n";
      double raw = 0, wire = 0;
      for (const auto& [step, bytes] : b.by_step) {
        raw += bytes.first;
        wire += bytes.second;
        data += std::to_string(step) + " " + number(bytes.first) + " " + number(bytes.second) + " " + number(raw) +
                " " + number(wire) + "\n";
      }
      data += "\n\n";
      const std::string colour = " lc rgb '" + std::string(kPalette[i % kPaletteSize]) + "'";
      const int round = static_cast<int>(i) / kPaletteSize;
      const std::string style = round == 0 ? " with lines lw 2"
                                           : " with linespoints lw 2 pt " + std::to_string(round + 5) + " pi " +
                                                 std::to_string(std::max<size_t>(1, b.by_step.size() / 8));
      const std::string index = " index " + std::to_string(i);
      plots += std::string(i ? ", \\\n  " : "") + file + index + " using 1:($4" + div + ")" + style + " dt 2" + colour +
               " notitle, \\\n  " + file + index + " using 1:($5" + div + ")" + style + " dt 1" + colour + " title " +
               quoted(series_title(b.row));
    }
    plots +=
        ", \\\n  NaN with lines lw 2 dt 1 lc rgb 'black' title 'solid: wire', \\\n"
        "  NaN with lines lw 2 dt 2 lc rgb 'black' title 'dashed: raw (fp32)'";
    LH_RETURN_IF_ERROR(write_file(dir + "/links.dat", data));

    // A dotted line in the link's colour where its codec changed, labelled with the new codec: right
    // of the line in the first half of the steps, left of it in the second, so that it stays inside;
    // labels are stacked so that switches at nearby steps stay readable.
    std::string marks;
    int label = 0;
    for (const CodecSwitch& c : summary.codec_switches)
      for (size_t i = 0; i < series.size(); ++i) {
        const LinkTotals& row = series[i].row;
        if (row.pairs > 1 || LinkKey{row.src, row.dst, row.role} != LinkKey{c.src, c.dst, c.role}) continue;
        const std::string colour = " lc rgb '" + std::string(kPalette[i % kPaletteSize]) + "'";
        const std::string at = std::to_string(c.step);
        marks += "set arrow from " + at + ", graph 0 to " + at + ", graph 1 nohead dt 3 lw 1.5" + colour + " back\n";
        marks += "set label " + quoted(link_label(row) + " " + role_dir_label(row.role) + " → " + c.to) + " at " + at +
                 ", graph " + number(0.95 - 0.06 * (label++ % 6), "%.2f") +
                 (2 * c.step > summary.first_step + summary.last_step ? " right offset character -0.5,0"
                                                                      : " left offset character 0.5,0") +
                 " tc rgb '" + kPalette[i % kPaletteSize] + "' front\n";
      }
    script += "set xlabel 'step'\nset ylabel " + quoted(std::string("cumulative ") + unit) + "\n" + marks + "plot " +
              plots + "\n";
  }
  if (has_loss && has_links) script += "unset multiplot\n";
  const std::string path = dir + "/plot.gp";
  LH_RETURN_IF_ERROR(write_file(path, script));
  return path;
}

Status render_metrics_png(const MetricsSummary& summary, const std::string& png_path, const std::string& title,
                          const std::string& gnuplot_program) {
  if (!on_path(gnuplot_program))
    return unavailable("'" + gnuplot_program +
                       "' was not found; install it (Debian: apt-get install gnuplot-nox) "
                       "or leave out --png");
  std::string templ = (std::filesystem::temp_directory_path() / "longhaul-plot-XXXXXX").string();
  if (!mkdtemp(templ.data())) return io_error(std::string("cannot create a temporary folder: ") + std::strerror(errno));
  const std::string dir = templ;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};

  // gnuplot leaves a partial file behind on failure; draw into the folder, then move into place.
  const std::string tmp_png = dir + "/out.png";
  LH_ASSIGN_OR_RETURN(std::string script, write_metrics_gnuplot(summary, dir, tmp_png, title));
  const std::string err_path = dir + "/gnuplot.err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv{const_cast<char*>(gnuplot_program.c_str()), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, gnuplot_program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return unavailable("cannot start '" + gnuplot_program + "': " + std::strerror(rc));
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0)
    if (errno != EINTR) return internal_error(std::string("waitpid on gnuplot: ") + std::strerror(errno));
  std::ifstream err_file(err_path);
  std::stringstream err;
  err << err_file.rdbuf();
  std::string messages = err.str();
  if (messages.size() > 2000) messages = messages.substr(0, 2000) + "…";
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
    return internal_error(
        "gnuplot failed (" +
        (WIFEXITED(wstatus) ? "exit code " + std::to_string(WEXITSTATUS(wstatus)) : std::string("killed by a signal")) +
        ")" + (messages.empty() ? "" : ": " + messages));
  std::ifstream png(tmp_png, std::ios::binary);
  char magic[4] = {};
  if (!png.read(magic, 4) || std::memcmp(magic, "\x89PNG", 4) != 0)
    return internal_error("gnuplot ran but wrote no PNG" + (messages.empty() ? "" : ": " + messages));
  png.close();
  std::error_code ec;
  std::filesystem::copy_file(tmp_png, png_path, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return io_error("cannot write '" + png_path + "': " + ec.message());
  return Status::Ok();
}

}  // namespace lh
