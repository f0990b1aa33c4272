// The zstd stage: lossless zstd (libzstd) of the whole packet that the stages before it make, carried
// as one outer packet. Used by CodecChain::encode / packet_bytes and decode_packet.
//
// Outer packet: header with codec zstd, the tensor's dtype, role and shape (as the inner packet's),
// p0 = the level it was made with, p1 = the zstd frame's bytes, p2 = the inner packet's bytes; the
// payload is the frame, zero-padded to 8 bytes. The outer hash covers the compressed bytes; the inner
// packet is not hashed again after decompression (zstd's decoder is deterministic on verified bytes).
// It runs on the CPU for tensors on any device: the codecs before it already produce host bytes.
#include <zstd.h>

#include <cstring>
#include <memory>

#include "compress/chain_internal.h"

namespace lh::compress::detail {

namespace {

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// One context per thread, reused: creating one costs more than compressing a small packet.
ZSTD_CCtx* thread_cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CctxFree> c(ZSTD_createCCtx());
  return c.get();
}
ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DctxFree> d(ZSTD_createDCtx());
  return d.get();
}

}  // namespace

size_t zstd_max_inner_bytes(const Shape& shape) {
  // No chain makes more than 16 bytes per element (topk at ratio 1 makes 8 plus headers); the bound keeps a
  // small packet from claiming a huge decompressed size.
  return 16 * static_cast<size_t>(shape_numel(shape)) + 64 * 1024;
}

size_t zstd_packet_bound(const Shape& shape, size_t inner_bytes) {
  return kFixedHeaderBytes + 8 * shape.size() + pad8(ZSTD_compressBound(inner_bytes));
}

Status zstd_wrap(const StageSpec& s, Role role, DType dtype, const Shape& shape, const Packet& inner, Packet* out) {
  if (inner.size() > zstd_max_inner_bytes(shape))
    return invalid_argument("zstd: the packet before it has " + std::to_string(inner.size()) + " bytes for " +
                            shape_string(shape) + ", more than the " + std::to_string(zstd_max_inner_bytes(shape)) +
                            " a zstd packet may carry");
  PacketHeader h;
  h.codec = CodecId::zstd;
  h.dtype = dtype;
  h.role = role;
  h.shape = shape;
  h.p0 = static_cast<uint32_t>(s.level);
  h.p2 = inner.size();
  const size_t hb = h.header_bytes();
  out->bytes.resize(zstd_packet_bound(shape, inner.size()));
  const size_t frame = ZSTD_compressCCtx(thread_cctx(), out->bytes.data() + hb, out->bytes.size() - hb,
                                         inner.bytes.data(), inner.size(), s.level);
  if (ZSTD_isError(frame)) {
    out->bytes.clear();
    return internal_error(std::string("zstd compression failed: ") + ZSTD_getErrorName(frame));
  }
  h.p1 = static_cast<uint32_t>(frame);
  h.payload_bytes = pad8(frame);
  std::memset(out->bytes.data() + hb + frame, 0, h.payload_bytes - frame);
  out->bytes.resize(hb + h.payload_bytes);
  write_header(h, out->bytes.data());
  seal_packet(out->bytes.data(), &h);
  return Status::Ok();
}

Status zstd_unwrap(const PacketHeader& h, const uint8_t* packet, std::vector<uint64_t>* inner, size_t* inner_bytes) {
  if (h.flags != 0) return corrupt("packet field 'flags' must be 0 for zstd");
  if (h.p0 < 1 || h.p0 > 19) return corrupt("packet field 'zstd level' is " + std::to_string(h.p0) + ", not in 1..19");
  if (h.p1 == 0 || pad8(h.p1) != h.payload_bytes)
    return corrupt("packet field 'zstd frame bytes' is " + std::to_string(h.p1) + " for a payload of " +
                   std::to_string(h.payload_bytes));
  const uint8_t* frame = packet + h.header_bytes();
  for (uint64_t i = h.p1; i < h.payload_bytes; ++i)
    if (frame[i] != 0) return corrupt("packet field 'zstd padding' is not zero");
  if (h.p2 < kFixedHeaderBytes || h.p2 > zstd_max_inner_bytes(h.shape))
    return corrupt("packet field 'zstd inner bytes' is " + std::to_string(h.p2) + ", outside " +
                   std::to_string(kFixedHeaderBytes) + ".." + std::to_string(zstd_max_inner_bytes(h.shape)) + " for " +
                   shape_string(h.shape));
  const unsigned long long content = ZSTD_getFrameContentSize(frame, h.p1);
  if (content != h.p2)
    return corrupt("packet field 'zstd frame': its content size is not the " + std::to_string(h.p2) +
                   " bytes the header names");
  inner->assign((h.p2 + 7) / 8, 0);
  const size_t got = ZSTD_decompressDCtx(thread_dctx(), inner->data(), h.p2, frame, h.p1);
  if (ZSTD_isError(got)) return corrupt(std::string("packet field 'zstd frame': ") + ZSTD_getErrorName(got));
  if (got != h.p2)
    return corrupt("packet field 'zstd frame' holds " + std::to_string(got) + " bytes, the header names " +
                   std::to_string(h.p2));
  *inner_bytes = got;
  return Status::Ok();
}

}  // namespace lh::compress::detail
