// ZmqLoop: a socket-owning thread polling the socket and a wake eventfd. Used by Coordinator and ControlClient.
#include "transport/zmq_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <set>

#include "core/log.h"

namespace lh {

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
  if (!options.routing_id.empty())
    LH_CHECK_CODE(
        zmq_call(zmq_setsockopt(sock_, ZMQ_ROUTING_ID, options.routing_id.data(), options.routing_id.size())));
  if (options.bind) {
    ZmqCall c = zmq_call(zmq_bind(sock_, options.endpoint.c_str()));
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

ZmqLoop::~ZmqLoop() {
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
    thread_.join();
  }
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
    zmq_pollitem_t items[2] = {{sock_, 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, wait_ms) == -1) {
      if (zmq_errno() == EINTR) continue;
      LH_LOG_ERROR("control: zmq_poll: {}", zmq_strerror(zmq_errno()));
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t n = read(wake_fd_, &v, sizeof(v));
      (void)n;
    }
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
