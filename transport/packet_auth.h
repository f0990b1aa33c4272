// defines: lh::PacketProtection (none | mac | aead), lh::DataKeyPair (a worker's own crypto_kx key pair),
// lh::PacketKeys (the session keys of one pair of workers, one per direction), lh::ReplayWindow, and the seal/open
// of a data-plane packet: a 32-byte trailer after the payload carrying the plan epoch, a sequence number and a
// 16-byte tag (Poly1305 with a per-packet key, or AES-256-GCM / ChaCha20-Poly1305 AEAD when payloads are
// encrypted) over (epoch, sender, receiver, tag, length, payload). libsodium does the cryptography. Used by
// UcxDataPlane, `bench link` and the transport tests.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace lh {

// How data-plane packets are protected, job-wide (the coordinator's flags decide; the Plan's job config carries it).
enum class PacketProtection : uint8_t {
  kNone = 0,  // no trailer: any process that learns a worker's address can inject packets (trusted networks only)
  kMac = 1,   // authenticated: a MAC per packet, payload in clear (the default)
  kAead = 2,  // authenticated and encrypted (--encrypt-data)
};
const char* packet_protection_name(PacketProtection p);  // "none", "mac", "aead"
Result<PacketProtection> parse_packet_protection(const std::string& name);

// The ciphers a worker's CPU runs fast, as a bit set sent in its Join: a pair uses AES-256-GCM only when both
// ends have it (libsodium runs it only on CPUs with AES-NI and CLMUL), else ChaCha20-Poly1305.
constexpr uint32_t kCipherAes256Gcm = 1;
uint32_t local_ciphers();

// A worker's data-plane identity: made fresh by every data plane, the public half goes to the coordinator in the
// Join and reaches the worker's peers in the Plan.
struct DataKeyPair {
  static constexpr size_t kBytes = 32;
  std::array<uint8_t, kBytes> public_key{}, secret_key{};
  static DataKeyPair generate();
  ~DataKeyPair();
};

// The keys of one pair of workers (crypto_kx session keys: the lower rank is the client), one for each direction:
// only these two workers can compute them, so a packet that opens with `rx` came from the peer.
struct PacketKeys {
  std::array<uint8_t, 32> tx{}, rx{};
  // The keys of the packets' wire headers (seal_wire_header), derived from tx and rx: a header's MAC is checked before
  // anything of its packet is received.
  std::array<uint8_t, 32> header_tx{}, header_rx{};
  bool aes_gcm = false;  // both ends run AES-256-GCM fast
  // Fails when `peer_public` is not a valid key (the coordinator, or whoever forged the Plan, sent garbage).
  static Result<PacketKeys> derive(int self_rank, const DataKeyPair& self, int peer_rank,
                                   const std::array<uint8_t, 32>& peer_public, uint32_t peer_ciphers);
  ~PacketKeys();
};

// What a packet's tag authenticates besides its payload: who sent it to whom, in which plan epoch, under which
// data-plane tag (DataPlane Tag bits), and the sequence number its sender gave it.
struct PacketHeader {
  uint32_t epoch = 0;
  int sender = -1, receiver = -1;
  uint64_t tag_bits = 0;
  uint64_t seq = 0;
};

constexpr size_t kPacketTrailerBytes = 32;  // epoch u32, algorithm u8, 3 zero bytes, seq u64, tag[16]

// Seals [payload, payload + length) in place (encrypts it under kAead) and writes the trailer right after it: the
// buffer holds length + kPacketTrailerBytes bytes.
void seal_packet(PacketProtection protection, const PacketKeys& keys, const PacketHeader& header, uint8_t* payload,
                 uint64_t length);

// What a received packet's trailer says, before its tag is checked.
struct PacketTrailer {
  uint32_t epoch = 0;
  uint8_t algorithm = 0;
  uint64_t seq = 0;
};
// The trailer at the end of a packet of `total` bytes; Corrupt when it is too short or malformed.
Result<PacketTrailer> read_trailer(const uint8_t* packet, uint64_t total);

// Checks a packet of `total` bytes (payload, then trailer) from `header.sender` and decrypts it in place under kAead.
// Fails (Corrupt, naming why: wrong algorithm, epoch, or a tag that does not verify) without touching what the
// caller may read; on success the payload is the first total − kPacketTrailerBytes bytes. `header.seq` and
// `header.epoch` are taken from the trailer; the caller checks them against its ReplayWindow and plan.
Status open_packet(PacketProtection protection, const PacketKeys& keys, PacketHeader header, uint8_t* packet,
                   uint64_t total);

// The header a packet travels under (the UCX active message's own header, ahead of its bytes): to whom, from whom,
// in which plan epoch, under which tag, how many bytes follow, the packet's sequence number and flags, and on an
// authenticated plane a 16-byte MAC (keyed BLAKE2b under the pair's header key). The receiver checks it before it
// receives the packet's bytes, allocates anything for them or holds its sender to a bound: a stranger's header costs
// a parse and a hash. Layout: "LHWH", version u8, flags u8, u16 0, epoch u32, sender u32, receiver u32, u32 0,
// tag u64, length u64, seq u64, mac[16].
constexpr size_t kWireHeaderBytes = 64;
constexpr uint8_t kWireHello = 1;  // flags: no packet follows; it proves the connection it came on (UcxDataPlane)
struct WireHeader {
  PacketHeader packet;  // epoch, sender, receiver, tag_bits, seq (0 on an unauthenticated plane)
  uint64_t length = 0;  // bytes that follow: the payload and, when authenticated, its trailer
  uint8_t flags = 0;
};
// Writes `h` into `out`, with its MAC under keys->header_tx when `keys` is given (else 16 zero bytes).
void write_wire_header(const WireHeader& h, const PacketKeys* keys, uint8_t out[kWireHeaderBytes]);
// The header in `bytes` (`size` of them), or Corrupt naming what is wrong (size, magic, version, flags, rank range).
// Its MAC is not checked here.
Result<WireHeader> read_wire_header(const void* bytes, size_t size);
// Whether the MAC of the header in `bytes` (kWireHeaderBytes) verifies under keys.header_rx (the peer sealed it).
bool wire_header_authentic(const PacketKeys& keys, const uint8_t* bytes);

// Sequence numbers seen from one peer: a packet is accepted once, and only if it is newer than the newest one
// minus kSpan (the window tolerates packets sealed by several threads arriving slightly out of order).
class ReplayWindow {
 public:
  static constexpr uint64_t kSpan = 4096;
  // Whether `seq` is new (a packet not seen before and not too old); does not record it.
  bool fresh(uint64_t seq) const;
  // Records `seq` (after its packet's tag verified).
  void accept(uint64_t seq);
  uint64_t newest() const { return newest_; }

 private:
  uint64_t newest_ = 0;  // 0: none yet; sequence numbers start at 1
  std::bitset<kSpan> seen_;
};

}  // namespace lh
