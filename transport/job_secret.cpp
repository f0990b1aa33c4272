// JobSecret: key files, and the control plane's keys derived from a job's secret (libsodium). Used by the app layer.
#include "transport/job_secret.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace lh {
namespace {

constexpr char kKdfContext[crypto_kdf_CONTEXTBYTES + 1] = "lhctrl01";
enum Subkey : uint64_t {
  kServerCurve = 1,
  kClientCurve = 2,
  kJoinProof = 3,
  kRelayRanks = 4,
  kPageToken = 5,
  kStoreEntry = 6
};

void init_sodium() {
  static const int rc = sodium_init();  // thread-safe, idempotent; −1 only if no randomness is available
  if (rc < 0) std::abort();
}

std::string z85(const uint8_t* key) {
  char text[41];
  zmq_z85_encode(text, key, 32);
  return text;
}

ZmqLoop::Curve keypair(const std::array<uint8_t, 32>& master, uint64_t id) {
  init_sodium();
  uint8_t seed[crypto_box_SEEDBYTES], pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES];
  crypto_kdf_derive_from_key(seed, sizeof(seed), id, kKdfContext, master.data());
  crypto_box_seed_keypair(pk, sk, seed);
  ZmqLoop::Curve c;
  c.public_key = z85(pk);
  c.secret_key = z85(sk);
  sodium_memzero(seed, sizeof(seed));
  sodium_memzero(sk, sizeof(sk));
  return c;
}

// BLAKE2b-256 of secrets known to be public: launch_metrics.key, committed to the repository from beb0e44 until it
// was removed. Every checkout of those commits holds it, so a job keyed with it is open to anyone.
bool is_public(const std::array<uint8_t, 32>& key) {
  static constexpr char kPublic[][65] = {"12339c6bddd4522c5aaa258b501474998b41f3a71f52edff27c4654e8e22962e"};
  uint8_t h[32];
  crypto_generichash(h, sizeof(h), key.data(), key.size(), nullptr, 0);
  char hex[65];
  sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
  for (const char* p : kPublic)
    if (std::strcmp(hex, p) == 0) return true;
  return false;
}

}  // namespace

bool constant_time_equal(const std::string& a, const std::string& b) {
  init_sodium();
  return a.size() == b.size() && (a.empty() || sodium_memcmp(a.data(), b.data(), a.size()) == 0);
}

JobSecret JobSecret::generate() {
  init_sodium();
  JobSecret s;
  crypto_kdf_keygen(s.key_.data());
  return s;
}

Result<JobSecret> JobSecret::parse(const std::string& text_in, bool* weak) {
  init_sodium();
  std::string text = text_in;
  while (!text.empty() && (text.back() == '\r' || text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return invalid_argument("the job secret is empty");
  JobSecret s;
  size_t used = 0;
  if (text.size() == 2 * kBytes &&
      sodium_hex2bin(s.key_.data(), kBytes, text.data(), text.size(), nullptr, &used, nullptr) == 0 && used == kBytes) {
    if (is_public(s.key_))
      return invalid_argument(
          "this job secret is public: it was committed to longhaul's repository as launch_metrics.key; delete that "
          "file (a coordinator or launch without --key-file then makes a new one) or make one with `longhaul keygen`");
    if (weak) *weak = false;
    return s;
  }
  // Text (an old --token): Argon2id, so that a guess costs what kTokenOps and kTokenMemory say, offline too (a
  // captured CURVE hello lets anyone test guesses). Every member must derive the same key with nothing exchanged,
  // so the salt is longhaul's own, not the job's: it rules out tables made for other programs, not for longhaul.
  static constexpr char kSalt[crypto_pwhash_SALTBYTES + 1] = "longhaul-token01";
  if (crypto_pwhash(s.key_.data(), kBytes, text.data(), text.size(), reinterpret_cast<const uint8_t*>(kSalt),
                    kTokenOps, kTokenMemory, crypto_pwhash_ALG_ARGON2ID13) != 0)
    return internal_error("deriving the job secret from its text: out of memory (Argon2id needs " +
                          std::to_string(kTokenMemory >> 20) + " MiB)");
  if (weak) *weak = true;
  return s;
}

Result<JobSecret> JobSecret::load(const std::string& path, const std::string& flag, bool* weak) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return invalid_argument(flag + " '" + path + "': cannot open it (" + std::strerror(errno) + ")");
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 077) && st.st_size <= kMaxKeyFileBytes) {
    text.resize(size_t(st.st_size));
    const ssize_t n = text.empty() ? 0 : ::read(fd, text.data(), text.size());
    text.resize(n > 0 ? size_t(n) : 0);
  }
  ::close(fd);
  if (!S_ISREG(st.st_mode)) return invalid_argument(flag + " '" + path + "': not a regular file");
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", unsigned(st.st_mode & 0777));
    return invalid_argument(flag + " '" + path + "': other users of this machine can read or change the job secret (mode " +
                            mode + "); chmod 600 '" + path +
                            "' (a Kubernetes Secret mounted with defaultMode: 0400 is accepted)");
  }
  if (st.st_size > kMaxKeyFileBytes)
    return invalid_argument(flag + " '" + path + "': " + std::to_string(st.st_size) +
                            " bytes; a key file is one line of 64 hex digits");
  const std::string line = text.substr(0, text.find('\n'));
  if (line.find_first_not_of(" \r") == std::string::npos) return invalid_argument(flag + " '" + path + "': it is empty");
  auto s = parse(line, weak);
  if (!s.ok()) return Status(s.status()).prepend(flag + " '" + path + "'");
  return s;
}

Status JobSecret::save_new(const std::string& path) const {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return errno == EEXIST ? invalid_argument("'" + path + "' exists; a job secret is never overwritten")
                           : io_error("cannot create '" + path + "': " + std::strerror(errno));
  const std::string text = to_hex() + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return io_error("cannot write '" + path + "'");
  return Status::Ok();
}

std::string JobSecret::to_hex() const {
  char hex[2 * kBytes + 1];
  sodium_bin2hex(hex, sizeof(hex), key_.data(), kBytes);
  return hex;
}

ZmqLoop::Curve JobSecret::server_curve() const {
  ZmqLoop::Curve server = keypair(key_, kServerCurve);
  server.server = true;
  server.server_key = server.public_key;
  server.client_key = keypair(key_, kClientCurve).public_key;
  return server;
}

ZmqLoop::Curve JobSecret::client_curve() const {
  ZmqLoop::Curve client = keypair(key_, kClientCurve);
  client.server_key = keypair(key_, kServerCurve).public_key;
  client.client_key = client.public_key;
  return client;
}

std::string JobSecret::join_proof() const {
  init_sodium();
  uint8_t proof[32];
  crypto_kdf_derive_from_key(proof, sizeof(proof), kJoinProof, kKdfContext, key_.data());
  char hex[65];
  sodium_bin2hex(hex, sizeof(hex), proof, sizeof(proof));
  return hex;
}

std::string JobSecret::store_entry_key() const {
  init_sodium();
  std::string key(32, '\0');
  crypto_kdf_derive_from_key(reinterpret_cast<uint8_t*>(key.data()), key.size(), kStoreEntry, kKdfContext, key_.data());
  return key;
}

std::string JobSecret::relay_rank_key() const {
  init_sodium();
  std::string key(32, '\0');
  crypto_kdf_derive_from_key(reinterpret_cast<uint8_t*>(key.data()), key.size(), kRelayRanks, kKdfContext,
                             key_.data());
  return key;
}

std::string JobSecret::page_token() const {
  init_sodium();
  uint8_t token[24];
  crypto_kdf_derive_from_key(token, sizeof(token), kPageToken, kKdfContext, key_.data());
  char hex[2 * sizeof(token) + 1];
  sodium_bin2hex(hex, sizeof(hex), token, sizeof(token));
  return hex;
}

}  // namespace lh
