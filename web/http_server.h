// defines: lh::HttpServer — a small read-only HTTP endpoint over CivetWeb (Debian's libcivetweb): a fixed pool of
// threads, a bounded queue of accepted connections, a cap on a request's size and on the time it may take to arrive,
// so a slow or hostile client costs a bounded number of threads and descriptors. Routes are exact paths answered
// by callbacks (with an optional cache, so a client polling fast costs the job at most one answer per period).
// Bound anywhere but loopback, every route that asks for it needs "Authorization: Bearer TOKEN". Used by the
// coordinator (`--http`): the live page, /metrics, /api/status.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"

struct mg_connection;  // CivetWeb's (civetweb.h), kept out of this header
struct mg_context;

namespace lh {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpRoute {
  std::function<HttpResponse()> handler;  // called on one of the server's threads
  bool needs_token = true;                // beyond loopback: refused without the token
  double cache_s = 0;                     // > 0: an answer younger than this is served again
};

struct HttpServerOptions {
  // "HOST:PORT" (IPv4; "localhost" is 127.0.0.1) or ":PORT" / "PORT" for 127.0.0.1. Port 0 picks a free one.
  std::string listen;
  // Required when the host is not a loopback address (127.x); then a route with needs_token answers 401 without it.
  std::string token;
  int threads = 4;                // connections served at once
  int queue = 16;                 // accepted connections waiting for a thread (more wait in the kernel's backlog)
  int request_timeout_ms = 3000;  // a request (line and headers) must arrive within this, all of it
  int max_request_bytes = 8192;   // a larger request line and headers are refused
};

// The listen address split and checked: host (dotted IPv4) and port; errors name what is wrong.
struct HttpAddress {
  std::string host;
  int port = 0;
  bool loopback() const;
};
Result<HttpAddress> parse_http_address(const std::string& listen);

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options,
                                                   std::map<std::string, HttpRoute> routes);
  ~HttpServer();
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  bool needs_token() const { return needs_token_; }
  // "http://HOST:PORT/" (a wildcard host prints as 127.0.0.1).
  std::string url() const;
  // Requests answered 401 (no or a wrong token), 404 (no such path), and refused as malformed or too large.
  uint64_t unauthorized() const { return unauthorized_; }
  uint64_t not_found() const { return not_found_; }
  uint64_t served() const { return served_; }

  // Internal: CivetWeb's request callback.
  int handle(::mg_connection* conn);

 private:
  HttpServer() = default;
  Status listen_on(const std::string& host, int port, const HttpServerOptions& options);
  struct Cached {
    std::mutex mu;
    double at = -1;
    HttpResponse response;
  };
  ::mg_context* ctx_ = nullptr;
  std::map<std::string, HttpRoute> routes_;
  std::map<std::string, std::unique_ptr<Cached>> cache_;
  std::string token_, host_;
  int port_ = 0;
  bool needs_token_ = false;
  std::atomic<uint64_t> unauthorized_{0}, not_found_{0}, served_{0};
};

// A TCP port free on `host` just now (bound to port 0 and closed).
Result<int> free_tcp_port(const std::string& host);

// Equal in constant time for strings of equal length (a token comparison).
bool http_token_equal(const std::string& a, const std::string& b);

}  // namespace lh
