// The chain recursion (nested packets, see wire.h), the ef and delta stages that wrap the rest of a
// chain, and the public encode/decode entry points. Used by everything that sends tensors.
#include "compress/codec_chain.h"

#include <cstring>
#include <set>
#include <vector>

#include "compress/chain_internal.h"
#include "compress/device_kernels.h"

namespace lh::compress {
namespace detail {

namespace {

Exec exec_for(Device d) { return d == Device::cuda ? Exec::cuda() : Exec::cpu(); }

// A tensor from a checkpoint or an earlier call, on this call's device and with this shape, or undefined.
Result<Tensor> state_on(const Tensor& t, const Exec& ex, int64_t numel) {
  if (!t.defined() || t.numel() != numel) return Tensor();
  if (t.device() == ex.device) return t;
  return t.to(ex.device);
}

// Local decode on the sending side (ef, delta): the bytes are our own, so no hash and no limits.
Status decode_own(EncodeCtx& ctx, const uint8_t* data, size_t size, Tensor* out) {
  DecodeOptions o;
  o.limits.verify_hash = false;
  o.limits.max_numel = int64_t{1} << 62;
  DecodeCtx d{ctx.st, ctx.ex, o, ctx.st.role()};
  return decode_node(d, data, size, 1, out);
}

Status encode_ef(EncodeCtx& ctx, size_t pos, const std::string& key, const Tensor& x, uint8_t* payload, size_t child) {
  StageState& ss = ctx.st.stage(key, "ef");
  const int64_t n = x.numel();
  LH_ASSIGN_OR_RETURN(Tensor e, state_on(ss.residual, ctx.ex, n));
  LH_ASSIGN_OR_RETURN(Tensor y, device_tensor(ctx.ex, x.shape()));
  if (e.defined())
    kern::axpby(ctx.ex, y.data<float>(), x.data<float>(), e.data<float>(), 1.0f, n);
  else
    LH_RETURN_IF_ERROR(y.copy_from(x));
  LH_RETURN_IF_ERROR(encode_node(ctx, pos + 1, key + ".0", y, DType::f32, payload, child));
  Tensor decoded;
  LH_RETURN_IF_ERROR(decode_own(ctx, payload, child, &decoded));
  // e ← (x + e) − decoded, written into y's storage (no longer needed) to spare an allocation.
  kern::axpby(ctx.ex, y.data<float>(), y.data<float>(), decoded.data<float>(), -1.0f, n);
  ss.residual = y.view({n});
  return Status::Ok();
}

Status check_sample_ids(const std::vector<int64_t>* ids, int64_t batch) {
  if (!ids) return invalid_argument("delta needs EncodeOptions::sample_ids (one id per row of dim 0)");
  if (static_cast<int64_t>(ids->size()) != batch)
    return invalid_argument("delta: " + std::to_string(ids->size()) + " sample ids for a tensor with dim 0 = " +
                            std::to_string(batch));
  std::set<int64_t> seen(ids->begin(), ids->end());
  if (static_cast<int64_t>(seen.size()) != batch) return invalid_argument("delta: sample ids are not distinct");
  return Status::Ok();
}

// AQ-SGD memory of one sample, or an undefined tensor for a sample not seen (or seen with another size).
Result<Tensor> sample_memory(StageState& ss, int64_t id, const Exec& ex, int64_t per) {
  auto it = ss.memory.find(id);
  if (it == ss.memory.end()) return Tensor();
  return state_on(it->second, ex, per);
}

// m(id) ← m(id) + d[b] for every sample: what both ends do with a decoded delta packet.
Status update_memories(StageState& ss, const Exec& ex, const int64_t* ids, int64_t batch, const Tensor& d,
                       Tensor* recon) {
  const int64_t per = batch ? d.numel() / batch : 0;
  for (int64_t b = 0; b < batch; ++b) {
    LH_ASSIGN_OR_RETURN(Tensor m, sample_memory(ss, ids[b], ex, per));
    LH_ASSIGN_OR_RETURN(Tensor next, device_tensor(ex, {per}));
    const float* db = d.data<float>() + b * per;
    if (m.defined())
      kern::axpby(ex, next.data<float>(), m.data<float>(), db, 1.0f, per);
    else
      LH_RETURN_IF_ERROR(copy_bytes(next.data<float>(), ex.device, db, ex.device, per * 4));
    if (recon) LH_RETURN_IF_ERROR(copy_bytes(recon->data<float>() + b * per, ex.device, next.data<float>(), ex.device, per * 4));
    ss.memory[ids[b]] = next;
  }
  return Status::Ok();
}

Status encode_delta(EncodeCtx& ctx, size_t pos, const std::string& key, const Tensor& x, uint8_t* payload,
                    size_t child) {
  const int64_t batch = x.dim(0);
  LH_RETURN_IF_ERROR(check_sample_ids(ctx.opts.sample_ids, batch));
  const int64_t* ids = ctx.opts.sample_ids->data();
  StageState& ss = ctx.st.stage(key, "delta");
  const int64_t per = batch ? x.numel() / batch : 0;
  LH_ASSIGN_OR_RETURN(Tensor d, device_tensor(ctx.ex, x.shape()));
  for (int64_t b = 0; b < batch; ++b) {
    LH_ASSIGN_OR_RETURN(Tensor m, sample_memory(ss, ids[b], ctx.ex, per));
    const float* xb = x.data<float>() + b * per;
    float* dst = d.data<float>() + b * per;
    if (m.defined())
      kern::axpby(ctx.ex, dst, xb, m.data<float>(), -1.0f, per);
    else
      LH_RETURN_IF_ERROR(copy_bytes(dst, ctx.ex.device, xb, ctx.ex.device, per * 4));
  }
  for (int64_t b = 0; b < batch; ++b) store_le<int64_t>(payload + 8 * b, ids[b]);
  const size_t own = static_cast<size_t>(batch) * 8;
  LH_RETURN_IF_ERROR(encode_node(ctx, pos + 1, key + ".0", d, DType::f32, payload + own, child));
  Tensor decoded;
  LH_RETURN_IF_ERROR(decode_own(ctx, payload + own, child, &decoded));
  return update_memories(ss, ctx.ex, ids, batch, decoded, nullptr);
}

// What every received packet must satisfy before its payload is read: its header's length is the packet's, and its
// role is the stream's.
Status check_length_and_role(const PacketHeader& h, size_t size, Role role) {
  if (h.total_bytes() != size)
    return corrupt("packet field 'payload_length': header and payload make " + std::to_string(h.total_bytes()) +
                   " bytes, the packet has " + std::to_string(size));
  if (h.role != role)
    return corrupt(std::string("packet field 'role' is ") + codec_role_name(h.role) + ", this stream carries " +
                   codec_role_name(role));
  return Status::Ok();
}

uint64_t key_hash(const std::string& key) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: stable across platforms, unlike std::hash
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

StageSpec stage_at(const std::vector<StageSpec>& stages, size_t pos) {
  return pos < stages.size() ? stages[pos] : StageSpec{};
}

Result<Tensor> device_tensor(const Exec& ex, const Shape& shape) { return Tensor::create(shape, DType::f32, ex.device); }

Result<size_t> node_bytes(const std::vector<StageSpec>& stages, size_t pos, const Shape& shape) {
  if (shape.size() > static_cast<size_t>(kMaxNdim))
    return invalid_argument("tensor has " + std::to_string(shape.size()) + " dims, packets carry at most " +
                            std::to_string(kMaxNdim));
  StageSpec s = stage_at(stages, pos);
  size_t total = kFixedHeaderBytes + 8 * shape.size();
  if (s.terminal()) return total + terminal_payload_bytes(s, shape_numel(shape));
  LH_ASSIGN_OR_RETURN(Geometry g, spec_geometry(s, shape));
  total += g.own_bytes;
  for (const Shape& c : g.children) {
    LH_ASSIGN_OR_RETURN(size_t cb, node_bytes(stages, pos + 1, c));
    total += cb;
  }
  return total;
}

Status encode_node(EncodeCtx& ctx, size_t pos, const std::string& key, const Tensor& x, DType dtype, uint8_t* dst,
                   size_t size) {
  const StageSpec s = stage_at(ctx.stages, pos);
  PacketHeader h;
  h.dtype = dtype;
  h.role = ctx.st.role();
  h.shape = x.shape();
  const size_t hb = h.header_bytes();
  h.payload_bytes = size - hb;
  uint8_t* payload = dst + hb;
  const uint64_t seed = kern::mix64(ctx.packet_seed ^ key_hash(key));
  if (s.terminal()) {
    fill_terminal_header(s, &h);
    LH_ASSERT(h.payload_bytes == terminal_payload_bytes(s, x.numel()), "terminal packet size");
    LH_RETURN_IF_ERROR(encode_terminal(ctx.ex, s, x, seed, payload));
  } else {
    h.codec = s.id;
    LH_ASSIGN_OR_RETURN(Geometry g, spec_geometry(s, x.shape()));
    std::memset(payload, 0, g.own_bytes);
    if (s.id == CodecId::ef || s.id == CodecId::delta) {
      if (s.id == CodecId::delta) h.p0 = static_cast<uint32_t>(x.dim(0));
      size_t child = size - hb - g.own_bytes;
      LH_RETURN_IF_ERROR(s.id == CodecId::ef ? encode_ef(ctx, pos, key, x, payload, child)
                                             : encode_delta(ctx, pos, key, x, payload, child));
    } else {
      TransformOut out;
      switch (s.id) {
        case CodecId::topk: LH_RETURN_IF_ERROR(encode_topk(ctx, s, x, &h, payload, &out)); break;
        case CodecId::randk: LH_RETURN_IF_ERROR(encode_randk(ctx, s, key, x, &h, &out)); break;
        case CodecId::lowrank: LH_RETURN_IF_ERROR(encode_lowrank(ctx, s, key, x, &h, &out)); break;
        case CodecId::spikes:
          LH_RETURN_IF_ERROR(encode_spikes(ctx, s, x, &h, payload, &out));
          break;
        default: LH_RETURN_IF_ERROR(encode_subspace(ctx, s, x, &h, &out)); break;
      }
      LH_ASSERT(out.children.size() == g.children.size(), "transform child count");
      size_t off = g.own_bytes;
      for (size_t i = 0; i < out.children.size(); ++i) {
        LH_ASSIGN_OR_RETURN(size_t cb, node_bytes(ctx.stages, pos + 1, g.children[i]));
        LH_RETURN_IF_ERROR(encode_node(ctx, pos + 1, key + "." + std::to_string(i), out.children[i], DType::f32,
                                       payload + off, cb));
        off += cb;
      }
      LH_ASSERT(off == h.payload_bytes, "transform packet size");
    }
  }
  write_header(h, dst);
  seal_packet(dst, &h);
  return Status::Ok();
}

Status decode_node(DecodeCtx& ctx, const uint8_t* data, size_t size, int depth, Tensor* out) {
  if (depth > kMaxNesting) return corrupt("packets nested deeper than " + std::to_string(kMaxNesting) + " levels");
  WireLimits limits = ctx.opts.limits;
  limits.verify_hash = limits.verify_hash && depth == 0;  // the root's hash covers every nested packet
  LH_ASSIGN_OR_RETURN(PacketHeader h, parse_header(data, size, limits));
  LH_RETURN_IF_ERROR(check_length_and_role(h, size, ctx.role));
  if (depth > 0 && h.dtype != DType::f32) return corrupt("packet field 'dtype' of a nested packet must be f32");
  if (h.codec == CodecId::zstd) return corrupt("packet field 'codec': zstd may only be the outermost packet");
  if ((h.codec == CodecId::ef || h.codec == CodecId::delta) && depth > 0)
    return corrupt(std::string("packet field 'codec': ") + codec_name(h.codec) + " may only be the outermost packet");
  const uint8_t* payload = data + h.header_bytes();
  auto ensure_out = [&]() -> Status {
    if (out->defined()) {
      if (out->shape() != h.shape) return internal_error("decode_node: output shape mismatch");
      return Status::Ok();
    }
    LH_ASSIGN_OR_RETURN(*out, device_tensor(ctx.ex, h.shape));
    return Status::Ok();
  };
  if (static_cast<int>(h.codec) <= static_cast<int>(CodecId::int2)) {
    LH_ASSIGN_OR_RETURN(size_t expect, terminal_payload_bytes(h));
    if (expect != h.payload_bytes)
      return corrupt("packet field 'payload_length' is " + std::to_string(h.payload_bytes) + ", " +
                     codec_name(h.codec) + " of " + shape_string(h.shape) + " needs " + std::to_string(expect));
    LH_RETURN_IF_ERROR(ensure_out());
    return decode_terminal(ctx.ex, h, payload, out);
  }
  LH_ASSIGN_OR_RETURN(Geometry g, header_geometry(h, ctx.opts.limits));
  if (g.own_bytes > h.payload_bytes)
    return corrupt(std::string("packet field 'payload_length' is too short for the ") + codec_name(h.codec) +
                   " section");
  if (h.codec == CodecId::topk) LH_RETURN_IF_ERROR(check_topk_indices(h, payload));
  if (h.codec == CodecId::spikes) LH_RETURN_IF_ERROR(check_spikes_section(h, payload));
  std::vector<Tensor> children(g.children.size());
  // ef and spikes: decode straight into the caller's tensor
  if ((h.codec == CodecId::ef || h.codec == CodecId::spikes) && out->defined()) children[0] = *out;
  size_t off = g.own_bytes;
  for (size_t i = 0; i < g.children.size(); ++i) {
    WireLimits peek = ctx.opts.limits;
    peek.verify_hash = false;
    LH_ASSIGN_OR_RETURN(PacketHeader ch, parse_header(payload + off, h.payload_bytes - off, peek));
    if (ch.shape != g.children[i])
      return corrupt(std::string("packet field 'shape' of ") + codec_name(h.codec) + " child " + std::to_string(i) +
                     " is " + shape_string(ch.shape) + ", expected " + shape_string(g.children[i]));
    LH_RETURN_IF_ERROR(decode_node(ctx, payload + off, ch.total_bytes(), depth + 1, &children[i]));
    off += ch.total_bytes();
  }
  if (off != h.payload_bytes)
    return corrupt("packet field 'payload_length' is " + std::to_string(h.payload_bytes) + " but the " +
                   codec_name(h.codec) + " section and nested packets fill " + std::to_string(off));
  switch (h.codec) {
    case CodecId::topk: LH_RETURN_IF_ERROR(ensure_out()); return decode_topk(ctx.ex, h, payload, children, out);
    case CodecId::randk: LH_RETURN_IF_ERROR(ensure_out()); return decode_randk(ctx.ex, h, children, out);
    case CodecId::lowrank: LH_RETURN_IF_ERROR(ensure_out()); return decode_lowrank(ctx.ex, h, children, out);
    case CodecId::subspace: LH_RETURN_IF_ERROR(ensure_out()); return decode_subspace(ctx, h, children, out);
    case CodecId::spikes:
      return decode_spikes(ctx.ex, h, payload, children, out);
    case CodecId::ef:
      *out = children[0];  // the nested packet's tensor is the answer
      return Status::Ok();
    default: {  // delta
      const int64_t batch = h.shape[0];
      std::vector<int64_t> ids(batch);
      for (int64_t b = 0; b < batch; ++b) ids[b] = load_le<int64_t>(payload + 8 * b);
      if (std::set<int64_t>(ids.begin(), ids.end()).size() != ids.size())
        return corrupt("packet field 'delta sample ids' has duplicates");
      LH_RETURN_IF_ERROR(ensure_out());
      StageState& ss = ctx.st.stage("0", "delta");
      LH_RETURN_IF_ERROR(update_memories(ss, ctx.ex, ids.data(), batch, children[0], out));
      if (ctx.opts.sample_ids) *ctx.opts.sample_ids = ids;
      return Status::Ok();
    }
  }
}

}  // namespace detail

using namespace detail;

Result<CodecChain> parse_codec_spec(const std::string& spec) {
  LH_ASSIGN_OR_RETURN(std::vector<StageSpec> stages, parse_stages(spec));
  return CodecChain(std::move(stages));
}

bool CodecChain::zstd_last() const {
  return !stages_.empty() && stages_.back().id == CodecId::zstd;
}

CodecChain CodecChain::before_zstd() const {
  std::vector<StageSpec> inner(stages_.begin(), stages_.end() - 1);
  if (inner.empty()) inner.emplace_back();  // `zstd` alone: none+zstd
  return CodecChain(std::move(inner));
}

Result<size_t> CodecChain::packet_bytes(const Shape& shape) const {
  if (!zstd_last()) return node_bytes(stages_, 0, shape);
  LH_ASSIGN_OR_RETURN(size_t inner, before_zstd().packet_bytes(shape));
  return zstd_packet_bound(shape, inner);
}

Status CodecChain::encode(const Tensor& x, StreamState& st, Packet* out, const EncodeOptions& opts) const {
  if (!x.defined()) return invalid_argument("encode: undefined tensor");
  if (!x.is_contiguous()) return invalid_argument("encode: tensor " + x.describe() + " is not contiguous");
  if (x.dtype() != DType::f32 && x.dtype() != DType::bf16 && x.dtype() != DType::f16)
    return invalid_argument("encode: codecs take f32, bf16 or f16 tensors, not " + x.describe());
  if (needs_sample_ids() && x.ndim() == 0) return invalid_argument("delta needs a tensor with a sample dimension 0");
  if (zstd_last()) {
    Packet inner;
    LH_RETURN_IF_ERROR(before_zstd().encode(x, st, &inner, opts));
    return zstd_wrap(stages_.back(), st.role(), x.dtype(), x.shape(), inner, out);
  }
  const Exec ex = exec_for(x.device());
  Tensor xf = x;
  if (x.dtype() != DType::f32) {
    LH_ASSIGN_OR_RETURN(xf, device_tensor(ex, x.shape()));
    kern::from_half(ex, static_cast<const uint16_t*>(x.raw_data()), x.numel(), x.dtype() == DType::bf16,
                    xf.data<float>());
  }
  LH_ASSIGN_OR_RETURN(size_t size, packet_bytes(x.shape()));
  out->bytes.resize(size);
  EncodeCtx ctx{stages_, st, ex, opts, kern::mix64(st.seed() ^ kern::mix64(st.next_sequence() + 1))};
  Status s = encode_node(ctx, 0, "0", xf, x.dtype(), out->bytes.data(), size);
  if (!s.ok()) out->bytes.clear();
  return s;
}

Status CodecChain::decode(const Packet& p, StreamState& st, Tensor* out, const DecodeOptions& opts) const {
  return decode_packet(p.bytes.data(), p.bytes.size(), st, out, opts);
}

Status decode_packet(const uint8_t* data, size_t size, StreamState& st, Tensor* out, const DecodeOptions& opts) {
  // Payload words are read in place, so they must be aligned: copy a packet that sits at an odd address.
  std::vector<uint64_t> aligned;
  if (size > 0 && reinterpret_cast<uintptr_t>(data) % 8 != 0) {  // (memcpy into an empty vector's null is UB)
    aligned.resize((size + 7) / 8);
    std::memcpy(aligned.data(), data, size);
    data = reinterpret_cast<const uint8_t*>(aligned.data());
  }
  WireLimits peek = opts.limits;
  peek.verify_hash = false;
  LH_ASSIGN_OR_RETURN(PacketHeader h, parse_header(data, size, peek));
  if (opts.expect_shape && *opts.expect_shape != h.shape)
    return corrupt("packet field 'shape' is " + shape_string(h.shape) + ", this stream expects " +
                   shape_string(*opts.expect_shape));
  if (h.codec == CodecId::zstd) {
    LH_ASSIGN_OR_RETURN(PacketHeader full, parse_header(data, size, opts.limits));  // the hash covers the frame
    LH_RETURN_IF_ERROR(check_length_and_role(full, size, st.role()));
    std::vector<uint64_t> inner;
    size_t n = 0;
    LH_RETURN_IF_ERROR(zstd_unwrap(full, data, &inner, &n));
    const uint8_t* in = reinterpret_cast<const uint8_t*>(inner.data());
    LH_ASSIGN_OR_RETURN(PacketHeader ih, parse_header(in, n, peek));
    if (ih.codec == CodecId::zstd) return corrupt("packet field 'codec': a zstd packet holds another zstd packet");
    if (ih.shape != h.shape || ih.dtype != h.dtype)
      return corrupt("packet field 'shape'/'dtype' of the packet inside zstd is " + std::string(dtype_name(ih.dtype)) +
                     shape_string(ih.shape) + ", the zstd header names " + dtype_name(h.dtype) + shape_string(h.shape));
    DecodeOptions o = opts;
    o.limits.verify_hash = false;
    return decode_packet(in, n, st, out, o);
  }
  Device dev = opts.device;
  if (out->defined()) {
    if (out->shape() != h.shape || out->dtype() != h.dtype)
      return corrupt("packet field 'shape'/'dtype' is " + std::string(dtype_name(h.dtype)) + shape_string(h.shape) +
                     ", the output tensor is " + out->describe());
    if (!out->is_contiguous()) return invalid_argument("decode: output tensor is not contiguous");
    dev = out->device();
  }
  const Exec ex = exec_for(dev);
  DecodeCtx ctx{st, ex, opts, st.role()};
  if (h.dtype == DType::f32) {
    Tensor result = *out;
    LH_RETURN_IF_ERROR(decode_node(ctx, data, size, 0, &result));
    *out = result;
    return Status::Ok();
  }
  Tensor f;
  LH_RETURN_IF_ERROR(decode_node(ctx, data, size, 0, &f));
  Tensor result = *out;
  if (!result.defined()) {
    LH_ASSIGN_OR_RETURN(result, Tensor::create(h.shape, h.dtype, dev));
  }
  kern::to_half(ex, f.data<float>(), f.numel(), h.dtype == DType::bf16, static_cast<uint16_t*>(result.raw_data()));
  *out = result;
  return Status::Ok();
}

}  // namespace lh::compress
