// Subspace coordinates across pipeline links: x = F[tok] + U·c forward, g·U backward.
// Used by StageRunner when --subspace-k is set.
#include "runtime/subspace_boundary.h"

#include "core/ops.h"

namespace lh {
namespace {

Status check(const Tensor& t, int last_dim, Device dev, const char* what) {
  if (t.ndim() != 3 || t.dim(2) != last_dim || t.dtype() != DType::f32 || t.device() != dev || !t.is_contiguous())
    return invalid_argument(std::string("subspace boundary: ") + what + " " + t.describe() +
                            " is not a contiguous f32 [B, T, " + std::to_string(last_dim) + "] on " + device_name(dev));
  return Status::Ok();
}

}  // namespace

Result<SubspaceBoundary> SubspaceBoundary::create(const Gpt& model) {
  const GptConfig& cfg = model.config();
  if (cfg.subspace_k <= 0) return invalid_argument("subspace boundary: the model has no subspace (--subspace-k is 0)");
  if (!model.subspace_basis().defined() || !model.subspace_fixed_embedding().defined())
    return internal_error("subspace boundary: the model has no basis or fixed embedding");
  SubspaceBoundary b;
  b.model_ = &model;
  b.k_ = cfg.subspace_k;
  b.c_ = cfg.d_model;
  LH_ASSIGN_OR_RETURN(b.zero_pos_, Tensor::create({cfg.seq, cfg.d_model}, DType::f32, model.device()));
  LH_RETURN_IF_ERROR(b.zero_pos_.zero());
  return b;
}

Status SubspaceBoundary::fixed_embedding(float* out, const Tensor& tokens, int B, int T) const {
  if (tokens.dtype() != DType::i32 || tokens.numel() != int64_t(B) * T || tokens.device() != model_->device())
    return invalid_argument("subspace boundary: tokens " + tokens.describe() + " are not int32 [" +
                            std::to_string(B * T) + "] on the model's device");
  if (T > zero_pos_.dim(0)) return invalid_argument("subspace boundary: sequence longer than the model's context");
  embedding_forward(model_->exec(), out, tokens.data<int32_t>(), model_->subspace_fixed_embedding().data<float>(),
                    zero_pos_.data<float>(), B, T, c_);
  return Status::Ok();
}

Result<Tensor> SubspaceBoundary::to_coords(const Tensor& x, const Tensor& tokens) const {
  LH_RETURN_IF_ERROR(check(x, c_, model_->device(), "activation"));
  const int B = int(x.dim(0)), T = int(x.dim(1)), BT = B * T;
  LH_ASSIGN_OR_RETURN(Tensor diff, Tensor::create({B, T, c_}, DType::f32, model_->device()));
  LH_RETURN_IF_ERROR(fixed_embedding(diff.data<float>(), tokens, B, T));
  const Exec& ex = model_->exec();
  scale_inplace(ex, diff.data<float>(), -1.f, int64_t(BT) * c_);
  add_inplace(ex, diff.data<float>(), x.data<float>(), int64_t(BT) * c_);  // x − F[tok]
  LH_ASSIGN_OR_RETURN(Tensor out, Tensor::create({B, T, k_}, DType::f32, model_->device()));
  matmul(ex, false, false, BT, k_, c_, 1.f, diff.data<float>(), c_, model_->subspace_basis().data<float>(), k_, 0.f,
         out.data<float>(), k_);
  return out;
}

Result<Tensor> SubspaceBoundary::from_coords(const Tensor& c, const Tensor& tokens) const {
  LH_RETURN_IF_ERROR(check(c, k_, model_->device(), "coordinates"));
  const int B = int(c.dim(0)), T = int(c.dim(1)), BT = B * T;
  LH_ASSIGN_OR_RETURN(Tensor x, Tensor::create({B, T, c_}, DType::f32, model_->device()));
  LH_RETURN_IF_ERROR(fixed_embedding(x.data<float>(), tokens, B, T));
  matmul(model_->exec(), false, true, BT, c_, k_, 1.f, c.data<float>(), k_, model_->subspace_basis().data<float>(), k_,
         1.f, x.data<float>(), c_);
  return x;
}

Result<Tensor> SubspaceBoundary::grad_to_coords(const Tensor& g) const {
  LH_RETURN_IF_ERROR(check(g, c_, model_->device(), "gradient"));
  const int B = int(g.dim(0)), T = int(g.dim(1));
  LH_ASSIGN_OR_RETURN(Tensor out, Tensor::create({B, T, k_}, DType::f32, model_->device()));
  matmul(model_->exec(), false, false, B * T, k_, c_, 1.f, g.data<float>(), c_, model_->subspace_basis().data<float>(),
         k_, 0.f, out.data<float>(), k_);
  return out;
}

Result<Tensor> SubspaceBoundary::grad_from_coords(const Tensor& gk) const {
  LH_RETURN_IF_ERROR(check(gk, k_, model_->device(), "gradient coordinates"));
  const int B = int(gk.dim(0)), T = int(gk.dim(1));
  LH_ASSIGN_OR_RETURN(Tensor out, Tensor::create({B, T, c_}, DType::f32, model_->device()));
  matmul(model_->exec(), false, true, B * T, c_, k_, 1.f, gk.data<float>(), k_, model_->subspace_basis().data<float>(),
         k_, 0.f, out.data<float>(), c_);
  return out;
}

}  // namespace lh
