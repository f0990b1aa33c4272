// HttpServer over CivetWeb: options, the one request callback (exact routes, the token, the cache), and shutdown.
#include "web/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/log.h"

namespace lh {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

void send(struct mg_connection* conn, const HttpResponse& r, bool head) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\nConnection: close\r\n\r\n",
            r.status, reason_phrase(r.status), r.content_type.c_str(), r.body.size());
  if (!head && !r.body.empty()) mg_write(conn, r.body.data(), r.body.size());
}

int begin_request(struct mg_connection* conn) {
  const struct mg_request_info* info = mg_get_request_info(conn);
  auto* server = static_cast<HttpServer*>(info ? info->user_data : nullptr);
  return server ? server->handle(conn) : 0;
}

// CivetWeb's own complaints (a request too large, a timeout) go to our log at debug level: a hostile client must
// not be able to fill the coordinator's log.
int log_message(const struct mg_connection*, const char* message) {
  LH_LOG_DEBUG("http: {}", message ? message : "");
  return 1;
}

// A Host header naming this machine's loopback: 127.x.x.x or localhost, with or without a port.
bool loopback_host(const char* header) {
  if (!header) return false;
  std::string host(header);
  if (const size_t colon = host.rfind(':'); colon != std::string::npos) host.resize(colon);
  return host == "localhost" || HttpAddress{host, 0}.loopback();
}

}  // namespace
}  // namespace lh

// Debian's CivetWeb asks for 100 KiB thread stacks (its CIVETWEB_THREAD_STACK_SIZE). glibc puts a process's static
// TLS on every thread's stack, and this one's (OpenBLAS, cuBLASLt: about 180 KiB) does not fit: pthread_create fails
// with EINVAL and no page is served. This definition, in the executable, comes before libc's for CivetWeb's calls and
// raises a request below 1 MiB to 1 MiB (virtual memory, touched only as used); larger requests pass unchanged.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (!next) return ENOSYS;
  constexpr size_t kFloor = size_t(1) << 20;
  return next(attr, size < kFloor ? kFloor : size);
}

namespace lh {

bool HttpAddress::loopback() const {
  return host.rfind("127.", 0) == 0;
}

Result<HttpAddress> parse_http_address(const std::string& listen) {
  HttpAddress a;
  std::string host, port;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    port = listen;
  } else {
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (host.find(':') != std::string::npos || (!host.empty() && host.front() == '['))
    return invalid_argument("--http '" + listen +
                            "': IPv6 is not supported; give an IPv4 address, e.g. 127.0.0.1:8080");
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) != 1)
    return invalid_argument("--http '" + listen + "': '" + host +
                            "' is not an IPv4 address (write 127.0.0.1:8080, or 0.0.0.0:8080 for every interface)");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    return invalid_argument("--http '" + listen + "': the port '" + port + "' is not a number in 0..65535");
  a.host = host;
  a.port = std::stoi(port);
  return a;
}

Result<int> free_tcp_port(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return unavailable(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return unavailable("cannot bind " + host + ": " + std::strerror(err));
  return int(ntohs(a.sin_port));
}

bool http_token_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options,
                                                      std::map<std::string, HttpRoute> routes) {
  LH_ASSIGN_OR_RETURN(HttpAddress addr, parse_http_address(options.listen));
  if (!addr.loopback() && options.token.empty())
    return invalid_argument("--http " + options.listen +
                            ": an address beyond loopback needs the job's page token (none was given)");
  if (options.threads < 1 || options.queue < 1 || options.request_timeout_ms < 1 || options.max_request_bytes < 1024)
    return invalid_argument(
        "http server: threads, queue and the request timeout must be positive, and requests may "
        "be no smaller than 1024 bytes");
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->routes_ = std::move(routes);
  for (const auto& [path, route] : s->routes_)
    if (route.cache_s > 0) s->cache_[path] = std::make_unique<Cached>();
  s->token_ = options.token;
  s->host_ = addr.host;
  s->needs_token_ = !addr.loopback();
  static std::once_flag init;
  std::call_once(init, [] { mg_init_library(0); });
  // CivetWeb cannot listen on port 0: a free port is found here (bound and let go; another taker in between makes
  // mg_start fail, and it is tried again with the next one).
  for (int attempt = 0;; ++attempt) {
    int port = addr.port;
    if (port == 0) {
      auto free = free_tcp_port(addr.host);
      if (!free.ok()) return free.status();
      port = *free;
    }
    Status st = s->listen_on(addr.host, port, options);
    if (st.ok()) break;
    if (addr.port != 0 || attempt >= 4) return st.prepend("--http " + options.listen);
  }
  return s;
}

Status HttpServer::listen_on(const std::string& host, int port, const HttpServerOptions& options) {
  const std::string ports = host + ":" + std::to_string(port);
  const std::string threads = std::to_string(options.threads), queue = std::to_string(options.queue),
                    timeout = std::to_string(options.request_timeout_ms),
                    max_request = std::to_string(options.max_request_bytes), backlog = std::to_string(64);
  const char* opts[] = {"listening_ports",
                        ports.c_str(),
                        "num_threads",
                        threads.c_str(),
                        "connection_queue",
                        queue.c_str(),
                        "listen_backlog",
                        backlog.c_str(),
                        "request_timeout_ms",
                        timeout.c_str(),
                        "max_request_size",
                        max_request.c_str(),
                        "enable_keep_alive",
                        "no",
                        "linger_timeout_ms",
                        "0",
                        "access_control_allow_origin",
                        "",  // no CORS: another site's script must not read the job
                        "enable_directory_listing",
                        "no",
                        nullptr};
  struct mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.begin_request = begin_request;
  callbacks.log_message = log_message;
  struct mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.user_data = this;
  init.configuration_options = opts;
  char why[256] = {0};
  struct mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.text = why;
  error.text_buffer_size = sizeof(why);
  ctx_ = mg_start2(&init, &error);
  if (!ctx_)
    return unavailable("cannot listen on " + ports + ": " +
                       (why[0] ? std::string(why) : std::string("CivetWeb refused")));
  struct mg_server_port bound[4];
  const int n = mg_get_server_ports(ctx_, 4, bound);
  if (n < 1) return internal_error("listening, but the port is unknown");
  port_ = bound[0].port;
  return Status::Ok();
}

HttpServer::~HttpServer() {
  if (ctx_) mg_stop(ctx_);  // joins the server's threads
}

std::string HttpServer::url() const {
  return "http://" + (host_ == "0.0.0.0" ? std::string("127.0.0.1") : host_) + ":" + std::to_string(port_) + "/";
}

int HttpServer::handle(struct mg_connection* conn) {
  const struct mg_request_info* info = mg_get_request_info(conn);
  const std::string method = info->request_method ? info->request_method : "";
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    send(conn, {405, "text/plain; charset=utf-8", "the page and its data are read-only: GET only\n"}, false);
    return 405;
  }
  const std::string path = info->local_uri ? info->local_uri : "";
  auto it = routes_.find(path);
  if (it == routes_.end()) {
    ++not_found_;
    send(conn, {404, "text/plain; charset=utf-8", "no such page: try / or /metrics or /api/status\n"}, head);
    return 404;
  }
  const HttpRoute& route = it->second;
  if (!needs_token_ && !loopback_host(mg_get_header(conn, "Host"))) {
    // A page of another site whose name was made to point at 127.0.0.1 (DNS rebinding) would read the job from the
    // user's browser: on loopback the request must name a loopback host.
    ++unauthorized_;
    send(conn, {403, "text/plain; charset=utf-8", "this endpoint answers requests for 127.0.0.1 or localhost only\n"},
         head);
    return 403;
  }
  if (route.needs_token && needs_token_) {
    const char* auth = mg_get_header(conn, "Authorization");
    const std::string want = "Bearer " + token_;
    if (!auth || !http_token_equal(auth, want)) {
      ++unauthorized_;
      send(conn,
           {401, "text/plain; charset=utf-8",
            "this address needs the job's page token as 'Authorization: Bearer TOKEN' (`longhaul ctl page-url` "
            "prints it)\n"},
           head);
      return 401;
    }
  }
  HttpResponse r;
  try {
    if (route.cache_s > 0) {
      Cached& c = *cache_.at(path);
      std::lock_guard<std::mutex> lock(c.mu);  // one answer per period, however many clients ask
      const double t = now_s();
      if (c.at < 0 || t - c.at >= route.cache_s) {
        c.response = route.handler();
        c.at = t;
      }
      r = c.response;
    } else {
      r = route.handler();
    }
  } catch (const std::exception& e) {
    r = {500, "text/plain; charset=utf-8", std::string("error: ") + e.what() + "\n"};
  }
  ++served_;
  send(conn, r, head);
  return r.status;
}

}  // namespace lh
