// StageRunner's optimizer updates: the clip by the whole model's gradient norm and the AdamW step, and --sync
// delayed's updates (the averages due at a step) with the weight prediction around a step's compute. Used by
// parallel/stage_runner.cpp.
#include <cmath>

#include "core/ops.h"
#include "parallel/stage_runner.h"

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
  // Clip by the norm of the whole model's gradient, as the single-process trainer does. Parameters every tp shard
  // holds whole count on shard 0 only.
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
  double total_sq = local_sq;
  if (grad_norm_) {
    TraceScope traced(trace_, "norm", step);
    LH_ASSIGN_OR_RETURN(total_sq, grad_norm_->total_sq(step, local_sq));
  }
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

}  // namespace lh
