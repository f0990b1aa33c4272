// The checked envelope around a UCX worker address ("LHUA", version, length, xxHash64), declared in
// transport/ucx_data_plane.h. Used by UcxDataPlane (its own address) and by connect() (the peers').
#include <xxhash.h>

#include <cstring>

#include "transport/ucx_data_plane.h"

namespace lh {
namespace {

constexpr uint32_t kAddrMagic = 0x41554c48;  // "LHUA" little-endian
constexpr uint16_t kAddrVersion = 1;
constexpr size_t kAddrHeader = 4 + 2 + 2 + 4 + 8;
constexpr size_t kMaxAddress = 1 << 20;

template <class T>
void put(Bytes& b, T v) {
  uint8_t tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}
template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

Bytes wrap_worker_address(const void* ucx_address, size_t length) {
  Bytes b;
  b.reserve(kAddrHeader + length);
  put<uint32_t>(b, kAddrMagic);
  put<uint16_t>(b, kAddrVersion);
  put<uint16_t>(b, 0);
  put<uint32_t>(b, uint32_t(length));
  put<uint64_t>(b, XXH64(ucx_address, length, 0));
  const uint8_t* p = static_cast<const uint8_t*>(ucx_address);
  b.insert(b.end(), p, p + length);
  return b;
}

Result<Bytes> unwrap_worker_address(const Bytes& e) {
  if (e.size() < kAddrHeader)
    return corrupt("worker address: " + std::to_string(e.size()) + " bytes, shorter than its " +
                   std::to_string(kAddrHeader) + "-byte header");
  if (get<uint32_t>(e.data()) != kAddrMagic) return corrupt("worker address: bad magic (not a longhaul UCX address)");
  if (get<uint16_t>(e.data() + 4) != kAddrVersion)
    return corrupt("worker address: version " + std::to_string(get<uint16_t>(e.data() + 4)) + ", expected " +
                   std::to_string(kAddrVersion));
  uint32_t len = get<uint32_t>(e.data() + 8);
  if (len == 0 || len > kMaxAddress || len != e.size() - kAddrHeader)
    return corrupt("worker address: length field " + std::to_string(len) + " does not match the " +
                   std::to_string(e.size() - kAddrHeader) + " bytes present");
  if (XXH64(e.data() + kAddrHeader, len, 0) != get<uint64_t>(e.data() + 12))
    return corrupt("worker address: checksum mismatch");
  return Bytes(e.begin() + kAddrHeader, e.end());
}

}  // namespace lh
