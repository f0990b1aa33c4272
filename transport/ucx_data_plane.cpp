// UcxDataPlane: UCX active messages, each under a wire header (packet_auth.h) that is checked — its MAC, its sender's
// plan, its epoch, its sequence number — before the packet's bytes are received or anything is held for them; our own
// matching by (peer, tag); a progress thread that sleeps on epoll(UCX event fd + wake eventfd) when idle; drop-and-log
// for ranks outside the plan; bounds on what a peer can make it buffer; a listener that keeps few unproven
// connections. Used by workers, `bench link` and tests.
// This file: setup (init, listener), the progress thread, teardown; the rest of the class is in ucx_connect.cpp,
// ucx_tag_matching.cpp, ucx_fault_injection.cpp and ucx_relay.cpp.
#include "transport/ucx_data_plane.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <tuple>

#include "core/log.h"
#include "core/tensor.h"
#include "transport/relay.h"
#include "transport/ucx_data_plane_internal.h"

namespace lh {
using namespace ucx_internal;

std::string interface_addresses(const std::string& net_devices) {
  std::set<std::string> named;
  for (size_t i = 0; i <= net_devices.size();) {
    size_t j = net_devices.find(',', i);
    if (j == std::string::npos) j = net_devices.size();
    std::string d = net_devices.substr(i, j - i);
    if (!d.empty()) named.insert(d.substr(0, d.find(':')));  // "mlx5_0:1" names a port
    i = j + 1;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::vector<std::string> out, loopback;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP)) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (!named.empty() && !named.count(a->ifa_name)) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* raw = family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    if (!inet_ntop(family, raw, buf, sizeof(buf))) continue;
    ((a->ifa_flags & IFF_LOOPBACK) && named.empty() ? loopback : out).push_back(buf);
  }
  freeifaddrs(list);
  if (out.empty()) out = loopback;
  std::string s;
  for (const std::string& a : out) s += (s.empty() ? "" : ", ") + a;
  return s.size() > 1000 ? s.substr(0, 1000) + "…" : s;
}

Result<std::pair<int, int>> parse_port_range(const std::string& text) {
  const size_t dash = text.find('-');
  auto port = [](const std::string& s) -> int {
    if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(s);
  };
  const int lo = dash == std::string::npos ? -1 : port(text.substr(0, dash));
  const int hi = dash == std::string::npos ? -1 : port(text.substr(dash + 1));
  if (lo < 1 || hi < 1 || lo > 65535 || hi > 65535)
    return invalid_argument("expected LO-HI, two TCP ports in [1, 65535] (e.g. 40000-40015)");
  if (lo > hi) return invalid_argument("the range is empty: " + std::to_string(lo) + " > " + std::to_string(hi));
  return std::make_pair(lo, hi);
}

Result<std::unique_ptr<UcxDataPlane>> UcxDataPlane::create(const UcxOptions& options) {
  std::unique_ptr<UcxDataPlane> p(new UcxDataPlane());
  LH_RETURN_IF_ERROR(p->init(options));
  return p;
}

namespace {

// UCX reads its tcp transport's settings from the environment only, when the worker opens its interfaces
// (ucp_config_modify does not reach them): set while this lives (until the worker exists), then put back, under a lock
// so planes made at once do not mix them. The port range (data_ports); and non-blocking connects unless the user
// chose: a blocking one to a peer behind NAT would hold ucp_ep_create for the kernel's SYN retries (minutes), where the
// pre-flight's connect timeout should decide.
class UcxTcpEnvironment {
 public:
  explicit UcxTcpEnvironment(const UcxOptions& options) : lock_(mu()) {
    if (!options.data_ports.empty()) env_.push_back({"UCX_TCP_PORT_RANGE", options.data_ports});
    if (!std::getenv("UCX_TCP_CONN_NB")) env_.push_back({"UCX_TCP_CONN_NB", "y"});
    for (const auto& [name, value] : env_) {
      const char* before = std::getenv(name.c_str());
      before_.push_back(before ? std::optional<std::string>(before) : std::nullopt);
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~UcxTcpEnvironment() {
    for (size_t i = 0; i < env_.size(); ++i) {
      if (before_[i])
        setenv(env_[i].first.c_str(), before_[i]->c_str(), 1);
      else
        unsetenv(env_[i].first.c_str());
    }
  }
  UcxTcpEnvironment(const UcxTcpEnvironment&) = delete;
  UcxTcpEnvironment& operator=(const UcxTcpEnvironment&) = delete;

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  std::unique_lock<std::mutex> lock_;
  std::vector<std::pair<std::string, std::string>> env_;
  std::vector<std::optional<std::string>> before_;
};

}  // namespace

Status UcxDataPlane::init(const UcxOptions& options) {
  LH_RETURN_IF_ERROR(take_options(options));
  UcxTcpEnvironment tcp_environment(options);
  LH_RETURN_IF_ERROR(check_advertised_address());
  LH_RETURN_IF_ERROR(create_context());
  LH_RETURN_IF_ERROR(create_worker());
  LH_RETURN_IF_ERROR(make_address());
  LH_RETURN_IF_ERROR(start_progress_thread());
  LH_LOG_DEBUG("UCX data plane up (transports {}, address {} bytes, CUDA memory {})", tls_in_use_, address_.size(),
               cuda_direct_       ? "direct"
               : ucx_cuda_memory_ ? "staged (forced)"
                                  : "staged (UCX has no CUDA support)");
  return Status::Ok();
}

// The options, checked: a relay-only plane takes no transports, addresses or ports (and uses UCX's loopback).
Status UcxDataPlane::take_options(const UcxOptions& options) {
  options_ = options;
  data_keys_ = DataKeyPair::generate();
  if (options.relay_only) {
    if (!options.tls.empty() || !options.advertise.empty() || !options.data_ports.empty() || !options.data_bind.empty())
      return invalid_argument("a relay-only data plane opens no data ports: it takes no UCX transports (" +
                              options.tls + "), advertised address (" + options.advertise + "), data ports (" +
                              options.data_ports + ") or bind address (" + options.data_bind + ")");
    options_.tls = "self";  // UCX's loopback to this worker only: no socket, no shared memory segment to attach to
  }
  if (!options.data_ports.empty()) {
    auto range = parse_port_range(options.data_ports);
    if (!range.ok()) return Status(range.status()).prepend("data ports '" + options.data_ports + "'");
  }
  return Status::Ok();
}

// With an advertised host: it is one, and the listener's address is chosen; a bind address needs one.
Status UcxDataPlane::check_advertised_address() {
  const UcxOptions& options = options_;
  if (!options.advertise.empty()) {
    Status ok = check_advertised_host(options.advertise);
    if (!ok.ok()) return ok.prepend("advertised host '" + options.advertise + "'");
    LH_RETURN_IF_ERROR(choose_listen_address());
  } else if (!options.data_bind.empty()) {
    return invalid_argument("a data-plane bind address (" + options.data_bind + ") without an advertised address");
  }
  return Status::Ok();
}

// The UCP context: the configured transports and network devices, and whether UCX moves CUDA memory.
Status UcxDataPlane::create_context() {
  const UcxOptions& options = options_;
  ucp_config_t* config = nullptr;
  LH_CHECK_CODE(ucp_config_read(nullptr, nullptr, &config));
  // UCX on the listener's interface only (and loopback, for peers on this host), unless the user named devices.
  std::string net_devices = options.net_devices;
  if (net_devices.empty() && !std::getenv("UCX_NET_DEVICES") && !listen_interface_.empty())
    net_devices = listen_interface_ == "lo" ? "lo" : listen_interface_ + ",lo";
  if (!options_.tls.empty()) {
    ucs_status_t s = ucp_config_modify(config, "TLS", options_.tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("UCX transports '" + options_.tls + "': " + ucs_status_string(s));
    }
  }
  if (!net_devices.empty()) {
    ucs_status_t s = ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("UCX network devices '" + net_devices + "': " + ucs_status_string(s));
    }
  }
  const char* env_tls = std::getenv("UCX_TLS");
  tls_in_use_ = !options_.tls.empty() ? options_.tls : (env_tls ? env_tls : "ucx-default");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  LH_CHECK_CODE(s);

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &attr) == UCS_OK)
    ucx_cuda_memory_ = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
#if defined(LH_USE_CUDA)
  cuda_direct_ = ucx_cuda_memory_ && !options.force_device_staging;
#endif
  return Status::Ok();
}

// The UCP worker, only ever touched by the progress thread, with the packets' active-message handler.
Status UcxDataPlane::create_worker() {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches UCX
  LH_CHECK_CODE(ucp_worker_create(context_, &wp, &worker_));
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kPacketAm;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  hp.cb = &UcxDataPlane::on_am;
  hp.arg = this;
  LH_CHECK_CODE(ucp_worker_set_am_recv_handler(worker_, &hp));
  return Status::Ok();
}

// The listener (with an advertised host) and this worker's address envelope.
Status UcxDataPlane::make_address() {
  const UcxOptions& options = options_;
  if (!options.advertise.empty()) LH_RETURN_IF_ERROR(open_listener());
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  LH_CHECK_CODE(ucp_worker_get_address(worker_, &addr, &len));
  address_ = wrap_worker_address(addr, len, options.advertise, listen_port_);
  ucp_worker_release_address(worker_, addr);
  return Status::Ok();
}

// The progress thread, sleeping on epoll over the worker's event fd and our wake fd.
Status UcxDataPlane::start_progress_thread() {
  LH_CHECK_CODE(ucp_worker_get_efd(worker_, &ucx_fd_));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) return io_error(std::string("eventfd/epoll: ") + std::strerror(errno));
  for (int fd : {ucx_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return io_error(std::string("epoll_ctl: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { progress_loop(); });
  return Status::Ok();
}

Status UcxDataPlane::open_listener() {
  // On a port of data_ports (the first free one: UCX's own tcp interfaces take some of the range too), else any.
  int lo = 0, hi = 0;
  if (!options_.data_ports.empty()) {
    auto range = parse_port_range(options_.data_ports);
    if (range.ok()) std::tie(lo, hi) = *range;
  }
  ucs_status_t last = UCS_OK;
  for (int port = lo; port <= hi; ++port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = listen_in_addr_;
    sa.sin_port = htons(uint16_t(port));
    if (port && port < hi) {
      // A port taken (by UCX's own interfaces, another worker) is skipped quietly: UCX logs an error for each one
      // its listener cannot bind.
      const int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool taken = probe >= 0 && bind(probe, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0;
      if (probe >= 0) close(probe);
      if (taken) {
        last = UCS_ERR_BUSY;
        continue;
      }
    }
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sizeof(sa);
    lp.conn_handler.cb = &UcxDataPlane::on_conn_request;
    lp.conn_handler.arg = this;
    last = ucp_listener_create(worker_, &lp, &listener_);
    if (last == UCS_OK) break;
    listener_ = nullptr;
    if (last != UCS_ERR_BUSY) break;  // only "port in use" moves on to the next port
  }
  if (!listener_)
    return unavailable(std::string("cannot open the UCX listener for --advertise ") +
                       (lo ? "on any port of " + options_.data_ports : "on a free port") + ": " +
                       ucs_status_string(last));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  LH_CHECK_CODE(ucp_listener_query(listener_, &attr));
  listen_port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);  // bound as AF_INET above
  LH_LOG_INFO("data plane: listening on {}:{} for peers connecting to the advertised address {}", listen_address_,
              listen_port_, options_.advertise);
  return Status::Ok();
}

Status UcxDataPlane::choose_listen_address() {
  // This host's IPv4 addresses and their interfaces.
  std::map<uint32_t, std::string> local;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next)
      if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && (a->ifa_flags & IFF_UP))
        local[reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr] = a->ifa_name;
    freeifaddrs(list);
  }
  auto bind_to = [&](uint32_t addr) {
    listen_in_addr_ = addr;
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &addr, buf, sizeof(buf));
    listen_address_ = buf;
    auto it = local.find(addr);
    listen_interface_ = it == local.end() ? "" : it->second;
  };
  if (!options_.data_bind.empty()) {
    in_addr a{};
    if (inet_pton(AF_INET, options_.data_bind.c_str(), &a) != 1)
      return invalid_argument("data-plane bind address '" + options_.data_bind + "': not an IPv4 address");
    if (!local.count(a.s_addr))
      return invalid_argument("data-plane bind address '" + options_.data_bind +
                              "': no interface of this host has it (its addresses: " + interface_addresses() + ")");
    bind_to(a.s_addr);
    return Status::Ok();
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(options_.advertise.c_str(), nullptr, &hints, &found) == 0) {
    for (addrinfo* f = found; f; f = f->ai_next) {
      const uint32_t addr = reinterpret_cast<sockaddr_in*>(f->ai_addr)->sin_addr.s_addr;
      if (local.count(addr)) {
        bind_to(addr);
        break;
      }
    }
    freeaddrinfo(found);
  }
  if (listen_address_.empty()) {
    bind_to(htonl(INADDR_ANY));
    LH_LOG_WARN("data plane: the advertised address {} is not one of this host's (NAT or port forwarding?): the "
                "listener binds every interface; --data-bind ADDR binds only the interface the forwarded port reaches",
                options_.advertise);
  }
  return Status::Ok();
}

void UcxDataPlane::on_conn_request(ucp_conn_request_h request, void* arg) {
  // A peer's endpoint to our advertised address, or a stranger's. It stays unproven until an authenticated packet
  // (the peer's hello, sent as it connects) comes on it; few unproven ones are kept, and not for long.
  auto* self = static_cast<UcxDataPlane*>(arg);
  std::string from = "?";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) == UCS_OK && attr.client_address.ss_family == AF_INET) {
    char buf[INET_ADDRSTRLEN] = {0};
    const auto* in = reinterpret_cast<const sockaddr_in*>(&attr.client_address);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)))
      from = std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  }
  size_t unproven = 0;
  for (const auto& [h, a] : self->accepted_) unproven += a.rank < 0;
  if (unproven >= size_t(std::max(0, self->options_.max_unproven_connections))) {
    ucp_listener_reject(self->listener_, request);
    const uint64_t n = ++self->refused_count_;
    if (n <= kDropsLoggedFreely || n % 1000 == 0)
      LH_LOG_WARN("data plane: refused a connection from {}: {} connections have not yet proven a rank ({} refused "
                  "so far)",
                  from, unproven, n);
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = self->options_.peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = &UcxDataPlane::on_accepted_ep_error;
  ep.err_handler.arg = self;
  ucp_ep_h h = nullptr;
  ucs_status_t s = ucp_ep_create(self->worker_, &ep, &h);
  if (s != UCS_OK) {
    LH_LOG_WARN("data plane: could not accept the connection from {}: {}", from, ucs_status_string(s));
    return;
  }
  Accepted& a = self->accepted_[h];
  a.at = Clock::now();
  a.from = from;
  ++self->accepted_count_;
  LH_LOG_DEBUG("data plane: accepted a connection from {} on the advertised address", from);
}

void UcxDataPlane::on_accepted_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // The peer closed its endpoint or died: its own endpoint (ours to it) reports that where it matters.
  auto* self = static_cast<UcxDataPlane*>(arg);
  if (!self->accepted_.erase(ep)) return;
  LH_LOG_DEBUG("data plane: an accepted connection ended: {}", ucs_status_string(status));
  self->force_close(ep);
}

UcxDataPlane::~UcxDataPlane() {
  relay_.reset();  // its thread posts to the progress thread
  if (thread_.joinable()) {
    stop_ = true;
    wake();
    thread_.join();
  }
  if (worker_) {
    // A wireup message UCX still holds queued (a peer's reconnect answered just before a reset) is purged by
    // ucp_worker_destroy, and the UCX of Debian 12 (1.13) asserts that no such reply is there (the assertion was
    // removed upstream, openucx/ucx#8175): the worker first sends what it holds, until it has been idle a moment.
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    for (int idle = 0; idle < 20 && Clock::now() < until;) {
      if (ucp_worker_progress(worker_) != 0) {
        idle = 0;
      } else {
        ++idle;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ucp_worker_destroy(worker_);
  }
  // Only now can UCX no longer touch a buffer it was given: transfers it still held fail here, not before
  // (a send_view's or recv_into's memory is the caller's again once its Transfer is done).
  Status closed = unavailable("data plane closed");
  for (auto& [raw, in] : inbound_in_flight_)
    if (in->target) in->target->complete(in->aborted ? *in->aborted : closed);
  for (auto& [p, ctx] : sends_in_flight_) ctx.st->complete(closed);
  inbound_in_flight_.clear();
  sends_in_flight_.clear();
  if (context_) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void UcxDataPlane::wake() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN means the counter is already non-zero: the thread will wake anyway
}

void UcxDataPlane::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.push_back(std::move(fn));
  }
  wake();
}

Status UcxDataPlane::run_on_progress(std::function<Status()> fn) {
  auto done = std::make_shared<std::promise<Status>>();
  auto fut = done->get_future();
  post([fn = std::move(fn), done] { done->set_value(fn()); });
  return fut.get();
}

void UcxDataPlane::progress_loop() {
  std::vector<std::function<void()>> batch;
  Clock::time_point last_activity{};
  while (true) {
    {
      std::lock_guard<std::mutex> lock(cmd_mu_);
      batch.swap(commands_);
    }
    for (auto& fn : batch) fn();
    bool had_commands = !batch.empty();
    batch.clear();
    if (stop_) break;
    bool busy = false;
    while (ucp_worker_progress(worker_) != 0) busy = true;
    if (!to_close_.empty()) {
      std::vector<ucp_ep_h> eps;
      eps.swap(to_close_);
      for (ucp_ep_h ep : eps) force_close(ep);
      busy = true;
    }
    Clock::time_point now = Clock::now();
    release_abandoned_receives(now);
    if (!accepted_.empty() && now >= next_expiry_check_) {
      expire_unproven(now);
      next_expiry_check_ = now + std::chrono::milliseconds(250);
    }
    if (busy || had_commands) {
      last_activity = now;
      continue;
    }
    // While data is moving, poll: sleeping between the protocol's round trips costs a thread wake-up
    // each (tens of microseconds on a loaded host). Shortly after the last activity, poll too, for
    // the answer to what just went out. Otherwise sleep until UCX or a caller has something.
    bool moving = !sends_in_flight_.empty() || !inbound_in_flight_.empty();
    if (moving || now - last_activity < options_.poll_after_activity) {
      std::this_thread::yield();
      continue;
    }
    ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;
    if (s != UCS_OK) LH_LOG_ERROR("ucp_worker_arm: {}", ucs_status_string(s));
    epoll_event evs[2];
    // The timeout is only a safety net; events wake the thread.
    int n = epoll_wait(epoll_fd_, evs, 2, s == UCS_OK ? 200 : 1);
    for (int i = 0; i < n; ++i)
      if (evs[i].data.fd == wake_fd_) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof(v));
        (void)r;
      }
  }
  if (listener_) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  close_endpoints();
  // Receives not matched to a packet can no longer finish. Transfers UCX still holds fail in the
  // destructor, once the worker is gone.
  drop_waiting(unavailable("data plane closed"));
}

void UcxDataPlane::drop_waiting(const Status& why) {
  for (auto& [k, v] : posted_)
    for (auto& st : v) st->complete(why);
  posted_.clear();
  for (auto& [k, v] : unexpected_)
    for (auto& in : v) {
      unqueue_unexpected(*in);
      in->discard = true;
    }
  unexpected_.clear();
}

void UcxDataPlane::close_endpoints() {
  std::vector<void*> reqs;
  reqs.swap(closing_);
  for (auto& [rank, peer] : peer_table_) {
    if (!peer.ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // An endpoint that never delivered a packet may still be connecting (a peer behind NAT, an advertised address
    // nobody answers at): a flush would wait for a connection that never comes, and UCX aborts when the worker goes
    // with it pending.
    p.flags = peer.failed || !peer.delivered ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer.ep, &p);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
    peer.ep = nullptr;
  }
  for (const auto& [ep, a] : accepted_) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = a.rank < 0 ? UCP_EP_CLOSE_FLAG_FORCE : 0;  // a stranger's is not flushed
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
  }
  accepted_.clear();
  for (ucp_ep_h ep : to_close_) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
  }
  to_close_.clear();
  auto deadline = Clock::now() + options_.close_timeout;
  for (void* r : reqs) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
    if (ucp_request_check_status(r) == UCS_INPROGRESS) LH_LOG_WARN("closing a UCX endpoint timed out");
    ucp_request_free(r);
  }
  // Let in-flight receives drain so their requests are released before the worker goes.
  auto end = Clock::now() + std::chrono::milliseconds(50);
  while (!inbound_in_flight_.empty() && Clock::now() < end) ucp_worker_progress(worker_);
}

}  // namespace lh
