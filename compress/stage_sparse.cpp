// Sparsifying transforms: topk (largest magnitudes + their indices) and randk (a subset drawn from a
// seed carried in the header, so no indices travel). Used by the chain recursion.
//
// topk header: p0 = index width in bytes (2 when the tensor has at most 65536 elements, else 4),
// p2 = k; own section = k ascending indices, padded to 8. randk header: p0 = k, p2 = the seed.
// Child packet of both: the k values, shape [k].
#include <vector>

#include "compress/chain_internal.h"
#include "compress/device_kernels.h"

namespace lh::compress::detail {

Status encode_topk(EncodeCtx& ctx, const StageSpec& s, const Tensor& x, PacketHeader* h, uint8_t* own,
                   TransformOut* out) {
  const int64_t n = x.numel(), k = sparse_count(s.ratio, n);
  const int width = n <= 65536 ? 2 : 4;
  LH_ASSIGN_OR_RETURN(Tensor idx, Tensor::create({k}, DType::i32, ctx.ex.device));
  uint32_t* ip = static_cast<uint32_t*>(idx.raw_data());
  LH_RETURN_IF_ERROR(kern::topk_indices(ctx.ex, x.data<float>(), n, k, ip));
  LH_ASSIGN_OR_RETURN(Tensor values, device_tensor(ctx.ex, {k}));
  kern::index_gather(ctx.ex, x.data<float>(), ip, k, values.data<float>());
  std::vector<uint32_t> host;
  const uint32_t* hp = ip;
  if (ctx.ex.device != Device::cpu) {
    host.resize(k);
    LH_RETURN_IF_ERROR(copy_bytes(host.data(), Device::cpu, ip, ctx.ex.device, k * 4));
    hp = host.data();
  }
  if (width == 2)
    for (int64_t j = 0; j < k; ++j) store_le<uint16_t>(own + 2 * j, static_cast<uint16_t>(hp[j]));
  else
    for (int64_t j = 0; j < k; ++j) store_le<uint32_t>(own + 4 * j, hp[j]);
  h->p0 = static_cast<uint32_t>(width);
  h->p2 = static_cast<uint64_t>(k);
  out->children = {values};
  return Status::Ok();
}

Status check_topk_indices(const PacketHeader& h, const uint8_t* own) {
  const int64_t n = h.numel(), k = static_cast<int64_t>(h.p2);
  int64_t prev = -1;
  for (int64_t j = 0; j < k; ++j) {
    int64_t i = h.p0 == 2 ? load_le<uint16_t>(own + 2 * j) : load_le<uint32_t>(own + 4 * j);
    if (i >= n || i <= prev)
      return corrupt("packet field 'topk indices': entry " + std::to_string(j) + " is " + std::to_string(i) +
                     (i >= n ? ", beyond the " + std::to_string(n) + " elements" : ", not above the one before"));
    prev = i;
  }
  size_t used = static_cast<size_t>(k) * h.p0;
  for (size_t b = used; b < pad8(used); ++b)
    if (own[b] != 0) return corrupt("packet field 'topk indices' has nonzero padding");
  return Status::Ok();
}

Status decode_topk(const Exec& ex, const PacketHeader& h, const uint8_t* own, const std::vector<Tensor>& ch,
                   Tensor* out) {
  const int64_t k = static_cast<int64_t>(h.p2);
  LH_RETURN_IF_ERROR(out->zero());
  const uint32_t* idx = reinterpret_cast<const uint32_t*>(own);
  std::vector<uint32_t> wide;
  if (h.p0 == 2) {
    wide.resize(k);
    for (int64_t j = 0; j < k; ++j) wide[j] = load_le<uint16_t>(own + 2 * j);
    idx = wide.data();
  }
  Tensor dev_idx;
  if (ex.device != Device::cpu) {
    LH_ASSIGN_OR_RETURN(dev_idx, Tensor::create({k}, DType::i32, ex.device));
    LH_RETURN_IF_ERROR(copy_bytes(dev_idx.raw_data(), ex.device, idx, Device::cpu, k * 4));
    idx = static_cast<const uint32_t*>(dev_idx.raw_data());
  }
  kern::index_scatter(ex, ch[0].data<float>(), idx, k, out->data<float>());
  return Status::Ok();
}

Status encode_randk(EncodeCtx& ctx, const StageSpec& s, const std::string& key, const Tensor& x, PacketHeader* h,
                    TransformOut* out) {
  const int64_t n = x.numel(), k = sparse_count(s.ratio, n);
  const uint64_t seed = kern::mix64(ctx.packet_seed + 0x52414E444Bull + key.size());
  LH_ASSIGN_OR_RETURN(Tensor values, device_tensor(ctx.ex, {k}));
  kern::randk_gather(ctx.ex, x.data<float>(), static_cast<uint64_t>(n), seed, k, values.data<float>());
  h->p0 = static_cast<uint32_t>(k);
  h->p2 = seed;
  out->children = {values};
  return Status::Ok();
}

Status decode_randk(const Exec& ex, const PacketHeader& h, const std::vector<Tensor>& ch, Tensor* out) {
  LH_RETURN_IF_ERROR(out->zero());
  kern::randk_scatter(ex, ch[0].data<float>(), static_cast<uint64_t>(h.numel()), h.p2, h.p0, out->data<float>());
  return Status::Ok();
}

}  // namespace lh::compress::detail
