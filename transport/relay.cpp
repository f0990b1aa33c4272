// Relay: the job's packet forwarder for pairs that cannot connect directly (see relay.h).
#include "transport/relay.h"

#include <sodium.h>

#include <cstring>

#include "core/log.h"

namespace lh {

std::vector<uint8_t> relay_u32(uint32_t v) {
  std::vector<uint8_t> b(4);
  for (int i = 0; i < 4; ++i) b[size_t(i)] = uint8_t(v >> (8 * i));
  return b;
}
std::vector<uint8_t> relay_u64(uint64_t v) {
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(v >> (8 * i));
  return b;
}
std::optional<uint32_t> relay_read_u32(const std::vector<uint8_t>& f) {
  if (f.size() != 4) return std::nullopt;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(f[size_t(i)]) << (8 * i);
  return v;
}
std::optional<uint64_t> relay_read_u64(const std::vector<uint8_t>& f) {
  if (f.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(f[size_t(i)]) << (8 * i);
  return v;
}
bool relay_frame_is(const std::vector<uint8_t>& f, const char* word) {
  const size_t n = std::strlen(word);
  return f.size() == n && std::memcmp(f.data(), word, n) == 0;
}

Status check_relay_rank_key(const std::string& rank_key) {
  if (!rank_key.empty() && rank_key.size() != kRelayRankKeyBytes)
    return invalid_argument("the relay's rank key has " + std::to_string(rank_key.size()) + " bytes, not " +
                            std::to_string(kRelayRankKeyBytes));
  return Status::Ok();
}

std::string relay_rank_token(const std::string& rank_key, int rank) {
  static constexpr char kContext[] = "longhaul relay rank v1";
  std::vector<uint8_t> in(kContext, kContext + sizeof(kContext));
  const std::vector<uint8_t> r = relay_u32(uint32_t(rank));
  in.insert(in.end(), r.begin(), r.end());
  uint8_t out[32];
  crypto_generichash(out, sizeof(out), in.data(), in.size(), reinterpret_cast<const uint8_t*>(rank_key.data()),
                     rank_key.size());
  char hex[65];
  sodium_bin2hex(hex, sizeof(hex), out, sizeof(out));
  return hex;
}

namespace {
std::vector<uint8_t> text(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
}  // namespace

Result<std::unique_ptr<Relay>> Relay::start(const RelayOptions& options) {
  LH_RETURN_IF_ERROR(check_relay_rank_key(options.rank_key));
  if (sodium_init() < 0) return internal_error("libsodium cannot start");
  std::unique_ptr<Relay> r(new Relay());
  r->options_ = options;
  ZmqLoop::Options lo;
  lo.socket_type = ZMQ_ROUTER;
  lo.endpoint = options.listen;
  lo.bind = true;
  lo.max_message_bytes = int64_t(options.max_message_bytes + 64);
  lo.bind_retry = std::chrono::seconds(15);
  lo.curve = options.curve;
  Relay* self = r.get();
  auto loop = ZmqLoop::start(lo, [self](Frames&& f) { self->on_message(std::move(f)); }, [] {});
  if (!loop.ok()) return Status(loop.status()).prepend("the relay");
  r->loop_ = std::move(loop).value();
  LH_LOG_INFO("relay listening on {}", r->endpoint());
  return r;
}

Relay::~Relay() {
  loop_.reset();
}

uint16_t Relay::port() const {
  auto ep = parse_tcp_endpoint(endpoint());  // ZeroMQ's own bound address
  return ep.ok() ? uint16_t(ep->port) : 0;
}

std::map<std::pair<int, int>, Relay::PairCount> Relay::forwarded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return forwarded_;
}
uint64_t Relay::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}
int Relay::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(identity_of_.size());
}

void Relay::drop(const std::string& why) {
  // mu_ held. The first few drops are logged one by one, then one line a second.
  ++dropped_;
  const auto now = std::chrono::steady_clock::now();
  if (drops_logged_ >= 10 && now < next_drop_log_) return;
  ++drops_logged_;
  next_drop_log_ = now + std::chrono::seconds(1);
  LH_LOG_WARN("relay: dropping a message: {} ({} dropped so far)", why, dropped_);
}

void Relay::on_message(Frames&& f) {
  // f[0]: the connection's identity (ROUTER).
  if (f.size() < 2) return;
  const std::string identity(f[0].begin(), f[0].end());
  std::lock_guard<std::mutex> lock(mu_);
  if (relay_frame_is(f[1], kRelayHello)) {
    auto rank = f.size() == 4 ? relay_read_u32(f[2]) : std::nullopt;
    std::string refused;
    if (!rank || *rank > 4095) {
      refused = "a hello needs a rank in [0, 4095] and a token";
    } else {
      const std::string want = options_.rank_key.empty() ? options_.token : relay_rank_token(options_.rank_key, int(*rank));
      if (!want.empty() && (f[3].size() != want.size() || sodium_memcmp(f[3].data(), want.data(), want.size()) != 0))
        refused = options_.rank_key.empty() ? "wrong token"
                                            : "wrong token for rank " + std::to_string(*rank) +
                                                  " (each rank's is in its plan: a hello binds only its own rank)";
    }
    if (!refused.empty()) {
      drop("a hello refused: " + refused);
      loop_->send({f[0], text(kRelayRefused), text(refused)});
      return;
    }
    const int r = int(rank.value_or(0));
    auto old = identity_of_.find(r);
    if (old != identity_of_.end() && old->second != identity) {
      rank_of_.erase(old->second);
      LH_LOG_INFO("relay: rank {} connected again (a new connection replaces its old one)", r);
    } else {
      LH_LOG_INFO("relay: rank {} connected", r);
    }
    auto prev = rank_of_.find(identity);
    if (prev != rank_of_.end() && prev->second != r) identity_of_.erase(prev->second);
    rank_of_[identity] = r;
    identity_of_[r] = identity;
    loop_->send({f[0], text(kRelayWelcome)});
    return;
  }
  if (!relay_frame_is(f[1], kRelayData) && !relay_frame_is(f[1], kRelayFragment))
    return drop("an unknown message kind");
  auto src = rank_of_.find(identity);
  if (src == rank_of_.end()) return drop("data from a connection that sent no hello");
  auto dst_rank = f.size() == 5 ? relay_read_u32(f[2]) : std::nullopt;
  auto tag = f.size() == 5 ? relay_read_u64(f[3]) : std::nullopt;
  if (!dst_rank || !tag) return drop("data from rank " + std::to_string(src->second) + " with bad frames");
  auto dst = identity_of_.find(int(*dst_rank));
  if (dst == identity_of_.end())
    return drop("data from rank " + std::to_string(src->second) + " to rank " + std::to_string(*dst_rank) +
                ", which is not connected to the relay");
  PairCount& c = forwarded_[{src->second, int(*dst_rank)}];
  c.packets += relay_frame_is(f[1], kRelayData) ? 1 : 0;  // a packet's parts count once
  c.bytes += f[4].size();
  loop_->send({std::vector<uint8_t>(dst->second.begin(), dst->second.end()), std::move(f[1]),
               relay_u32(uint32_t(src->second)), std::move(f[3]), std::move(f[4])});
}

}  // namespace lh
