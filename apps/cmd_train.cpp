// `longhaul train`: single-process GPT training on a text file or the default fortunes corpus, with a
// progress bar, JSON-lines metrics, checkpoints/resume and a text sample. Used by newcomers and scripts.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "apps/commands.h"
#include "apps/model_flags.h"
#include "core/trainer.h"

namespace lh::app {
namespace {

struct TrainFlags {
  ModelFlags model;
  float temperature = 0.8f;
  TrainConfig cfg;
};

std::string si(double x) {
  char b[32];
  if (x >= 1e6)
    std::snprintf(b, sizeof(b), "%.2fM", x / 1e6);
  else if (x >= 1e3)
    std::snprintf(b, sizeof(b), "%.1fk", x / 1e3);
  else
    std::snprintf(b, sizeof(b), "%.0f", x);
  return b;
}

// A progress bar redrawn in place on a terminal; plain lines (about 20 per run, plus evaluations)
// when the output is a file or a pipe, so logs stay readable.
class ProgressPrinter : public TrainObserver {
 public:
  ProgressPrinter(int64_t steps, int64_t first_step)
      : steps_(steps), first_(first_step), tty_(::isatty(::fileno(stdout)) != 0) {}
  void on_step(const StepStats& s, std::optional<float> val) override {
    // Tokens/s over a short window: one step's figure jumps with the machine's load.
    window_tokens_ += s.tokens_per_s * s.seconds;
    window_seconds_ += s.seconds;
    if (window_seconds_ > 2.0 || s.step == steps_) {
      rate_ = window_tokens_ / window_seconds_;
      window_tokens_ = window_seconds_ = 0;
    } else if (rate_ == 0) {
      rate_ = s.tokens_per_s;
    }
    if (val) last_val_ = *val;
    if (tty_) {
      const int width = 30;
      const int fill = static_cast<int>(width * double(s.step) / double(steps_));
      std::string bar(fill, '#');
      bar.resize(width, '.');
      elapsed_ += s.seconds;
      const double eta = elapsed_ / double(s.step - first_) * double(steps_ - s.step);
      std::printf("\r[%s] step %lld/%lld  loss %.4f%s  %s tok/s  lr %.2e  eta %.0fs ", bar.c_str(),
                  static_cast<long long>(s.step), static_cast<long long>(steps_), s.loss, val_text().c_str(),
                  si(rate_).c_str(), s.lr, eta);
      if (s.step == steps_) std::printf("\n");
      std::fflush(stdout);
    } else {
      const int64_t every = std::max<int64_t>(1, (steps_ - first_) / 20);
      if (val || s.step == first_ + 1 || (s.step - first_) % every == 0 || s.step == steps_) {
        std::printf("step %lld/%lld  loss %.4f%s  %s tok/s  lr %.2e\n", static_cast<long long>(s.step),
                    static_cast<long long>(steps_), s.loss, val ? val_text().c_str() : "", si(rate_).c_str(), s.lr);
        std::fflush(stdout);
      }
    }
  }
  void on_checkpoint(const std::string& path) override {
    if (tty_) std::printf("\n");
    std::printf("checkpoint %s\n", path.c_str());
    std::fflush(stdout);
  }

 private:
  std::string val_text() const {
    if (std::isnan(last_val_)) return "";
    char b[32];
    std::snprintf(b, sizeof(b), "  val %.4f", last_val_);
    return b;
  }
  int64_t steps_, first_;
  bool tty_;
  double rate_ = 0, window_tokens_ = 0, window_seconds_ = 0, elapsed_ = 0;
  float last_val_ = NAN;
};

// Printable ASCII and newlines as they are; anything else as '?', so a sample never garbles a terminal.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out.push_back((c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? char(c) : '?');
  return out;
}

int run_train(TrainFlags& f, CLI::App* cmd) {
  TrainConfig cfg = f.cfg;
  apply_model_flags(f.model, cfg);
  // On --resume the checkpoint's model is used unless a model flag was given.
  cfg.model_explicit = model_shape_given(cmd);
  if (cfg.resume.empty()) cfg.model_explicit = true;

  auto made = Trainer::create(cfg);
  if (!made.ok()) fail(made.status().to_string());
  Trainer& t = **made;
  const TrainConfig& rc = t.config();
  std::printf("longhaul train: %s, %lld parameters, on %s\n", rc.model.describe().c_str(),
              static_cast<long long>(t.model().num_params()), device_name(rc.device));
  std::printf("data: %s — %s train / %s validation bytes\n", t.data().source().c_str(),
              si(double(t.data().size(Split::train))).c_str(), si(double(t.data().size(Split::val))).c_str());
  std::printf("steps %lld (from %lld), batch %d × seq %d = %lld tokens/step, lr %.2e, warmup %d, seed %llu\n",
              static_cast<long long>(rc.steps), static_cast<long long>(t.steps_done()), rc.batch, rc.model.seq,
              static_cast<long long>(t.tokens_per_step()), rc.lr, rc.warmup, static_cast<unsigned long long>(rc.seed));
  std::fflush(stdout);
  ProgressPrinter progress(rc.steps, t.steps_done());
  Status s = t.run(&progress);
  if (!s.ok()) fail(s.to_string());
  if (rc.sample > 0) {
    auto text = t.sample(rc.sample, "\n", f.temperature, rc.seed);
    if (!text.ok()) fail(text.status().to_string());
    std::printf("--- sample (%d bytes, temperature %.2f) ---\n%s\n---\n", rc.sample, f.temperature,
                printable(*text).c_str());
  }
  if (!rc.metrics.empty()) std::printf("metrics: %s\n", rc.metrics.c_str());
  return 0;
}

RegisterCommand reg("", 10, [](CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  TrainConfig& c = f->cfg;
  c.sample = 300;
  auto* cmd = app.add_subcommand("train", "train a byte-level GPT in this process (default: fortunes corpus, ~1 min)");
  add_model_flags(cmd, f->model, c);
  cmd->add_option("--checkpoint-dir", c.checkpoint_dir, "write checkpoints here");
  cmd->add_option("--checkpoint-every", c.checkpoint_every, "checkpoint every N steps (default: at the end)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--resume", c.resume, "continue from a checkpoint file, or the latest in a directory");
  cmd->add_option("--metrics", c.metrics, "write JSON lines (step, loss, val_loss, tokens_per_s, lr) to FILE");
  cmd->add_option("--sample", c.sample, "bytes of text to generate at the end (0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", f->temperature, "sampling temperature")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->callback([f, cmd] {
    if (run_train(*f, cmd) != 0) throw CLI::RuntimeError(1);
  });
});

}  // namespace
}  // namespace lh::app
