// PowerSGD low-rank transform (Vogels et al. 2019) and the column orthonormalisation it shares with
// the subspace basis. Used by the chain recursion.
//
// A tensor is viewed as M (rows × m), m = the last dimension. Encode: P = M·Q, orthonormalise P,
// Q = Mᵀ·P (iters times), Q warm-started from the stream's previous call (seeded Gaussian at
// first); children P [rows, r] and Q [m, r]. Decode: M̂ = P·Qᵀ. Header: p0 = r, p1 = iters.
#include <cmath>
#include <vector>

#include "compress/chain_internal.h"
#include "compress/device_kernels.h"
#include "core/ops.h"
#include "core/rng.h"

namespace lh::compress::detail {

namespace {

// One pass of column-scaled Cholesky QR: G = PᵀP (BLAS/cuBLAS), R = chol(D·G·D) on the host in
// double, P ← P·D·R⁻¹. Scaling by D = diag(G)^-½ first makes columns of very different norms (as
// PowerSGD's P has) as easy as equal ones; a column that is (numerically) a combination of the
// ones before it becomes zero instead of noise. Two passes give orthonormality to fp32 precision.
Status cholesky_qr_pass(const Exec& ex, float* p, float* tmp, float* small_dev, int64_t n, int64_t r) {
  std::vector<float> g(r * r);
  float* gdev = ex.device == Device::cpu ? g.data() : small_dev;
  matmul(ex, true, false, static_cast<int>(r), static_cast<int>(r), static_cast<int>(n), 1.0f, p, static_cast<int>(r),
         p, static_cast<int>(r), 0.0f, gdev, static_cast<int>(r));
  if (ex.device != Device::cpu) LH_RETURN_IF_ERROR(copy_bytes(g.data(), Device::cpu, gdev, ex.device, r * r * 4));
  std::vector<double> d(r), a(r * r, 0.0), rinv(r * r, 0.0);
  for (int64_t i = 0; i < r; ++i) d[i] = g[i * r + i] > 0 ? 1.0 / std::sqrt(static_cast<double>(g[i * r + i])) : 0.0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) a[i * r + j] = g[i * r + j] * d[i] * d[j];
  // Upper Cholesky factor U (A = UᵀU), in place in `a`; dependent columns get a zero row.
  std::vector<bool> live(r, true);
  for (int64_t j = 0; j < r; ++j) {
    double s = a[j * r + j];
    for (int64_t k = 0; k < j; ++k) s -= a[k * r + j] * a[k * r + j];
    if (d[j] == 0.0 || s <= 1e-5) {  // relative to the unit diagonal: fp32 noise, not a direction
      live[j] = false;
      for (int64_t c = j; c < r; ++c) a[j * r + c] = 0.0;
      continue;
    }
    double ujj = std::sqrt(s);
    a[j * r + j] = ujj;
    for (int64_t c = j + 1; c < r; ++c) {
      double t = a[j * r + c];
      for (int64_t k = 0; k < j; ++k) t -= a[k * r + j] * a[k * r + c];
      a[j * r + c] = t / ujj;
    }
  }
  // W = D·U⁻¹ (upper triangular), dead columns zero: P·W has orthonormal live columns.
  for (int64_t c = 0; c < r; ++c) {
    if (!live[c]) continue;
    for (int64_t i = c; i >= 0; --i) {
      if (!live[i]) continue;
      double t = (i == c) ? 1.0 : 0.0;
      for (int64_t k = i + 1; k <= c; ++k) t -= a[i * r + k] * rinv[k * r + c];
      rinv[i * r + c] = t / a[i * r + i];
    }
  }
  std::vector<float> w(r * r);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t c = 0; c < r; ++c) w[i * r + c] = static_cast<float>(d[i] * rinv[i * r + c]);
  const float* wdev = w.data();
  if (ex.device != Device::cpu) {
    LH_RETURN_IF_ERROR(copy_bytes(small_dev, ex.device, w.data(), Device::cpu, r * r * 4));
    wdev = small_dev;
  }
  matmul(ex, false, false, static_cast<int>(n), static_cast<int>(r), static_cast<int>(r), 1.0f, p, static_cast<int>(r),
         wdev, static_cast<int>(r), 0.0f, tmp, static_cast<int>(r));
  return copy_bytes(p, ex.device, tmp, ex.device, n * r * 4);
}

Tensor seeded_gaussian(int64_t rows, int64_t cols, uint64_t seed, uint64_t stream) {
  Tensor t = Tensor::empty({rows, cols});
  float* p = t.data<float>();
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = philox_normal(seed, stream, static_cast<uint64_t>(i));
  return t;
}

}  // namespace

Status orthonormalize_columns(const Exec& ex, float* p, int64_t n, int64_t r) {
  if (n == 0 || r == 0) return Status::Ok();
  LH_ASSIGN_OR_RETURN(Tensor tmp, device_tensor(ex, {n, r}));
  Tensor small;
  if (ex.device != Device::cpu) {
    LH_ASSIGN_OR_RETURN(small, device_tensor(ex, {r, r}));
  }
  for (int pass = 0; pass < 2; ++pass)
    LH_RETURN_IF_ERROR(cholesky_qr_pass(ex, p, tmp.data<float>(), small.defined() ? small.data<float>() : nullptr, n, r));
  return Status::Ok();
}

Status encode_lowrank(EncodeCtx& ctx, const StageSpec& s, const std::string& key, const Tensor& x, PacketHeader* h,
                      TransformOut* out) {
  const Shape& shape = x.shape();
  const int64_t m = shape.empty() ? 1 : shape.back(), n = x.numel(), rows = m ? n / m : 0;
  const int64_t r = std::min<int64_t>({s.rank, rows, m});
  StageState& ss = ctx.st.stage(key, s.to_string());
  Tensor q = ss.warm_q;
  if (!q.defined() || q.shape() != Shape{m, r}) {
    q = seeded_gaussian(m, r, ctx.st.seed() ^ 0x504F574552ull, 0x51);
  }
  if (q.device() != ctx.ex.device) {
    LH_ASSIGN_OR_RETURN(q, q.to(ctx.ex.device));
  }
  LH_ASSIGN_OR_RETURN(Tensor p, device_tensor(ctx.ex, {rows, r}));
  const float* mp = x.data<float>();
  if (r > 0) {
    for (int it = 0; it < s.iters; ++it) {
      kern::project(ctx.ex, mp, rows, m, q.data<float>(), r, p.data<float>());
      LH_RETURN_IF_ERROR(orthonormalize_columns(ctx.ex, p.data<float>(), rows, r));
      // Q is overwritten in place: M·Q has already been consumed.
      kern::back_project(ctx.ex, mp, rows, m, p.data<float>(), r, q.data<float>());
    }
  }
  ss.warm_q = q;
  h->p0 = static_cast<uint32_t>(r);
  h->p1 = static_cast<uint32_t>(s.iters);
  out->children = {p, q};
  return Status::Ok();
}

Status decode_lowrank(const Exec& ex, const PacketHeader& h, const std::vector<Tensor>& ch, Tensor* out) {
  const int64_t m = h.shape.empty() ? 1 : h.shape.back(), n = h.numel(), rows = m ? n / m : 0;
  const int r = static_cast<int>(h.p0);
  if (r == 0 || rows == 0 || m == 0) return out->zero();
  kern::low_rank_product(ex, ch[0].data<float>(), ch[1].data<float>(), rows, m, r, out->data<float>());
  return Status::Ok();
}

Result<Tensor> subspace_basis(StreamState& st, const Exec& ex, int64_t d, int64_t k, uint64_t seed) {
  std::string key = std::string(device_name(ex.device)) + ":" + std::to_string(d) + "x" + std::to_string(k) + ":" +
                    std::to_string(seed);
  auto& cache = st.basis_cache();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // Always built on the CPU, so a CPU sender and a GPU receiver hold the same bits.
  Tensor u = seeded_gaussian(d, k, seed, 0x5355425350ull);
  LH_RETURN_IF_ERROR(orthonormalize_columns(Exec::cpu(), u.data<float>(), d, k));
  if (ex.device != Device::cpu) {
    LH_ASSIGN_OR_RETURN(u, u.to(ex.device));
  }
  if (cache.size() >= 16) cache.clear();  // a stream switching seeds must not grow without bound
  cache[key] = u;
  return u;
}

}  // namespace lh::compress::detail
