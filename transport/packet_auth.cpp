// Sealing and opening data-plane packets with libsodium: per-pair crypto_kx session keys, a Poly1305 tag keyed per
// packet from ChaCha20 (the construction ChaCha20-Poly1305 uses), or AES-256-GCM / ChaCha20-Poly1305 AEAD; and the
// replay window. Used by UcxDataPlane.
#include "transport/packet_auth.h"

#include <sodium.h>

#include <cstdlib>
#include <cstring>

namespace lh {
namespace {

void init_sodium() {
  static const int rc = sodium_init();  // thread-safe, idempotent; −1 only if no randomness is available
  if (rc < 0) std::abort();
}

enum Algorithm : uint8_t { kPoly1305 = 1, kAes256Gcm = 2, kChaCha20Poly1305 = 3 };

const char* algorithm_name(uint8_t a) {
  switch (a) {
    case kPoly1305:
      return "Poly1305";
    case kAes256Gcm:
      return "AES-256-GCM";
    case kChaCha20Poly1305:
      return "ChaCha20-Poly1305";
    default:
      return "unknown";
  }
}

uint8_t algorithm_for(PacketProtection p, const PacketKeys& keys) {
  if (p == PacketProtection::kMac) return kPoly1305;
  return keys.aes_gcm ? kAes256Gcm : kChaCha20Poly1305;
}

template <class T>
void put(uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), like the rest of the wire format
  p += sizeof(T);
}
template <class T>
T get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

constexpr size_t kAuthHeaderBytes = 40;

// What the tag covers besides the payload (never sent: both ends know it).
void encode_header(uint8_t* out, uint8_t algorithm, const PacketHeader& h, uint64_t length) {
  uint8_t* p = out;
  std::memcpy(p, "LHDP", 4);
  p += 4;
  put<uint8_t>(p, 1);  // version
  put<uint8_t>(p, algorithm);
  put<uint16_t>(p, 0);
  put<uint32_t>(p, h.epoch);
  put<uint32_t>(p, uint32_t(h.sender));
  put<uint32_t>(p, uint32_t(h.receiver));
  put<uint32_t>(p, 0);
  put<uint64_t>(p, h.tag_bits);
  put<uint64_t>(p, length);
}

void make_nonce(uint8_t nonce[12], uint32_t epoch, uint64_t seq) {
  std::memcpy(nonce, &epoch, 4);
  std::memcpy(nonce + 4, &seq, 8);
}

constexpr size_t kWireMacOffset = kWireHeaderBytes - 16;

void wire_mac(uint8_t out[16], const uint8_t* header, const std::array<uint8_t, 32>& key) {
  crypto_generichash(out, 16, header, kWireMacOffset, key.data(), key.size());
}

// Poly1305 over (header, payload) with a one-time key: the first 32 bytes of ChaCha20(key, nonce). Keys differ per
// direction and sequence numbers never repeat under one key, so no one-time key is used twice.
void poly1305_tag(uint8_t out[16], const uint8_t key[32], const uint8_t nonce[12], const uint8_t* header,
                  const uint8_t* payload, uint64_t length) {
  uint8_t one_time[crypto_onetimeauth_KEYBYTES];
  crypto_stream_chacha20_ietf(one_time, sizeof(one_time), nonce, key);
  crypto_onetimeauth_state st;
  crypto_onetimeauth_init(&st, one_time);
  crypto_onetimeauth_update(&st, header, kAuthHeaderBytes);
  if (length) crypto_onetimeauth_update(&st, payload, length);
  crypto_onetimeauth_final(&st, out);
  sodium_memzero(one_time, sizeof(one_time));
  sodium_memzero(&st, sizeof(st));
}

}  // namespace

const char* packet_protection_name(PacketProtection p) {
  switch (p) {
    case PacketProtection::kNone:
      return "none";
    case PacketProtection::kMac:
      return "mac";
    case PacketProtection::kAead:
      return "aead";
  }
  return "?";
}

Result<PacketProtection> parse_packet_protection(const std::string& name) {
  if (name == "none") return PacketProtection::kNone;
  if (name == "mac") return PacketProtection::kMac;
  if (name == "aead") return PacketProtection::kAead;
  return invalid_argument("packet protection '" + name + "' is not one of none, mac, aead");
}

uint32_t local_ciphers() {
  init_sodium();
  return crypto_aead_aes256gcm_is_available() ? kCipherAes256Gcm : 0;
}

DataKeyPair DataKeyPair::generate() {
  init_sodium();
  DataKeyPair k;
  crypto_kx_keypair(k.public_key.data(), k.secret_key.data());
  return k;
}

DataKeyPair::~DataKeyPair() {
  sodium_memzero(secret_key.data(), secret_key.size());
}

PacketKeys::~PacketKeys() {
  sodium_memzero(tx.data(), tx.size());
  sodium_memzero(rx.data(), rx.size());
  sodium_memzero(header_tx.data(), header_tx.size());
  sodium_memzero(header_rx.data(), header_rx.size());
}

Result<PacketKeys> PacketKeys::derive(int self_rank, const DataKeyPair& self, int peer_rank,
                                      const std::array<uint8_t, 32>& peer_public, uint32_t peer_ciphers) {
  init_sodium();
  if (self_rank == peer_rank)
    return invalid_argument("packet keys with oneself (rank " + std::to_string(self_rank) + ")");
  PacketKeys k;
  int rc = self_rank < peer_rank ? crypto_kx_client_session_keys(k.rx.data(), k.tx.data(), self.public_key.data(),
                                                                 self.secret_key.data(), peer_public.data())
                                 : crypto_kx_server_session_keys(k.rx.data(), k.tx.data(), self.public_key.data(),
                                                                 self.secret_key.data(), peer_public.data());
  if (rc != 0) return corrupt("the data-plane public key of rank " + std::to_string(peer_rank) + " is not a valid key");
  k.aes_gcm = (peer_ciphers & local_ciphers() & kCipherAes256Gcm) != 0;
  static_assert(crypto_kdf_KEYBYTES == 32 && crypto_kdf_CONTEXTBYTES == 8);
  crypto_kdf_derive_from_key(k.header_tx.data(), k.header_tx.size(), 1, "lhwirehd", k.tx.data());
  crypto_kdf_derive_from_key(k.header_rx.data(), k.header_rx.size(), 1, "lhwirehd", k.rx.data());
  return k;
}

void seal_packet(PacketProtection protection, const PacketKeys& keys, const PacketHeader& h, uint8_t* payload,
                 uint64_t length) {
  const uint8_t algorithm = algorithm_for(protection, keys);
  uint8_t header[kAuthHeaderBytes], nonce[12];
  encode_header(header, algorithm, h, length);
  make_nonce(nonce, h.epoch, h.seq);
  uint8_t* t = payload + length;
  uint8_t* p = t;
  put<uint32_t>(p, h.epoch);
  put<uint8_t>(p, algorithm);
  put<uint8_t>(p, 0);
  put<uint16_t>(p, 0);
  put<uint64_t>(p, h.seq);
  uint8_t* tag = p;  // 16 bytes
  unsigned long long tag_len = 16;
  switch (algorithm) {
    case kPoly1305:
      poly1305_tag(tag, keys.tx.data(), nonce, header, payload, length);
      break;
    case kAes256Gcm:
      crypto_aead_aes256gcm_encrypt_detached(payload, tag, &tag_len, payload, length, header, sizeof(header), nullptr,
                                             nonce, keys.tx.data());
      break;
    default:
      crypto_aead_chacha20poly1305_ietf_encrypt_detached(payload, tag, &tag_len, payload, length, header,
                                                         sizeof(header), nullptr, nonce, keys.tx.data());
  }
}

Result<PacketTrailer> read_trailer(const uint8_t* packet, uint64_t total) {
  if (total < kPacketTrailerBytes)
    return corrupt("a packet of " + std::to_string(total) + " bytes is shorter than its " +
                   std::to_string(kPacketTrailerBytes) + "-byte authentication trailer");
  const uint8_t* p = packet + (total - kPacketTrailerBytes);
  PacketTrailer t;
  t.epoch = get<uint32_t>(p);
  t.algorithm = get<uint8_t>(p);
  uint8_t z0 = get<uint8_t>(p);
  uint16_t z1 = get<uint16_t>(p);
  t.seq = get<uint64_t>(p);
  if (z0 || z1) return corrupt("the authentication trailer's reserved bytes are not zero");
  if (t.seq == 0) return corrupt("the authentication trailer's sequence number is 0");
  return t;
}

Status open_packet(PacketProtection protection, const PacketKeys& keys, PacketHeader h, uint8_t* packet,
                   uint64_t total) {
  LH_ASSIGN_OR_RETURN(PacketTrailer t, read_trailer(packet, total));
  const uint8_t want = algorithm_for(protection, keys);
  if (t.algorithm != want)
    return corrupt(std::string("sealed with ") + algorithm_name(t.algorithm) + ", expected " + algorithm_name(want));
  h.epoch = t.epoch;
  h.seq = t.seq;
  const uint64_t length = total - kPacketTrailerBytes;
  uint8_t header[kAuthHeaderBytes], nonce[12];
  encode_header(header, t.algorithm, h, length);
  make_nonce(nonce, h.epoch, h.seq);
  const uint8_t* tag = packet + length + 16;
  int rc;
  switch (t.algorithm) {
    case kPoly1305: {
      uint8_t mine[16];
      poly1305_tag(mine, keys.rx.data(), nonce, header, packet, length);
      rc = crypto_verify_16(mine, tag);
      break;
    }
    case kAes256Gcm:
      rc = crypto_aead_aes256gcm_decrypt_detached(packet, nullptr, packet, length, tag, header, sizeof(header), nonce,
                                                  keys.rx.data());
      break;
    default:
      rc = crypto_aead_chacha20poly1305_ietf_decrypt_detached(packet, nullptr, packet, length, tag, header,
                                                              sizeof(header), nonce, keys.rx.data());
  }
  if (rc != 0)
    return corrupt(std::string("its ") + algorithm_name(t.algorithm) +
                   " tag does not verify (forged, altered, or not from the rank it claims)");
  return Status::Ok();
}

bool ReplayWindow::fresh(uint64_t seq) const {
  if (seq == 0) return false;
  if (seq > newest_) return true;
  if (newest_ - seq >= kSpan) return false;
  return !seen_[seq % kSpan];
}

void ReplayWindow::accept(uint64_t seq) {
  if (seq > newest_) {
    // Slots between the old newest and seq now stand for sequence numbers not yet seen.
    if (seq - newest_ >= kSpan)
      seen_.reset();
    else
      for (uint64_t s = newest_ + 1; s < seq; ++s) seen_[s % kSpan] = false;
    newest_ = seq;
  }
  seen_[seq % kSpan] = true;
}

}  // namespace lh

namespace lh {

void write_wire_header(const WireHeader& h, const PacketKeys* keys, uint8_t out[kWireHeaderBytes]) {
  init_sodium();
  uint8_t* p = out;
  std::memcpy(p, "LHWH", 4);
  p += 4;
  put<uint8_t>(p, 1);  // version
  put<uint8_t>(p, h.flags);
  put<uint16_t>(p, 0);
  put<uint32_t>(p, h.packet.epoch);
  put<uint32_t>(p, uint32_t(h.packet.sender));
  put<uint32_t>(p, uint32_t(h.packet.receiver));
  put<uint32_t>(p, 0);
  put<uint64_t>(p, h.packet.tag_bits);
  put<uint64_t>(p, h.length);
  put<uint64_t>(p, h.packet.seq);
  if (keys)
    wire_mac(p, out, keys->header_tx);
  else
    std::memset(p, 0, 16);
}

Result<WireHeader> read_wire_header(const void* bytes, size_t size) {
  if (!bytes || size != kWireHeaderBytes)
    return corrupt("a packet header of " + std::to_string(size) + " bytes, not " + std::to_string(kWireHeaderBytes));
  const uint8_t* p = static_cast<const uint8_t*>(bytes);
  if (std::memcmp(p, "LHWH", 4) != 0) return corrupt("a packet header without its magic (LHWH)");
  p += 4;
  WireHeader h;
  const uint8_t version = get<uint8_t>(p);
  if (version != 1) return corrupt("a packet header of version " + std::to_string(version) + ", not 1");
  h.flags = get<uint8_t>(p);
  if (h.flags & ~kWireHello) return corrupt("a packet header with unknown flags " + std::to_string(h.flags));
  p += 2;
  h.packet.epoch = get<uint32_t>(p);
  const uint32_t sender = get<uint32_t>(p), receiver = get<uint32_t>(p);
  if (sender > 0xffffff || receiver > 0xffffff) return corrupt("a packet header naming rank " +
                                                              std::to_string(std::max(sender, receiver)));
  h.packet.sender = int(sender);
  h.packet.receiver = int(receiver);
  p += 4;
  h.packet.tag_bits = get<uint64_t>(p);
  h.length = get<uint64_t>(p);
  h.packet.seq = get<uint64_t>(p);
  if ((h.flags & kWireHello) && h.length) return corrupt("a hello header announcing " + std::to_string(h.length) +
                                                         " bytes");
  return h;
}

bool wire_header_authentic(const PacketKeys& keys, const uint8_t* bytes) {
  init_sodium();
  uint8_t mac[16];
  wire_mac(mac, bytes, keys.header_rx);
  return sodium_memcmp(mac, bytes + kWireMacOffset, 16) == 0;
}

}  // namespace lh
