// The checked envelope around a UCX worker address ("LHUA", version, length, xxHash64), declared in
// transport/worker_address.h, with the address a worker advertises (--advertise) when it has one. Used by UcxDataPlane
// (its own address) and by connect() (the peers').
#include "transport/worker_address.h"

#include <xxhash.h>

#include <cctype>
#include <cstring>

namespace lh {
namespace {

constexpr uint32_t kAddrMagic = 0x41554c48;  // "LHUA" little-endian
constexpr uint16_t kAddrVersion = 1;
constexpr uint16_t kAdvertisedVersion = 2;
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

Bytes wrap_worker_address(const void* ucx_address, size_t length, const std::string& host, int port) {
  // Version 1: the UCX address alone. Version 2 (an advertised address): port (u16), host length (u8), host, then
  // the UCX address.
  Bytes payload;
  if (!host.empty()) {
    put<uint16_t>(payload, uint16_t(port));
    payload.push_back(uint8_t(host.size()));
    payload.insert(payload.end(), host.begin(), host.end());
  }
  const uint8_t* p = static_cast<const uint8_t*>(ucx_address);
  payload.insert(payload.end(), p, p + length);
  Bytes b;
  b.reserve(kAddrHeader + payload.size());
  put<uint32_t>(b, kAddrMagic);
  put<uint16_t>(b, host.empty() ? kAddrVersion : kAdvertisedVersion);
  put<uint16_t>(b, 0);
  put<uint32_t>(b, uint32_t(payload.size()));
  put<uint64_t>(b, XXH64(payload.data(), payload.size(), 0));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

Status check_advertised_host(const std::string& host) {
  if (host.empty()) return invalid_argument("empty host");
  if (host.size() > 253) return invalid_argument("longer than 253 characters");
  for (char c : host)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
      return invalid_argument(std::string("'") + c + "' is not allowed in a host name or IPv4 address");
  return Status::Ok();
}

std::string PeerAddress::describe() const {
  return host.empty() ? std::string() : "advertised " + host + ":" + std::to_string(port);
}

Result<PeerAddress> unwrap_peer_address(const Bytes& e) {
  if (e.size() < kAddrHeader)
    return corrupt("worker address: " + std::to_string(e.size()) + " bytes, shorter than its " +
                   std::to_string(kAddrHeader) + "-byte header");
  if (get<uint32_t>(e.data()) != kAddrMagic) return corrupt("worker address: bad magic (not a longhaul UCX address)");
  const uint16_t version = get<uint16_t>(e.data() + 4);
  if (version != kAddrVersion && version != kAdvertisedVersion)
    return corrupt("worker address: version " + std::to_string(version) + ", expected " +
                   std::to_string(kAddrVersion) + " or " + std::to_string(kAdvertisedVersion));
  uint32_t len = get<uint32_t>(e.data() + 8);
  if (len == 0 || len > kMaxAddress || len != e.size() - kAddrHeader)
    return corrupt("worker address: length field " + std::to_string(len) + " does not match the " +
                   std::to_string(e.size() - kAddrHeader) + " bytes present");
  if (XXH64(e.data() + kAddrHeader, len, 0) != get<uint64_t>(e.data() + 12))
    return corrupt("worker address: checksum mismatch");
  PeerAddress a;
  size_t at = kAddrHeader;
  if (version == kAdvertisedVersion) {
    if (len < 3) return corrupt("worker address: advertised address truncated");
    a.port = get<uint16_t>(e.data() + at);
    const size_t host_len = e[at + 2];
    at += 3;
    if (a.port == 0) return corrupt("worker address: advertised port 0");
    if (host_len == 0 || at + host_len >= e.size())
      return corrupt("worker address: advertised host of " + std::to_string(host_len) + " bytes does not fit");
    a.host.assign(reinterpret_cast<const char*>(e.data() + at), host_len);
    at += host_len;
    Status ok = check_advertised_host(a.host);
    if (!ok.ok()) return corrupt("worker address: advertised host: " + ok.message());
  }
  a.worker.assign(e.begin() + at, e.end());
  return a;
}

Result<Bytes> unwrap_worker_address(const Bytes& e) {
  LH_ASSIGN_OR_RETURN(PeerAddress a, unwrap_peer_address(e));
  return std::move(a.worker);
}

}  // namespace lh
