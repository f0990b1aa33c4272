// defines: lh::TrainConfig, lh::AdamW (optimizer state per parameter group), lh::Trainer (the
// single-process training loop: steps, evaluation, checkpoints, metrics, sampling). Used by
// `longhaul train`, `longhaul bench train`, pipeline stages (AdamW, lr schedule) and tests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/dataset.h"
#include "core/gpt.h"
#include "core/ops.h"

namespace lh {

struct TrainConfig {
  GptConfig model;             // resolved from --model and its overrides
  bool model_explicit = true;  // false: on --resume the checkpoint's model is taken as is
  std::string data;            // text file; empty = the default fortunes corpus
  int64_t steps = 150;
  int batch = 16;
  float lr = 2e-3f;
  int warmup = 20;
  float min_lr_frac = 0.1f;  // cosine decay ends at lr · min_lr_frac on the last step
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // global-norm clip; <= 0 turns it off
  uint64_t seed = 1337;
  Device device = Device::cpu;
  int eval_every = 100;  // 0: evaluate only at the end
  int eval_batches = 8;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // 0: only at the end (when checkpoint_dir is set)
  std::string resume;            // checkpoint file or directory
  std::string metrics;           // JSON-lines file
  int sample = 0;                // bytes of text to generate at the end

  Status validate() const;
  std::string to_json() const;  // stored in checkpoints
};

// Learning rate at 1-based `step`: linear warmup, then cosine decay to lr·min_lr_frac at cfg.steps.
float lr_at(const TrainConfig& cfg, int64_t step);

// AdamW state (first and second moments) beside each parameter group; weight decay on matrices only.
class AdamW {
 public:
  Status init(const std::vector<ParamGroup*>& groups, Device device);
  // Clips the global gradient norm (when clip > 0), then updates every group; t is 1-based.
  // Returns the gradient norm before clipping.
  Result<float> step(const Exec& ex, const std::vector<ParamGroup*>& groups, const AdamWConfig& cfg, float clip,
                     int64_t t);
  Tensor& m(size_t i) { return m_.at(i); }
  Tensor& v(size_t i) { return v_.at(i); }

  // Each group's parameters and moments as a checkpoint holds them (the trainer's checkpoints, a worker's shard).
  std::vector<CheckpointGroup> save_groups(const std::vector<ParamGroup*>& groups);
  // Copies `saved` back into the groups and moments on `device`; the caller has checked names and sizes.
  Status load_groups(const std::vector<CheckpointGroup>& saved, const std::vector<ParamGroup*>& groups, Device device);

 private:
  std::vector<Tensor> m_, v_;
};

struct StepStats {
  int64_t step = 0;  // 1-based number of the step just taken
  float loss = 0, lr = 0, grad_norm = 0;
  double seconds = 0, tokens_per_s = 0;
};

// Receives progress from Trainer::run (the CLI draws a progress bar or prints lines).
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_step(const StepStats& s, std::optional<float> val_loss) = 0;
  virtual void on_checkpoint(const std::string& path) {}
};

class Trainer {
 public:
  // Loads the data, builds the model and optimizer, and restores cfg.resume when set.
  static Result<std::unique_ptr<Trainer>> create(const TrainConfig& cfg);

  // One optimizer step on the next training batch.
  Result<StepStats> step();
  // Mean loss over cfg.eval_batches fixed validation batches (the same batches every call).
  Result<float> evaluate();
  // Trains until cfg.steps, evaluating, checkpointing and writing metrics as configured.
  Status run(TrainObserver* observer);

  Result<Checkpoint> make_checkpoint();
  Status restore(const Checkpoint& ckpt);
  Status save(const std::string& path);
  // `n` bytes generated after `prompt`, sampling at `temperature` from a Philox stream under `seed`.
  Result<std::string> sample(int n, const std::string& prompt, float temperature, uint64_t seed);

  int64_t steps_done() const { return step_; }
  const TrainConfig& config() const { return cfg_; }
  Gpt& model() { return model_; }
  const TextDataset& data() const { return data_; }
  int64_t tokens_per_step() const { return int64_t(cfg_.batch) * cfg_.model.seq; }

 private:
  Trainer() = default;
  TrainConfig cfg_;
  TextDataset data_;
  Gpt model_;
  AdamW opt_;
  BatchSampler sampler_;
  ActivationCache cache_;
  std::vector<int32_t> tokens_, targets_;
  int64_t step_ = 0;
};

}  // namespace lh
