// defines: SyncConfig (--sync: how data-parallel replicas keep their weights together), its parser, and the check
// of a --compress-grad spec against it. The config layer (plan/) includes this without the collectives;
// comm/dp_reducer.h runs what it describes.
#pragma once

#include <string>

#include "core/status.h"

namespace lh {

// Checks a --compress-grad spec: a codec chain, or PowerSGD (`powersgd:rank=R[+CODEC]`, parse_powersgd).
// Refuses codecs whose decoding needs per-sample memories or a matrix shape (delta, subspace, lowrank):
// buckets are flat vectors and every replica must decode the same bytes to the same values.
Status check_grad_codec_spec(const std::string& spec);

// How replicas keep their weights together:
// - --sync every-step: average the gradients every step, before its optimizer step;
// - --sync delayed:D=1: average them every step too, but apply each step's average D steps later, so the exchange
//   runs under the next D steps' compute (Pipe-SGD's bounded staleness; every replica applies the same averages, so
//   the replicas stay bit-equal). Step t's update uses the gradient of step t − D, each update with the learning
//   rate of the step its gradient came from; the learning-rate warmup runs every-step (delayed updates at the peak
//   learning rate made the loss spike, measured) and the last step applies every average still in flight, so a run
//   of N steps takes N updates. With predict (the default), a step's forward and backward run at the weights
//   predicted for when its gradient is applied: the weights plus the last update times the number of updates
//   still in flight (weight prediction, as in PipeMare and SpecTrain), and the update is applied to the weights
//   themselves;
// - --sync diloco:H=50,outer_lr=0.7,outer_momentum=0.9 (DiLoCo: H local AdamW steps, then average the
//   pseudo-gradient θ_sync − θ and take an outer Nesterov-momentum SGD step from θ_sync).
struct SyncConfig {
  enum class Kind { kEveryStep, kDelayed, kDiloco } kind = Kind::kEveryStep;
  int D = 1;            // delayed: steps between a gradient and its update
  bool predict = true;  // delayed: compute at predicted weights
  int H = 50;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool diloco() const { return kind == Kind::kDiloco; }
  bool delayed() const { return kind == Kind::kDelayed; }
  // canonical: "every-step", "delayed:D=1" (",predict=off" when off) or "diloco:H=50,outer_lr=0.7,outer_momentum=0.9"
  std::string to_string() const;
};
// Errors name the bad part: an unknown kind or key, an H or D that is not an integer in range, a learning rate
// that is not > 0, a momentum outside [0, 1).
Result<SyncConfig> parse_sync(const std::string& text);
// D above this is refused: each step in flight holds a copy of the stage's gradients.
constexpr int kMaxSyncDelay = 8;

// check_grad_codec_spec, and that the spec suits `sync`: PowerSGD averages every step (DiLoCo's pseudo-gradients
// take a codec chain). The one place that rule lives: flags, live switches, the reducer and resumes call it.
Status check_grad_codec_spec(const std::string& spec, const SyncConfig& sync);

}  // namespace lh
