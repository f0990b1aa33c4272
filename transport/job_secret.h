// defines: lh::JobSecret — a job's secret (32 bytes; a key file holds it as 64 hex digits, `longhaul keygen`) and
// what the control plane derives from it with libsodium's KDF: the coordinator's CURVE key pair, the CURVE key pair
// of every member (the coordinator's ZAP handler admits that public key only), and the join proof a Join or ctl
// request carries inside the encrypted channel. Used by the app layer (coordinator, worker, ctl, launch, keygen).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "transport/zmq_loop.h"

namespace lh {

class JobSecret {
 public:
  static constexpr size_t kBytes = 32;
  // 32 random bytes.
  static JobSecret generate();
  // A key file's first line: 64 hex digits. Any other non-empty text (a token from before key files) is stretched
  // into a secret with Argon2id (crypto_pwhash: kTokenOps passes over kTokenMemory, about 0.3 s here), and *weak
  // says so (such a secret is only as strong as the text).
  static Result<JobSecret> parse(const std::string& text, bool* weak = nullptr);
  static constexpr unsigned long long kTokenOps = 3;
  static constexpr size_t kTokenMemory = size_t(64) << 20;
  // Reads a key file; `flag` names where it came from in errors ("--key-file"). A file that group or others may
  // read is refused, naming `chmod 600`: the secret is the job.
  static constexpr int64_t kMaxKeyFileBytes = 4096;
  static Result<JobSecret> load(const std::string& path, const std::string& flag, bool* weak = nullptr);
  // Writes a new key file readable by its owner only (0600); refuses to replace an existing file.
  Status save_new(const std::string& path) const;

  std::string to_hex() const;
  // The CURVE keys of the control plane: the coordinator's (server) and the members' (client), derived apart.
  ZmqLoop::Curve server_curve() const;
  ZmqLoop::Curve client_curve() const;
  // What Join and CtlRequest carry as their token (hex of a derived key; it never leaves a CURVE channel).
  std::string join_proof() const;
  // The key a relay checks each rank's hello with (RelayOptions::rank_key; 32 bytes), derived apart from the others.
  std::string relay_rank_key() const;
  // The live page's token (`--http`; 48 hex digits), derived apart from the others: it reads the job's page and
  // /metrics, nothing else, and the secret cannot be recovered from it.
  std::string page_token() const;
  // The key (32 bytes) that authenticates what a process publishes in an untrusted rendezvous store (the PyTorch
  // bridge's address, data-plane public key and epoch in torch.distributed's store), derived apart from the others:
  // a store writer without the secret cannot put in a key of its own.
  std::string store_entry_key() const;

 private:
  std::array<uint8_t, kBytes> key_{};
};

// Equal strings, compared in constant time (sodium_memcmp; strings of different lengths differ).
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace lh
