// The model and training flags shared by `train`, `launch`, `coordinator` and `demo`, and their conversion
// into a TrainConfig. Used by apps/cmd_train.cpp and apps/job_cli.cpp.
#include "apps/model_flags.h"

#include "apps/commands.h"

namespace lh::app {

void add_model_flags(CLI::App* cmd, ModelFlags& f, TrainConfig& c) {
  const char* g = kModelFlagGroup;
  cmd->add_option("--data", c.data, "text file to train on (default: the fortunes corpus)")->group(g);
  cmd->add_option("--model", f.model, std::string("model size: ") + gpt_preset_names())
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--layers", f.layers, "override the number of blocks")->check(CLI::Range(1, 1024))->group(g);
  cmd->add_option("--d-model", f.d_model, "override the model width")->check(CLI::Range(1, 65536))->group(g);
  cmd->add_option("--heads", f.heads, "override the attention heads")->check(CLI::Range(1, 65536))->group(g);
  cmd->add_option("--seq", f.seq, "context length (sequence length of a batch)")->check(CLI::Range(1, 16384))->group(g);
  cmd->add_option("--subspace-k", f.subspace_k,
                  "subspace model: K coordinates per token, the values that cross each stage link (0 = off)")
      ->check(CLI::Range(0, 65536))
      ->group(g);
  cmd->add_flag("--tied-head", f.tied_head, "share the output head with the token embedding")->group(g);
  cmd->add_option("--steps", c.steps, "optimizer steps in total")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30))
      ->group(g);
  cmd->add_option("--batch", c.batch, "sequences per step (the global batch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536))
      ->group(g);
  cmd->add_option("--lr", c.lr, "peak learning rate")->capture_default_str()->check(CLI::PositiveNumber)->group(g);
  cmd->add_option("--warmup", c.warmup, "linear warmup steps")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->group(g);
  cmd->add_option("--seed", c.seed, "seed for init, data order and sampling")->capture_default_str()->group(g);
  cmd->add_option("--device", f.device, "cpu|cuda")->capture_default_str()->group(g);
  cmd->add_option("--eval-every", c.eval_every, "validation loss every N steps (0: at the end only)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->group(g);
}

void apply_model_flags(const ModelFlags& f, TrainConfig& c) {
  if (f.device == "cpu")
    c.device = Device::cpu;
  else if (f.device == "cuda")
    c.device = Device::cuda;
  else
    fail("--device '" + f.device + "': choose cpu or cuda", 2);
  auto preset = gpt_preset(f.model);
  if (!preset.ok()) fail("--model: " + preset.status().message(), 2);
  GptConfig& g = c.model;
  g = *preset;
  if (f.layers > 0) g.layers = f.layers;
  if (f.d_model > 0) g.d_model = f.d_model;
  if (f.heads > 0) g.heads = f.heads;
  if (f.seq > 0) g.seq = f.seq;
  if (f.subspace_k >= 0) g.subspace_k = f.subspace_k;
  g.tied_head = f.tied_head;
}

bool model_shape_given(CLI::App* cmd) {
  for (const char* o : {"--model", "--layers", "--d-model", "--heads", "--seq", "--subspace-k", "--tied-head"})
    if (cmd->count(o) > 0) return true;
  return false;
}

}  // namespace lh::app
