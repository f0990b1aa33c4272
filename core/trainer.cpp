// The single-process training loop: config checks, lr schedule, AdamW state, steps, evaluation,
// checkpoints, JSON-lines metrics and text sampling. Used by `longhaul train`, the benchmark and tests.
#include "core/trainer.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "core/log.h"

namespace lh {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

Status TrainConfig::validate() const {
  LH_RETURN_IF_ERROR(model.validate());
  if (model.vocab != 256)
    return invalid_argument("model vocab=" + std::to_string(model.vocab) + ": byte-level text needs vocab=256");
  if (steps < 1) return invalid_argument("--steps " + std::to_string(steps) + " must be at least 1");
  if (batch < 1 || batch > 65536)
    return invalid_argument("--batch " + std::to_string(batch) + " must be in [1, 65536]");
  if (!(lr > 0.f) || !std::isfinite(lr))
    return invalid_argument("--lr " + std::to_string(lr) + " must be a positive number");
  if (warmup < 0) return invalid_argument("--warmup " + std::to_string(warmup) + " must not be negative");
  if (!(min_lr_frac >= 0.f && min_lr_frac <= 1.f)) return invalid_argument("min_lr_frac must be in [0, 1]");
  if (!(weight_decay >= 0.f)) return invalid_argument("weight decay must not be negative");
  if (eval_every < 0) return invalid_argument("--eval-every " + std::to_string(eval_every) + " must not be negative");
  if (eval_batches < 1) return invalid_argument("eval batches must be at least 1");
  if (checkpoint_every < 0) return invalid_argument("--checkpoint-every must not be negative");
  if (checkpoint_every > 0 && checkpoint_dir.empty())
    return invalid_argument("--checkpoint-every needs --checkpoint-dir");
  if (sample < 0) return invalid_argument("--sample " + std::to_string(sample) + " must not be negative");
  return Status::Ok();
}

std::string TrainConfig::to_json() const {
  nlohmann::json j = {{"model", model.describe()},
                      {"data", data.empty() ? "<fortunes>" : data},
                      {"steps", steps},
                      {"batch", batch},
                      {"seq", model.seq},
                      {"lr", lr},
                      {"warmup", warmup},
                      {"min_lr_frac", min_lr_frac},
                      {"weight_decay", weight_decay},
                      {"grad_clip", grad_clip},
                      {"seed", seed},
                      {"device", device_name(device)}};
  return j.dump();
}

float lr_at(const TrainConfig& cfg, int64_t step) {
  if (cfg.warmup > 0 && step <= cfg.warmup) return cfg.lr * static_cast<float>(step) / static_cast<float>(cfg.warmup);
  const int64_t span = std::max<int64_t>(1, cfg.steps - cfg.warmup);
  const double progress = std::min(1.0, static_cast<double>(step - cfg.warmup) / static_cast<double>(span));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(cfg.lr * (cfg.min_lr_frac + (1.0 - cfg.min_lr_frac) * cosine));
}

// ---------------------------------------------------------------------------------------------
// AdamW

Status AdamW::init(const std::vector<ParamGroup*>& groups, Device device) {
  m_.clear();
  v_.clear();
  for (auto* g : groups) {
    LH_ASSIGN_OR_RETURN(Tensor m, Tensor::create({g->numel}, DType::f32, device));
    LH_ASSIGN_OR_RETURN(Tensor v, Tensor::create({g->numel}, DType::f32, device));
    LH_RETURN_IF_ERROR(m.zero());
    LH_RETURN_IF_ERROR(v.zero());
    m_.push_back(m);
    v_.push_back(v);
  }
  return Status::Ok();
}

Result<float> AdamW::step(const Exec& ex, const std::vector<ParamGroup*>& groups, const AdamWConfig& cfg, float clip,
                          int64_t t) {
  LH_ASSERT(groups.size() == m_.size(), "AdamW::step with groups it was not initialised for");
  std::vector<float*> grads;
  std::vector<int64_t> sizes;
  for (auto* g : groups) {
    grads.push_back(static_cast<float*>(g->grads.raw_data()));
    sizes.push_back(g->numel);
  }
  const float norm = clip_grad_norm(ex, grads.data(), sizes.data(), static_cast<int>(grads.size()), clip);
  if (!std::isfinite(norm))
    return out_of_range("gradient norm is " + std::to_string(norm) + " at step " + std::to_string(t) +
                        "; the run diverged (try a lower --lr)");
  for (size_t i = 0; i < groups.size(); ++i) {
    ParamGroup& g = *groups[i];
    float* m = static_cast<float*>(m_[i].raw_data());
    float* v = static_cast<float*>(v_[i].raw_data());
    for (const auto& s : g.slices) {
      adamw_update(ex, g.params.data<float>() + s.offset, g.grads.data<float>() + s.offset, m + s.offset, v + s.offset,
                   s.numel(), cfg, static_cast<int>(t), s.decay ? cfg.weight_decay : 0.f);
    }
  }
  return norm;
}

// ---------------------------------------------------------------------------------------------
// Trainer

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;
  std::optional<Checkpoint> ckpt;
  if (!cfg.resume.empty()) {
    LH_ASSIGN_OR_RETURN(std::string path, resolve_checkpoint_path(cfg.resume));
    LH_ASSIGN_OR_RETURN(Checkpoint c, load_checkpoint(path));
    if (!cfg.model_explicit) {
      cfg.model = c.model;
    } else if (c.model != cfg.model) {
      return invalid_argument("checkpoint '" + path + "' holds a model with " + c.model.describe() +
                              ", but the flags ask for " + cfg.model.describe() +
                              "; drop the model flags to resume it as it is");
    }
    LH_LOG_INFO("resuming from {} at step {}", path, c.step);
    ckpt = std::move(c);
  }
  LH_RETURN_IF_ERROR(cfg.validate());
  // Said before the data is read, and in the user's terms rather than an allocation failure.
  if (cfg.device == Device::cuda && !cuda_available())
    return unavailable("--device cuda: no CUDA device available (" + cuda_device_summary() + "); use --device cpu");

  std::unique_ptr<Trainer> t(new Trainer());
  t->cfg_ = cfg;
  if (cfg.data.empty()) {
    LH_ASSIGN_OR_RETURN(t->data_, TextDataset::default_corpus(cfg.model.seq));
  } else {
    LH_ASSIGN_OR_RETURN(t->data_, TextDataset::from_file(cfg.data, cfg.model.seq));
  }
  LH_ASSIGN_OR_RETURN(t->model_, Gpt::create(cfg.model, cfg.device, cfg.seed));
  LH_RETURN_IF_ERROR(t->opt_.init(t->model_.param_groups(), cfg.device));
  t->sampler_ = BatchSampler(&t->data_, Split::train, cfg.batch, cfg.model.seq, cfg.seed);
  if (ckpt) LH_RETURN_IF_ERROR(t->restore(*ckpt));
  return t;
}

Result<StepStats> Trainer::step() {
  const auto t0 = Clock::now();
  const int B = cfg_.batch, T = cfg_.model.seq;
  sampler_.next(&tokens_, &targets_);
  LH_RETURN_IF_ERROR(model_.zero_grad());
  LH_ASSIGN_OR_RETURN(float loss, model_.forward(cache_, tokens_.data(), targets_.data(), B, T));
  if (!std::isfinite(loss))
    return out_of_range("loss is " + std::to_string(loss) + " at step " + std::to_string(step_ + 1) +
                        "; the run diverged (try a lower --lr)");
  LH_RETURN_IF_ERROR(model_.backward(cache_));
  const int64_t t = step_ + 1;
  AdamWConfig acfg;
  acfg.lr = lr_at(cfg_, t);
  acfg.weight_decay = cfg_.weight_decay;
  LH_ASSIGN_OR_RETURN(float norm, opt_.step(model_.exec(), model_.param_groups(), acfg, cfg_.grad_clip, t));
  step_ = t;
  StepStats s;
  s.step = t;
  s.loss = loss;
  s.lr = acfg.lr;
  s.grad_norm = norm;
  s.seconds = seconds_since(t0);
  s.tokens_per_s = s.seconds > 0 ? double(B) * T / s.seconds : 0;
  return s;
}

Result<float> Trainer::evaluate() {
  // A fresh sampler under the run's seed: every evaluation sees the same validation batches.
  BatchSampler val(&data_, Split::val, cfg_.batch, cfg_.model.seq, cfg_.seed);
  std::vector<int32_t> tok, tgt;
  double total = 0;
  for (int i = 0; i < cfg_.eval_batches; ++i) {
    val.next(&tok, &tgt);
    LH_ASSIGN_OR_RETURN(float loss, model_.forward(cache_, tok.data(), tgt.data(), cfg_.batch, cfg_.model.seq));
    total += loss;
  }
  return static_cast<float>(total / cfg_.eval_batches);
}

Result<Checkpoint> Trainer::make_checkpoint() {
  Checkpoint c;
  c.model = cfg_.model;
  c.train_config_json = cfg_.to_json();
  c.step = step_;
  c.data_rng = sampler_.rng();
  c.data_fingerprint = data_.fingerprint();
  c.groups = opt_.save_groups(model_.param_groups());
  return c;
}

std::vector<CheckpointGroup> AdamW::save_groups(const std::vector<ParamGroup*>& groups) {
  std::vector<CheckpointGroup> out;
  for (size_t i = 0; i < groups.size(); ++i)
    out.push_back({groups[i]->name, groups[i]->params.to_vector(), m(i).to_vector(), v(i).to_vector()});
  return out;
}

Status AdamW::load_groups(const std::vector<CheckpointGroup>& saved, const std::vector<ParamGroup*>& groups,
                          Device device) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const CheckpointGroup& g = saved.at(i);
    const size_t bytes = g.params.size() * sizeof(float);
    LH_RETURN_IF_ERROR(copy_bytes(groups[i]->params.raw_data(), device, g.params.data(), Device::cpu, bytes));
    LH_RETURN_IF_ERROR(copy_bytes(m(i).raw_data(), device, g.adam_m.data(), Device::cpu, bytes));
    LH_RETURN_IF_ERROR(copy_bytes(v(i).raw_data(), device, g.adam_v.data(), Device::cpu, bytes));
  }
  return Status::Ok();
}

Status Trainer::restore(const Checkpoint& c) {
  if (c.model != cfg_.model)
    return invalid_argument("checkpoint model " + c.model.describe() + " differs from this run's " +
                            cfg_.model.describe());
  if (c.data_fingerprint != data_.fingerprint())
    return invalid_argument("checkpoint was trained on other data than '" + data_.source() +
                            "' (fingerprints differ); resume with the same --data");
  if (c.step >= cfg_.steps)
    return invalid_argument("checkpoint is at step " + std::to_string(c.step) + ", not before --steps " +
                            std::to_string(cfg_.steps) + "; raise --steps to train further");
  auto groups = model_.param_groups();
  if (c.groups.size() != groups.size())
    return invalid_argument("checkpoint has " + std::to_string(c.groups.size()) + " parameter groups, the model " +
                            std::to_string(groups.size()));
  for (size_t i = 0; i < groups.size(); ++i) {
    const CheckpointGroup& g = c.groups[i];
    ParamGroup& p = *groups[i];
    if (g.name != p.name || static_cast<int64_t>(g.params.size()) != p.numel)
      return invalid_argument("checkpoint group '" + g.name + "' (" + std::to_string(g.params.size()) +
                              " values) does not match model group '" + p.name + "' (" + std::to_string(p.numel) +
                              " values)");
  }
  // Sampler first: it is the only step that can still refuse (another seed), and nothing is changed yet.
  BatchSampler sampler(&data_, Split::train, cfg_.batch, cfg_.model.seq, c.data_rng.seed());
  LH_RETURN_IF_ERROR(sampler.restore(c.data_rng));
  LH_RETURN_IF_ERROR(opt_.load_groups(c.groups, groups, model_.device()));
  sampler_ = sampler;
  cfg_.seed = c.data_rng.seed();
  step_ = c.step;
  return Status::Ok();
}

Status Trainer::save(const std::string& path) {
  LH_ASSIGN_OR_RETURN(Checkpoint c, make_checkpoint());
  return save_checkpoint(path, c);
}

Status Trainer::run(TrainObserver* observer) {
  std::ofstream metrics;
  if (!cfg_.metrics.empty()) {
    // A resumed run appends, so one file holds the whole curve.
    metrics.open(cfg_.metrics, step_ > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics) return io_error("cannot open metrics file '" + cfg_.metrics + "' for writing");
  }
  if (!cfg_.checkpoint_dir.empty()) {
    struct stat st {};
    if (::stat(cfg_.checkpoint_dir.c_str(), &st) != 0 && ::mkdir(cfg_.checkpoint_dir.c_str(), 0755) != 0)
      return io_error("cannot create checkpoint directory '" + cfg_.checkpoint_dir + "'");
    if (::stat(cfg_.checkpoint_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return invalid_argument("--checkpoint-dir '" + cfg_.checkpoint_dir + "' is not a directory");
  }
  while (step_ < cfg_.steps) {
    LH_ASSIGN_OR_RETURN(StepStats s, step());
    std::optional<float> val;
    const bool last = step_ == cfg_.steps;
    if ((cfg_.eval_every > 0 && step_ % cfg_.eval_every == 0) || last) {
      LH_ASSIGN_OR_RETURN(float v, evaluate());
      val = v;
    }
    if (metrics.is_open()) {
      nlohmann::json j = {{"step", s.step},
                          {"loss", s.loss},
                          {"lr", s.lr},
                          {"tokens_per_s", s.tokens_per_s},
                          {"grad_norm", s.grad_norm}};
      if (val) j["val_loss"] = *val;
      metrics << j.dump() << "\n";
      metrics.flush();
      if (!metrics) return io_error("writing metrics file '" + cfg_.metrics + "' failed");
    }
    if (observer) observer->on_step(s, val);
    if (!cfg_.checkpoint_dir.empty() && ((cfg_.checkpoint_every > 0 && step_ % cfg_.checkpoint_every == 0) || last)) {
      const std::string path = cfg_.checkpoint_dir + "/" + checkpoint_filename(step_);
      LH_RETURN_IF_ERROR(save(path));
      if (observer) observer->on_checkpoint(path);
    }
  }
  return Status::Ok();
}

Result<std::string> Trainer::sample(int n, const std::string& prompt, float temperature, uint64_t seed) {
  if (n < 0) return invalid_argument("sample length must not be negative");
  if (!(temperature >= 0.f)) return invalid_argument("sampling temperature must not be negative");
  std::vector<int32_t> ctx;
  for (unsigned char ch : prompt) ctx.push_back(ch);
  if (ctx.empty()) ctx.push_back('\n');
  const int V = cfg_.model.vocab, Tmax = cfg_.model.seq;
  ActivationCache c;
  Rng rng(seed, 0x5A3B1Eull);
  std::vector<float> logits(V);
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int T = std::min<int>(Tmax, static_cast<int>(ctx.size()));
    const int32_t* window = ctx.data() + ctx.size() - T;
    LH_ASSIGN_OR_RETURN(Tensor x, model_.embed_forward(c, window, Device::cpu, 1, T));
    LH_ASSIGN_OR_RETURN(x, model_.blocks_forward(0, cfg_.model.layers, c, x));
    LH_RETURN_IF_ERROR(model_.logits_forward(c, x));
    const float* last = static_cast<const float*>(c.logits.raw_data()) + int64_t(T - 1) * V;
    LH_RETURN_IF_ERROR(copy_bytes(logits.data(), Device::cpu, last, model_.device(), V * sizeof(float)));
    int next = 0;
    if (temperature == 0.f) {
      for (int v = 1; v < V; ++v)
        if (logits[v] > logits[next]) next = v;
    } else {
      float mx = logits[0];
      for (float l : logits) mx = std::max(mx, l);
      double total = 0;
      for (auto& l : logits) total += (l = std::exp((l - mx) / temperature));
      double r = rng.uniform() * total, acc = 0;
      next = V - 1;
      for (int v = 0; v < V; ++v) {
        acc += logits[v];
        if (r < acc) {
          next = v;
          break;
        }
      }
    }
    ctx.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

}  // namespace lh
