// StageRunner's optimizer updates: the clip by the whole model's gradient norm and the AdamW step, and --sync
// delayed's updates (the averages due at a step) with the weight prediction around a step's compute. Used by
// runtime/stage_runner.cpp.
#include <cmath>

#include "core/ops.h"
#include "runtime/stage_runner.h"

namespace lh {

Status StageRunner::predict_weights() {
  predicted_ = false;
  if (!options_.sync.delayed() || !options_.sync.predict || last_update_.empty()) return Status::Ok();
  // Updates that land between now and this step's own: one per earlier step in flight (begin_step has already
  // added this one).
  const float ahead = float(reducer_->steps_in_flight().size()) - 1;
  if (ahead == 0) return Status::Ok();
  std::vector<ParamGroup*> groups = model_.param_groups();
  real_params_.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    real_params_[i] = groups[i]->params.to_vector();
    std::vector<float> w = real_params_[i];
    const std::vector<float>& u = last_update_[i];
    for (size_t k = 0; k < w.size(); ++k) w[k] += ahead * u[k];
    LH_RETURN_IF_ERROR(groups[i]->params.copy_from(Tensor::from_vector(w, groups[i]->params.shape())));
  }
  predicted_ = true;
  return Status::Ok();
}

Status StageRunner::restore_weights() {
  if (!predicted_) return Status::Ok();
  std::vector<ParamGroup*> groups = model_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    LH_RETURN_IF_ERROR(groups[i]->params.copy_from(Tensor::from_vector(real_params_[i], groups[i]->params.shape())));
  predicted_ = false;
  return Status::Ok();
}

Status StageRunner::apply_delayed_updates(int64_t step, StageStepResult* r) {
  LH_RETURN_IF_ERROR(restore_weights());
  // Step t applies the average of step t − D; during the warmup and at the last step, every one in flight.
  const bool all = step <= train_.warmup || step >= train_.steps;
  std::vector<ParamGroup*> groups = model_.param_groups();
  for (int64_t from : reducer_->steps_in_flight()) {
    if (!all && from > step - options_.sync.D) break;
    Status s = reducer_->finish_step(from);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ", averaging gradients over the replicas");
    std::vector<std::vector<float>> before;
    if (options_.sync.predict)
      for (ParamGroup* g : groups) before.push_back(g->params.to_vector());
    LH_ASSIGN_OR_RETURN(r->grad_norm, apply_update(from));
    r->lr = lr_at(train_, from);
    if (!options_.sync.predict) continue;
    last_update_.resize(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      std::vector<float> now = groups[i]->params.to_vector();
      for (size_t k = 0; k < now.size(); ++k) now[k] -= before[i][k];
      last_update_[i] = std::move(now);
    }
  }
  return Status::Ok();
}

Result<float> StageRunner::apply_update(int64_t step) {
  double total_sq = local_grad_sq();
  if (grad_norm_) {
    TraceScope traced(trace_, "norm", step);
    LH_ASSIGN_OR_RETURN(total_sq, grad_norm_->total_sq(step, total_sq));
  }
  return clip_and_step(step, total_sq);
}

double StageRunner::local_grad_sq() {
  // Parameters every tp shard holds whole count on shard 0 only.
  std::vector<ParamGroup*> groups = model_.param_groups();
  double local_sq = 0;
  for (ParamGroup* g : groups) {
    if (shard_ == 0) {
      local_sq += sum_squares(model_.exec(), g->grads.data<float>(), g->numel);
      continue;
    }
    for (int i = 0; i < static_cast<int>(g->slices.size()); ++i)
      if (!g->slices[i].tp_replicated) local_sq += sum_squares(model_.exec(), g->grad(i), g->slices[i].numel());
  }
  return local_sq;
}

Result<float> StageRunner::clip_and_step(int64_t step, double total_sq) {
  // Clip by the norm of the whole model's gradient, as the single-process trainer does.
  std::vector<ParamGroup*> groups = model_.param_groups();
  const float norm = static_cast<float>(std::sqrt(total_sq));
  if (!std::isfinite(norm))
    return out_of_range("gradient norm is " + std::to_string(norm) + " at step " + std::to_string(step) +
                        "; the run diverged (try a lower --lr)");
  if (train_.grad_clip > 0 && norm > train_.grad_clip)
    for (ParamGroup* g : groups)
      scale_inplace(model_.exec(), g->grads.data<float>(), train_.grad_clip / norm, g->numel);
  AdamWConfig acfg;
  acfg.lr = lr_at(train_, step);
  acfg.weight_decay = train_.weight_decay;
  LH_RETURN_IF_ERROR(opt_.step(model_.exec(), groups, acfg, /*clip=*/0.f, step).status());
  return norm;
}

namespace {

std::vector<std::vector<float>> read_groups(const std::vector<ParamGroup*>& groups, bool grads) {
  std::vector<std::vector<float>> out;
  for (ParamGroup* g : groups) out.push_back(grads ? g->grads.to_vector() : g->params.to_vector());
  return out;
}

Status write_groups(const std::vector<ParamGroup*>& groups, const std::vector<std::vector<float>>& v, bool grads) {
  for (size_t i = 0; i < groups.size(); ++i) {
    Tensor& t = grads ? groups[i]->grads : groups[i]->params;
    LH_RETURN_IF_ERROR(t.copy_from(Tensor::from_vector(v[i], t.shape())));
  }
  return Status::Ok();
}

}  // namespace

Status StageRunner::use_version(int64_t version) {
  if (version == active_version_) return Status::Ok();
  std::vector<ParamGroup*> groups = model_.param_groups();
  // Kept unless they are a predicted set whose step is done.
  const bool keep = active_version_ >= 0 || -active_version_ >= b_step_;
  if (keep && versions_.count(active_version_) == 0) versions_[active_version_] = read_groups(groups, false);
  auto it = versions_.find(version);
  if (it == versions_.end())
    return internal_error("async schedule: the weights of update " + std::to_string(version) + " are gone");
  LH_RETURN_IF_ERROR(write_groups(groups, it->second, false));
  active_version_ = version;
  return Status::Ok();
}

Result<std::vector<std::vector<float>>> StageRunner::version_copy(int64_t version) {
  if (version == active_version_) return read_groups(model_.param_groups(), false);
  auto it = versions_.find(version);
  if (it == versions_.end())
    return internal_error("async schedule: the weights of update " + std::to_string(version) + " are gone");
  return it->second;
}

Status StageRunner::use_step_weights(int64_t step) {
  const int64_t base = std::max<int64_t>(step - 2, 0);
  if (options_.schedule != ScheduleKind::kAsyncPredict || base < 1) return use_version(base);
  const int64_t key = -step;
  if (key != active_version_ && versions_.count(key) == 0) {
    LH_ASSIGN_OR_RETURN(std::vector<std::vector<float>> w, version_copy(base));
    LH_ASSIGN_OR_RETURN(std::vector<std::vector<float>> before, version_copy(base - 1));
    for (size_t i = 0; i < w.size(); ++i)
      for (size_t k = 0; k < w[i].size(); ++k) w[i][k] += w[i][k] - before[i][k];
    versions_[key] = std::move(w);
  }
  return use_version(key);
}

Status StageRunner::finish_backwards(int64_t step) {
  versions_.erase(-step);
  held_[step] = read_groups(model_.param_groups(), true);
  held_sq_[step] = local_grad_sq();
  LH_RETURN_IF_ERROR(model_.zero_grad());
  if (grad_norm_) LH_RETURN_IF_ERROR(grad_norm_->post(step, held_sq_[step]));
  return Status::Ok();
}

Status StageRunner::async_update(int64_t step, StageStepResult* r) {
  double total_sq = held_sq_.at(step);
  if (grad_norm_) {
    LH_ASSIGN_OR_RETURN(total_sq, grad_norm_->collect(step));
  }
  // Step t's gradients were taken at the weights of update t − 2; they go onto the newest, t − 1 (PipeDream-2BW).
  // Those stay for step t + 1, which computes with them.
  std::vector<ParamGroup*> groups = model_.param_groups();
  LH_RETURN_IF_ERROR(use_version(step - 1));
  if (versions_.count(step - 1) == 0) versions_[step - 1] = read_groups(groups, false);
  // The next step's backwards may have begun: their gradients wait aside.
  std::vector<std::vector<float>> partial = read_groups(groups, true);
  LH_RETURN_IF_ERROR(write_groups(groups, held_.at(step), true));
  LH_ASSIGN_OR_RETURN(r->grad_norm, clip_and_step(step, total_sq));
  r->lr = lr_at(train_, step);
  LH_RETURN_IF_ERROR(write_groups(groups, partial, true));
  held_.erase(step);
  held_sq_.erase(step);
  active_version_ = newest_version_ = step;
  // Updates before step − 1 are no step's weights any more (async:predict extrapolates from step − 2 as well).
  const int64_t keep_from = options_.schedule == ScheduleKind::kAsyncPredict ? step - 2 : step - 1;
  for (auto it = versions_.lower_bound(0); it != versions_.end() && it->first < keep_from;) it = versions_.erase(it);
  return Status::Ok();
}

}  // namespace lh
