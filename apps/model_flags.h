// defines: the model and training flags (--data --model --layers … --eval-every), declared once and shared by
// `longhaul train` and the job commands (`launch`, `coordinator`, `demo`), so a new flag reaches them all.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/trainer.h"

namespace lh::app {

struct ModelFlags {
  std::string model = "small";
  int layers = 0, d_model = 0, heads = 0, seq = 0, subspace_k = -1;
  bool tied_head = false;
  std::string device = "cpu";
};

// The --help group the flags are listed under, the same in every command.
inline constexpr const char* kModelFlagGroup = "Model and training";

// Adds the flags to `cmd`: model shape into `f`, training settings (data, steps, batch, lr, warmup, seed,
// eval-every) straight into `train`, whose current values are the defaults shown in --help.
void add_model_flags(CLI::App* cmd, ModelFlags& f, TrainConfig& train);
// Sets train.device and train.model (the --model preset with the overrides); a bad value ends the
// command with an error naming the flag.
void apply_model_flags(const ModelFlags& f, TrainConfig& train);
// Whether the user gave a flag that shapes the model (--model, --layers, … --tied-head).
bool model_shape_given(CLI::App* cmd);

}  // namespace lh::app
