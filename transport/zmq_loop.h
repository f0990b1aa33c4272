// defines: lh::ZmqLoop, one ZeroMQ socket served by its own thread (receive handler, periodic tick, a
// thread-safe outbox woken through an eventfd), and ErrorDomain<ZmqCall> for LH_CHECK_CODE on libzmq calls.
// Used by Coordinator (ROUTER) and ControlClient (DEALER).
#pragma once

#include <zmq.h>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace lh {

// The result of a libzmq C call (-1 on failure, errno in zmq_errno()).
struct ZmqCall {
  int rc;
  int err;
};
inline ZmqCall zmq_call(int rc) {
  return {rc, rc == -1 ? zmq_errno() : 0};
}

template <>
struct ErrorDomain<ZmqCall> {
  static bool ok(ZmqCall c) { return c.rc != -1; }
  static const char* name() { return "ZeroMQ"; }
  static std::string describe(ZmqCall c) { return zmq_strerror(c.err); }
  static StatusCode status_code(ZmqCall) { return StatusCode::kUnavailable; }
};

using Frames = std::vector<std::vector<uint8_t>>;

// A "tcp://HOST:PORT" address split in two. port 0: '*' (any free port, for a bind).
struct TcpEndpoint {
  std::string host;
  int port = 0;
  // The same host with another port (0: '*').
  std::string with_port(int p) const { return "tcp://" + host + ":" + (p > 0 ? std::to_string(p) : "*"); }
};
// `text` as tcp://HOST:PORT, PORT in 1..65535 (or '*' when `any_port`), else InvalidArgument "expected
// tcp://HOST:PORT" (callers name the flag or option).
Result<TcpEndpoint> parse_tcp_endpoint(const std::string& text, bool any_port = false);

class ZmqLoop {
 public:
  struct Options {
    int socket_type = ZMQ_DEALER;
    std::string endpoint;  // bind ("tcp://127.0.0.1:*" picks a free port) or connect address
    bool bind = false;
    // A bind that finds the address in use tries again every 100 ms for this long before it fails. A coordinator
    // restarted on its old port can find it briefly held: by the old process's last sockets, or by one of its own
    // workers, whose reconnection to a loopback port in the ephemeral range can connect to itself.
    std::chrono::milliseconds bind_retry{0};
    std::chrono::milliseconds tick{100};
    int64_t max_message_bytes = -1;  // ZMQ_MAXMSGSIZE: larger inbound messages drop the connection
    // DEALER: the routing id the ROUTER knows this socket by, kept across reconnections (empty: ZeroMQ picks one
    // per connection). A ROUTER takes over an id from a connection it still holds (ZMQ_ROUTER_HANDOVER).
    std::string routing_id;
    // ZeroMQ CURVE (encrypted and authenticated, libsodium inside libzmq): see Curve. Unset: plain ZMTP.
    struct Curve {
      std::string public_key, secret_key;  // this socket's key pair (Z85, 40 characters each)
      std::string server_key;              // the server's public key (a client connects to it)
      bool server = false;
      // A server's ZAP handler admits only clients with this public key (compared in constant time).
      std::string client_key;
    };
    std::optional<Curve> curve;
  };
  using Curve = Options::Curve;
  // Both run on the loop thread; they may call send().
  using MessageHandler = std::function<void(Frames&&)>;
  using TickHandler = std::function<void()>;

  static Result<std::unique_ptr<ZmqLoop>> start(const Options& options, MessageHandler on_message, TickHandler on_tick);
  ~ZmqLoop();  // stops the thread, flushes what is queued for up to the linger time

  // The bound endpoint with the real port ("tcp://127.0.0.1:40123"), or the connect address.
  const std::string& endpoint() const { return endpoint_; }
  // Queues a multipart message; thread-safe. On ROUTER the first frame is the peer identity.
  void send(Frames frames);
  // ROUTER: messages one peer may have waiting behind its full queue before it is cut off (they are dropped).
  static constexpr size_t kMaxPeerBacklog = 4096;
  // Peers cut off so far (loop thread; for tests and status).
  uint64_t cut_off() const { return cut_off_; }
  // With CURVE: connections refused so far — handshakes that failed (a peer without the job's keys) and clients
  // the ZAP handler turned away.
  uint64_t auth_failures() const { return auth_failures_; }

 private:
  ZmqLoop() = default;
  Status init(const Options& options);
  void run();
  void flush_outbox();
  Status init_curve();
  bool serve_zap();      // one ZAP request (server); false when none waits
  void drain_monitor();  // handshake failures seen by the socket monitor
  void note_refusal(const std::string& what, const std::string& peer);

  Options options_;
  void* ctx_ = nullptr;
  void* sock_ = nullptr;
  int wake_fd_ = -1;
  std::string endpoint_;
  MessageHandler on_message_;
  TickHandler on_tick_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Frames> outbox_;
  std::atomic<uint64_t> cut_off_{0};
  void* zap_ = nullptr;      // ZAP handler (CURVE server)
  void* monitor_ = nullptr;  // PAIR socket reading the main socket's handshake events (CURVE)
  std::array<uint8_t, 32> client_key_{};
  std::atomic<uint64_t> auth_failures_{0};
  // Refusals logged at most once a minute per peer (ZAP) or per kind (handshake failures, whose peer is unknown).
  std::map<std::string, std::chrono::steady_clock::time_point> last_refusal_log_;
  std::map<std::string, uint64_t> refusals_unlogged_;
};

}  // namespace lh
