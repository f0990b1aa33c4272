// Subspace projection (the building block of Ramasinghe et al. 2025's subspace networks): x·U on a
// d×k orthonormal basis U that both ends build from a seed. Used by the chain recursion.
//
// A tensor is viewed as rows × d, d = the last dimension; k = min(spec k, d). Encode sends
// C = X·U (child [rows, k]); decode returns C·Uᵀ — exact for rows in the span of U.
// Header: p0 = k, p2 = the basis seed.
#include "compress/chain_internal.h"
#include "compress/device_kernels.h"
#include "core/ops.h"

namespace lh::compress::detail {

Status encode_subspace(EncodeCtx& ctx, const StageSpec& s, const Tensor& x, PacketHeader* h, TransformOut* out) {
  const int64_t d = x.shape().back(), rows = x.numel() / d, k = std::min<int64_t>(s.k, d);
  LH_ASSIGN_OR_RETURN(Tensor u, subspace_basis(ctx.st, ctx.ex, d, k, s.seed));
  LH_ASSIGN_OR_RETURN(Tensor c, device_tensor(ctx.ex, {rows, k}));
  matmul(ctx.ex, false, false, static_cast<int>(rows), static_cast<int>(k), static_cast<int>(d), 1.0f, x.data<float>(),
         static_cast<int>(d), u.data<float>(), static_cast<int>(k), 0.0f, c.data<float>(), static_cast<int>(k));
  h->p0 = static_cast<uint32_t>(k);
  h->p2 = s.seed;
  out->children = {c};
  return Status::Ok();
}

Status decode_subspace(DecodeCtx& ctx, const PacketHeader& h, const std::vector<Tensor>& ch, Tensor* out) {
  const int64_t d = h.shape.back(), rows = h.numel() / d, k = h.p0;
  LH_ASSIGN_OR_RETURN(Tensor u, subspace_basis(ctx.st, ctx.ex, d, k, h.p2));
  if (rows == 0) return Status::Ok();
  kern::low_rank_product(ctx.ex, ch[0].data<float>(), u.data<float>(), rows, d, k, out->data<float>());
  return Status::Ok();
}

}  // namespace lh::compress::detail
