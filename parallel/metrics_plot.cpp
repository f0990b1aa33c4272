// gnuplot scripts and data files for loss and per-link wire bytes, and running gnuplot on them.
// Used by `longhaul report --png`.
#include "parallel/metrics_plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

  std::string script = "set terminal pngcairo size 1000," + std::to_string(has_loss && has_links ? 800 : 450) +
                       " font 'sans,10' noenhanced\nset output " + quoted(png_path) +
                       "\nset grid\nset key outside right top\nset rmargin at screen 0.78\n";
  if (has_loss && has_links) script += "set multiplot layout 2,1 title " + quoted(title) + "\n";
  else script += "set title " + quoted(title) + "\n";

  if (has_loss) {
    std::string data = "# step loss\n";
    for (const StepPoint& p : summary.loss) data += std::to_string(p.step) + " " + std::to_string(p.value) + "\n";
    std::string val;
    for (const StepPoint& p : summary.val_loss) val += std::to_string(p.step) + " " + std::to_string(p.value) + "\n";
    LH_RETURN_IF_ERROR(write_file(dir + "/loss.dat", data + (val.empty() ? "" : "\n\n# step val_loss\n" + val)));
    script += "set xlabel 'step'\nset ylabel 'loss'\nplot " + quoted(dir + "/loss.dat") +
              " index 0 using 1:2 with lines lw 2 title 'train'";
    if (!val.empty()) script += ", " + quoted(dir + "/loss.dat") + " index 1 using 1:2 with linespoints title 'validation'";
    script += "\n";
  }
  if (has_links) {
    std::string data, plots;
    int index = 0;
    for (const auto& [key, points] : summary.wire_bytes_per_step) {
      const auto& [src, dst, role] = key;
      data += "# " + std::to_string(src) + "->" + std::to_string(dst) + " " + role + ": step wire_bytes\n";
      for (const StepPoint& p : points) data += std::to_string(p.step) + " " + std::to_string(p.value) + "\n";
      data += "\n\n";
      plots += std::string(index ? ", " : "") + quoted(dir + "/wire.dat") + " index " + std::to_string(index) +
               " using 1:($2/1e6) with lines lw 2 title " +
               quoted(std::to_string(src) + "→" + std::to_string(dst) + " " + role_label(role));
      ++index;
    }
    LH_RETURN_IF_ERROR(write_file(dir + "/wire.dat", data));
    script += "set xlabel 'step'\nset ylabel 'wire MB per step'\nplot " + plots + "\n";
  }
  if (has_loss && has_links) script += "unset multiplot\n";
  const std::string path = dir + "/plot.gp";
  LH_RETURN_IF_ERROR(write_file(path, script));
  return path;
}

Status render_metrics_png(const MetricsSummary& summary, const std::string& png_path, const std::string& title,
                          const std::string& gnuplot_program) {
  if (!on_path(gnuplot_program))
    return unavailable("'" + gnuplot_program + "' was not found; install it (Debian: apt-get install gnuplot-nox) "
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
    return internal_error("gnuplot failed (" +
                          (WIFEXITED(wstatus) ? "exit code " + std::to_string(WEXITSTATUS(wstatus))
                                              : std::string("killed by a signal")) +
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
