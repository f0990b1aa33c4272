// The shapes a transform stage hands to later stages and the size of its own section, from a spec
// (encode) or from a received header (decode, every parameter bounds-checked). Used by the chain recursion.
#include <algorithm>

#include "compress/chain_internal.h"

namespace lh::compress::detail {

namespace {
constexpr int64_t kMaxSparseNumel = int64_t{1} << 32;  // topk/randk indices are 32-bit
constexpr int64_t kMaxSubspaceK = 4096;
constexpr int64_t kMaxBasisNumel = int64_t{1} << 24;  // 64 MiB of basis: far above any model width × k

int topk_index_width(int64_t n) { return n <= 65536 ? 2 : 4; }
int64_t last_dim(const Shape& s) { return s.empty() ? 1 : s.back(); }

Status params_zero(const PacketHeader& h, bool p0, bool p1, bool p2) {
  if (h.flags != 0) return corrupt(std::string("packet field 'flags' must be 0 for ") + codec_name(h.codec));
  if ((p0 && h.p0) || (p1 && h.p1) || (p2 && h.p2))
    return corrupt(std::string("packet field 'params': unused parameters of ") + codec_name(h.codec) + " must be 0");
  return Status::Ok();
}
}  // namespace

Result<Geometry> spec_geometry(const StageSpec& s, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  Geometry g;
  switch (s.id) {
    case CodecId::ef: g.children = {shape}; return g;
    case CodecId::delta:
      if (shape.empty()) return invalid_argument("delta needs a tensor with a sample dimension 0");
      g.own_bytes = static_cast<size_t>(shape[0]) * 8;
      g.children = {shape};
      return g;
    case CodecId::topk:
    case CodecId::randk: {
      if (n >= kMaxSparseNumel)
        return invalid_argument(std::string(codec_name(s.id)) + " takes tensors under 2^32 elements, not " +
                                shape_string(shape));
      int64_t k = sparse_count(s.ratio, n);
      if (s.id == CodecId::topk) g.own_bytes = pad8(static_cast<size_t>(k) * topk_index_width(n));
      g.children = {{k}};
      return g;
    }
    case CodecId::lowrank: {
      int64_t m = last_dim(shape), rows = m ? n / m : 0;
      int64_t r = std::min<int64_t>({s.rank, rows, m});
      g.children = {{rows, r}, {m, r}};
      return g;
    }
    case CodecId::subspace: {
      if (shape.empty() || shape.back() == 0)
        return invalid_argument("subspace needs a tensor whose last dimension is at least 1, not " + shape_string(shape));
      int64_t d = shape.back(), k = std::min<int64_t>(s.k, d);
      if (d * k > kMaxBasisNumel)
        return invalid_argument("subspace: a " + std::to_string(d) + "x" + std::to_string(k) + " basis exceeds " +
                                std::to_string(kMaxBasisNumel) + " elements");
      g.children = {{n / d, k}};
      return g;
    }
    case CodecId::spikes:
      g.own_bytes = spikes_own_bytes(n, s.spike_block, s.spikes, s.spike_fp32);
      g.children = {shape};
      return g;
    default: return internal_error(std::string("spec_geometry of terminal stage ") + codec_name(s.id));
  }
}

Result<Geometry> header_geometry(const PacketHeader& h, const WireLimits& limits) {
  const int64_t n = h.numel();
  Geometry g;
  switch (h.codec) {
    case CodecId::ef:
      LH_RETURN_IF_ERROR(params_zero(h, true, true, true));
      g.children = {h.shape};
      return g;
    case CodecId::delta:
      LH_RETURN_IF_ERROR(params_zero(h, false, true, true));
      if (h.shape.empty()) return corrupt("packet field 'ndim' is 0, delta needs a sample dimension");
      if (h.p0 != static_cast<uint64_t>(h.shape[0]))
        return corrupt("packet field 'delta samples' is " + std::to_string(h.p0) + ", shape[0] is " +
                       std::to_string(h.shape[0]));
      g.own_bytes = static_cast<size_t>(h.shape[0]) * 8;
      g.children = {h.shape};
      return g;
    case CodecId::topk: {
      LH_RETURN_IF_ERROR(params_zero(h, false, true, false));
      int64_t k = static_cast<int64_t>(h.p2);
      if (h.p2 > static_cast<uint64_t>(n) || (n > 0 && k == 0))
        return corrupt("packet field 'topk k' is " + std::to_string(h.p2) + ", allowed 1.." + std::to_string(n));
      if (static_cast<int>(h.p0) != topk_index_width(n))
        return corrupt("packet field 'topk index width' is " + std::to_string(h.p0) + ", " + std::to_string(n) +
                       " elements use " + std::to_string(topk_index_width(n)));
      g.own_bytes = pad8(static_cast<size_t>(k) * h.p0);
      g.children = {{k}};
      return g;
    }
    case CodecId::randk: {
      LH_RETURN_IF_ERROR(params_zero(h, false, true, false));
      if (h.p0 > static_cast<uint64_t>(n) || (n > 0 && h.p0 == 0))
        return corrupt("packet field 'randk k' is " + std::to_string(h.p0) + ", allowed 1.." + std::to_string(n));
      g.children = {{static_cast<int64_t>(h.p0)}};
      return g;
    }
    case CodecId::lowrank: {
      LH_RETURN_IF_ERROR(params_zero(h, false, false, true));
      int64_t m = last_dim(h.shape), rows = m ? n / m : 0;
      int64_t rmax = std::min<int64_t>({1024, rows, m});
      if (h.p0 > static_cast<uint64_t>(rmax) || (rmax > 0 && h.p0 == 0))
        return corrupt("packet field 'lowrank rank' is " + std::to_string(h.p0) + ", allowed 1.." + std::to_string(rmax));
      if (h.p1 < 1 || h.p1 > 16) return corrupt("packet field 'lowrank iters' is " + std::to_string(h.p1) + ", allowed 1..16");
      int64_t r = h.p0;
      g.children = {{rows, r}, {m, r}};
      return g;
    }
    case CodecId::subspace: {
      LH_RETURN_IF_ERROR(params_zero(h, false, true, false));
      if (h.shape.empty() || h.shape.back() == 0) return corrupt("packet field 'shape' has no last dimension for subspace");
      int64_t d = h.shape.back();
      int64_t kmax = std::min<int64_t>(d, kMaxSubspaceK);
      if (h.p0 < 1 || h.p0 > static_cast<uint64_t>(kmax))
        return corrupt("packet field 'subspace k' is " + std::to_string(h.p0) + ", allowed 1.." + std::to_string(kmax));
      // The receiver builds a d×k basis: bound it like any tensor it allocates.
      if (d * static_cast<int64_t>(h.p0) > std::min(limits.max_numel, kMaxBasisNumel))
        return corrupt("packet field 'subspace k': a " + std::to_string(d) + "x" + std::to_string(h.p0) +
                       " basis exceeds the basis limit");
      g.children = {{n / d, static_cast<int64_t>(h.p0)}};
      return g;
    }
    case CodecId::spikes: {
      if (h.flags & ~kSpikesFlagFp32) return corrupt("packet field 'flags' has unknown bits for spikes");
      if (h.p2 != 0) return corrupt("packet field 'params': unused parameters of spikes must be 0");
      if (h.p0 < 4 || h.p0 > static_cast<uint32_t>(kMaxSpikeBlock))
        return corrupt("packet field 'spikes block' is " + std::to_string(h.p0) + ", allowed 4.." +
                       std::to_string(kMaxSpikeBlock));
      if (h.p1 < 1 || h.p1 > static_cast<uint32_t>(kMaxSpikes) || h.p1 >= h.p0)
        return corrupt("packet field 'spikes per block' is " + std::to_string(h.p1) + ", allowed 1.." +
                       std::to_string(std::min<uint32_t>(kMaxSpikes, h.p0 - 1)));
      g.own_bytes = spikes_own_bytes(n, static_cast<int>(h.p0), static_cast<int>(h.p1), h.flags & kSpikesFlagFp32);
      g.children = {h.shape};
      return g;
    }
    default: return internal_error("header_geometry of a terminal codec");
  }
}

}  // namespace lh::compress::detail
