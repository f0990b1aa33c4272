// JobSecret: key files, and the control plane's keys derived from a job's secret (libsodium). Used by the app layer.
#include "transport/job_secret.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace lh {
namespace {

constexpr char kKdfContext[crypto_kdf_CONTEXTBYTES + 1] = "lhctrl01";
enum Subkey : uint64_t { kServerCurve = 1, kClientCurve = 2, kJoinProof = 3 };

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
    if (weak) *weak = false;
    return s;
  }
  crypto_generichash(s.key_.data(), kBytes, reinterpret_cast<const uint8_t*>(text.data()), text.size(), nullptr, 0);
  if (weak) *weak = true;
  return s;
}

Result<JobSecret> JobSecret::load(const std::string& path, const std::string& flag, bool* weak) {
  std::ifstream in(path);
  std::string line;
  if (!in) return invalid_argument(flag + " '" + path + "': cannot open it (" + std::strerror(errno) + ")");
  if (!std::getline(in, line)) return invalid_argument(flag + " '" + path + "': it is empty");
  auto s = parse(line, weak);
  if (!s.ok()) return invalid_argument(flag + " '" + path + "': the first line is empty");
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

}  // namespace lh
