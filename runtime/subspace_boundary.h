// defines: lh::SubspaceBoundary — what crosses a pipeline link in a subspace model (Ramasinghe et
// al. 2025): the K coordinates c = (x − F[tok])·U of the residual stream forward, and the K-dim
// gradient g·U backward, rebuilt exactly on the other side. Used by StageRunner when
// --subspace-k is set.
#pragma once

#include "core/gpt.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lh {

// The residual stream of a subspace model is always x = F[tok] + U·c (F fixed and seeded, U a
// fixed orthonormal C×K basis), so sending c loses nothing. Backward, the stage before a link only
// influences the loss through c, so g·U (K values per token) yields exactly its parameter gradients;
// the receiver uses the projected gradient (g·U)·Uᵀ. Token ids do not travel: every worker draws
// the same batch from the job's seed.
class SubspaceBoundary {
 public:
  // `model` must be a subspace model (config().subspace_k > 0); it provides U and F, and the
  // device the tensors live on. Keeps a pointer: the model must outlive this object.
  static Result<SubspaceBoundary> create(const Gpt& model);

  int k() const { return k_; }
  // x [B,T,C] → c [B,T,K]; tokens [B·T] int32 on the model's device.
  Result<Tensor> to_coords(const Tensor& x, const Tensor& tokens) const;
  // c [B,T,K] → x [B,T,C] = c·Uᵀ + F[tok].
  Result<Tensor> from_coords(const Tensor& c, const Tensor& tokens) const;
  // g [B,T,C] → g·U [B,T,K]; and back: gk → gk·Uᵀ.
  Result<Tensor> grad_to_coords(const Tensor& g) const;
  Result<Tensor> grad_from_coords(const Tensor& gk) const;

 private:
  Status fixed_embedding(float* out, const Tensor& tokens, int B, int T) const;
  const Gpt* model_ = nullptr;
  int k_ = 0, c_ = 0;
  Tensor zero_pos_;  // [seq, C] zeros: F has no position part
};

}  // namespace lh
