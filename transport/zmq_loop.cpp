// ZmqLoop: a socket-owning thread polling the socket and a wake eventfd. Used by Coordinator and ControlClient.
#include "transport/zmq_loop.h"

#include <sodium.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "core/log.h"

namespace lh {

Result<TcpEndpoint> parse_tcp_endpoint(const std::string& text, bool any_port) {
  const Status bad =
      invalid_argument(any_port ? "expected tcp://HOST:PORT (PORT may be '*')" : "expected tcp://HOST:PORT");
  const size_t colon = text.rfind(':');
  if (text.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon <= 6) return bad;
  TcpEndpoint e;
  e.host = text.substr(6, colon - 6);
  const std::string port = text.substr(colon + 1);
  if (port == "*" && any_port) return e;
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return bad;
  e.port = std::stoi(port);
  if (e.port < 1 || e.port > 65535) return bad;
  return e;
}

Result<std::unique_ptr<ZmqLoop>> ZmqLoop::start(const Options& options, MessageHandler on_message,
                                                TickHandler on_tick) {
  std::unique_ptr<ZmqLoop> l(new ZmqLoop());
  l->on_message_ = std::move(on_message);
  l->on_tick_ = std::move(on_tick);
  LH_RETURN_IF_ERROR(l->init(options));
  return l;
}

Status ZmqLoop::init(const Options& options) {
  options_ = options;
  ctx_ = zmq_ctx_new();
  if (!ctx_) return unavailable("zmq_ctx_new failed");
  sock_ = zmq_socket(ctx_, options.socket_type);
  if (!sock_) LH_CHECK_CODE(zmq_call(-1));
  int linger = 1000;
  LH_CHECK_CODE(zmq_call(zmq_setsockopt(sock_, ZMQ_LINGER, &linger, sizeof(linger))));
  if (options.max_message_bytes > 0)
    LH_CHECK_CODE(zmq_call(zmq_setsockopt(sock_, ZMQ_MAXMSGSIZE, &options.max_message_bytes, sizeof(int64_t))));
  if (options.socket_type == ZMQ_ROUTER) {
    int mandatory = 1;  // a send to an unknown identity fails (and is logged) instead of vanishing
    LH_CHECK_CODE(zmq_call(zmq_setsockopt(sock_, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory))));
    int handover = 1;  // a worker whose connection was reset comes back under its id before the old one is gone
    LH_CHECK_CODE(zmq_call(zmq_setsockopt(sock_, ZMQ_ROUTER_HANDOVER, &handover, sizeof(handover))));
  }
  if (options.curve) LH_RETURN_IF_ERROR(init_curve());
  if (!options.routing_id.empty())
    LH_CHECK_CODE(
        zmq_call(zmq_setsockopt(sock_, ZMQ_ROUTING_ID, options.routing_id.data(), options.routing_id.size())));
  if (options.bind) {
    ZmqCall c = zmq_call(zmq_bind(sock_, options.endpoint.c_str()));
    if (c.rc == -1 && c.err == EADDRINUSE && options.bind_retry.count() > 0) {
      LH_LOG_WARN("'{}' is in use; trying again for up to {:g} s", options.endpoint,
                  double(options.bind_retry.count()) / 1000);
      const auto give_up = std::chrono::steady_clock::now() + options.bind_retry;
      while (c.rc == -1 && c.err == EADDRINUSE && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        c = zmq_call(zmq_bind(sock_, options.endpoint.c_str()));
      }
    }
    if (c.rc == -1) return unavailable("cannot listen on '" + options.endpoint + "': " + zmq_strerror(c.err));
    char buf[256];
    size_t len = sizeof(buf);
    LH_CHECK_CODE(zmq_call(zmq_getsockopt(sock_, ZMQ_LAST_ENDPOINT, buf, &len)));
    endpoint_ = buf;
  } else {
    ZmqCall c = zmq_call(zmq_connect(sock_, options.endpoint.c_str()));
    if (c.rc == -1) return invalid_argument("cannot connect to '" + options.endpoint + "': " + zmq_strerror(c.err));
    endpoint_ = options.endpoint;
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return io_error(std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { run(); });
  return Status::Ok();
}

Status ZmqLoop::init_curve() {
  const Curve& c = *options_.curve;
  auto set = [&](int option, const std::string& z85) {
    return zmq_call(zmq_setsockopt(sock_, option, z85.c_str(), z85.size() + 1));  // Z85 text with its NUL
  };
  if (c.public_key.size() != 40 || c.secret_key.size() != 40 || c.server_key.size() != 40)
    return invalid_argument("control: CURVE keys must be 40 Z85 characters");
  if (c.server) {
    // The ZAP handler (this context's inproc://zeromq.zap.01) must exist before the socket accepts a connection.
    if (c.client_key.size() != 40 || !zmq_z85_decode(client_key_.data(), c.client_key.c_str()))
      return invalid_argument("control: the admitted CURVE client key is not 40 Z85 characters");
    zap_ = zmq_socket(ctx_, ZMQ_REP);
    if (!zap_) LH_CHECK_CODE(zmq_call(-1));
    int linger = 0;
    LH_CHECK_CODE(zmq_call(zmq_setsockopt(zap_, ZMQ_LINGER, &linger, sizeof(linger))));
    LH_CHECK_CODE(zmq_call(zmq_bind(zap_, "inproc://zeromq.zap.01")));
    int one = 1;
    LH_CHECK_CODE(zmq_call(zmq_setsockopt(sock_, ZMQ_CURVE_SERVER, &one, sizeof(one))));
    LH_CHECK_CODE(set(ZMQ_CURVE_SECRETKEY, c.secret_key));
    const std::string domain = "longhaul";
    LH_CHECK_CODE(zmq_call(zmq_setsockopt(sock_, ZMQ_ZAP_DOMAIN, domain.data(), domain.size())));
  } else {
    LH_CHECK_CODE(set(ZMQ_CURVE_SERVERKEY, c.server_key));
    LH_CHECK_CODE(set(ZMQ_CURVE_PUBLICKEY, c.public_key));
    LH_CHECK_CODE(set(ZMQ_CURVE_SECRETKEY, c.secret_key));
  }
  // Failed handshakes (a peer with other keys) show only as monitor events: they are counted and logged.
  char address[64];
  std::snprintf(address, sizeof(address), "inproc://lh-monitor-%p", static_cast<void*>(this));
  LH_CHECK_CODE(zmq_call(zmq_socket_monitor(
      sock_, address,
      ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)));
  monitor_ = zmq_socket(ctx_, ZMQ_PAIR);
  if (!monitor_) LH_CHECK_CODE(zmq_call(-1));
  int linger = 0;
  LH_CHECK_CODE(zmq_call(zmq_setsockopt(monitor_, ZMQ_LINGER, &linger, sizeof(linger))));
  LH_CHECK_CODE(zmq_call(zmq_connect(monitor_, address)));
  return Status::Ok();
}

void ZmqLoop::note_refusal(const std::string& what, const std::string& peer) {
  ++auth_failures_;
  const auto now = std::chrono::steady_clock::now();
  auto it = last_refusal_log_.find(peer);
  if (it != last_refusal_log_.end() && now - it->second < std::chrono::minutes(1)) {
    ++refusals_unlogged_[peer];
    return;
  }
  const uint64_t more = refusals_unlogged_[peer];
  refusals_unlogged_[peer] = 0;
  last_refusal_log_[peer] = now;
  if (last_refusal_log_.size() > 4096) {  // bounded: a scan of many addresses
    last_refusal_log_.clear();
    refusals_unlogged_.clear();  // it grew with the other map, and was never pruned
  }
  LH_LOG_WARN("control: {}{}", what,
              more > 0 ? " (and " + std::to_string(more) + " more like it in the last minute)" : std::string());
}

bool ZmqLoop::serve_zap() {
  Frames req;
  bool more = true;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, zap_, ZMQ_DONTWAIT) == -1) {
      zmq_msg_close(&msg);
      if (req.empty()) return false;
      break;
    }
    auto* p = static_cast<uint8_t*>(zmq_msg_data(&msg));
    req.emplace_back(p, p + zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  // RFC 27: version, request id, domain, address, identity, mechanism, credentials…
  auto text = [&](size_t i) { return i < req.size() ? std::string(req[i].begin(), req[i].end()) : std::string(); };
  const bool admitted = req.size() >= 7 && text(0) == "1.0" && text(5) == "CURVE" && req[6].size() == 32 &&
                        sodium_memcmp(req[6].data(), client_key_.data(), 32) == 0;
  if (!admitted) {
    std::string address;  // printable only: the peer's own bytes never reach the log
    for (char ch : text(3))
      if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ':' || ch == '[' || ch == ']')
        address += ch;
    note_refusal("refused a connection from " + (address.empty() ? std::string("an unknown address") : address) +
                     ": its CURVE key is not this job's (a client without the job secret)",
                 address);
  }
  const std::vector<std::string> reply = {
      "1.0", text(1), admitted ? "200" : "400", admitted ? "OK" : "not a member of this job", "", ""};
  for (size_t i = 0; i < reply.size(); ++i)
    zmq_send(zap_, reply[i].data(), reply[i].size(), i + 1 < reply.size() ? ZMQ_SNDMORE : 0);
  return true;
}

void ZmqLoop::drain_monitor() {
  for (;;) {
    zmq_msg_t event, address;
    zmq_msg_init(&event);
    if (zmq_msg_recv(&event, monitor_, ZMQ_DONTWAIT) == -1) {
      zmq_msg_close(&event);
      return;
    }
    zmq_msg_init(&address);
    zmq_msg_recv(&address, monitor_, 0);  // every event is two frames
    zmq_msg_close(&event);
    zmq_msg_close(&address);
    if (options_.curve->server)
      note_refusal("refused a connection whose CURVE handshake failed (a peer without the job secret)", "handshake");
    else
      note_refusal("the coordinator at " + endpoint_ +
                       " refused this process's CURVE handshake: its job secret differs (check --key-file)",
                   "handshake");
  }
}

ZmqLoop::~ZmqLoop() {
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
    thread_.join();
  }
  if (monitor_) {
    zmq_socket_monitor(sock_, nullptr, 0);
    zmq_close(monitor_);
  }
  if (zap_) zmq_close(zap_);
  if (sock_) zmq_close(sock_);
  if (ctx_) zmq_ctx_term(ctx_);  // waits up to ZMQ_LINGER for queued messages
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ZmqLoop::send(Frames frames) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(std::move(frames));
  }
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;
}

void ZmqLoop::flush_outbox() {
  std::vector<Frames> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(outbox_);
  }
  const bool router = options_.socket_type == ZMQ_ROUTER;
  // A ROUTER's peer whose queue is full (it does not read) keeps its own messages waiting, in order; messages to
  // every other peer go on. Its backlog is bounded: beyond kMaxPeerBacklog the peer is cut off (its messages are
  // dropped), so one peer that never reads can neither stall the others nor grow this process without bound.
  std::vector<Frames> retry;
  std::set<std::string> blocked;
  for (size_t i = 0; i < out.size(); ++i) {
    Frames& f = out[i];
    const std::string peer = router && !f.empty() ? std::string(f[0].begin(), f[0].end()) : std::string();
    if (router && blocked.count(peer)) {
      retry.push_back(std::move(f));
      continue;
    }
    bool failed = false;
    for (size_t k = 0; k < f.size() && !failed; ++k) {
      int flags = ZMQ_DONTWAIT | (k + 1 < f.size() ? ZMQ_SNDMORE : 0);
      if (zmq_send(sock_, f[k].data(), f[k].size(), flags) == -1) {
        int err = zmq_errno();
        if (err == EAGAIN && k == 0) {  // peer not connected yet or queue full: retry later, in order
          if (!router) {
            std::lock_guard<std::mutex> lock(mu_);
            outbox_.insert(outbox_.begin(), std::make_move_iterator(out.begin() + long(i)),
                           std::make_move_iterator(out.end()));
            return;
          }
          blocked.insert(peer);
          retry.push_back(std::move(f));
          failed = true;
          break;
        }
        // EHOSTUNREACH: a ROUTER peer that is gone (e.g. a dead worker not yet declared dead).
        if (err == EHOSTUNREACH)
          LH_LOG_DEBUG("control: dropping a message to a departed peer");
        else
          LH_LOG_WARN("control: dropping an outgoing message: {}", zmq_strerror(err));
        failed = true;
      }
    }
  }
  if (retry.empty()) return;
  std::map<std::string, size_t> backlog;
  for (const Frames& f : retry) ++backlog[std::string(f[0].begin(), f[0].end())];
  std::vector<Frames> kept;
  for (Frames& f : retry) {
    const std::string peer(f[0].begin(), f[0].end());
    if (backlog[peer] > kMaxPeerBacklog) continue;
    kept.push_back(std::move(f));
  }
  for (const auto& [peer, n] : backlog)
    if (n > kMaxPeerBacklog) {
      ++cut_off_;
      LH_LOG_WARN("control: a peer does not read its messages; {} queued for it were dropped", n);
    }
  std::lock_guard<std::mutex> lock(mu_);
  outbox_.insert(outbox_.begin(), std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end()));
}

void ZmqLoop::run() {
  auto next_tick = std::chrono::steady_clock::now() + options_.tick;
  while (!stop_) {
    bool pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending = !outbox_.empty();
    }
    auto now = std::chrono::steady_clock::now();
    long wait_ms = std::max<long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now).count());
    if (pending) wait_ms = std::min<long>(wait_ms, 10);  // an EAGAIN'd send is retried soon
    std::vector<zmq_pollitem_t> items = {{sock_, 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    if (zap_) items.push_back({zap_, 0, ZMQ_POLLIN, 0});
    if (monitor_) items.push_back({monitor_, 0, ZMQ_POLLIN, 0});
    if (zmq_poll(items.data(), int(items.size()), wait_ms) == -1) {
      if (zmq_errno() == EINTR) continue;
      LH_LOG_ERROR("control: zmq_poll: {}", zmq_strerror(zmq_errno()));
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t n = read(wake_fd_, &v, sizeof(v));
      (void)n;
    }
    if (zap_)
      for (int i = 0; i < 1000 && serve_zap(); ++i) {
      }
    if (monitor_) drain_monitor();
    // Drain every complete inbound message.
    for (int budget = 0; budget < 1000; ++budget) {
      Frames frames;
      bool more = true, got = false;
      while (more) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock_, ZMQ_DONTWAIT) == -1) {
          zmq_msg_close(&msg);
          break;
        }
        got = true;
        auto* p = static_cast<uint8_t*>(zmq_msg_data(&msg));
        frames.emplace_back(p, p + zmq_msg_size(&msg));
        more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
      }
      if (!got) break;
      on_message_(std::move(frames));
    }
    if (std::chrono::steady_clock::now() >= next_tick) {
      next_tick = std::chrono::steady_clock::now() + options_.tick;
      if (on_tick_) on_tick_();
    }
    flush_outbox();
  }
  flush_outbox();
}

}  // namespace lh
