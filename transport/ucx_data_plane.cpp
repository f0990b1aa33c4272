// UcxDataPlane: UCX active messages, each under a wire header (packet_auth.h) that is checked — its MAC, its sender's
// plan, its epoch, its sequence number — before the packet's bytes are received or anything is held for them; our own
// matching by (peer, tag); a progress thread that sleeps on epoll(UCX event fd + wake eventfd) when idle; drop-and-log
// for ranks outside the plan; bounds on what a peer can make it buffer; a listener that keeps few unproven
// connections. Used by workers, `bench link` and tests.
#include "transport/ucx_data_plane.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
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

namespace lh {
namespace {

constexpr uint64_t kTagMask = (uint64_t(1) << Tag::kBits) - 1;
constexpr unsigned kPacketAm = 7;  // the active-message id of every packet

uint8_t g_empty_byte = 0;                    // a valid pointer for 0-byte packets and for packets received into nothing
constexpr uint64_t kDropsLoggedFreely = 10;  // then at most one line a second

Status too_big(uint64_t length, uint64_t capacity, int peer) {
  return out_of_range("packet of " + std::to_string(length) + " bytes from rank " + std::to_string(peer) +
                      " does not fit the receive buffer of " + std::to_string(capacity) + " bytes");
}

}  // namespace

struct UcxDataPlane::Inbound {
  UcxDataPlane* plane = nullptr;
  int peer = -1;
  uint64_t tag = 0;
  uint64_t seq = 0;      // the header's sequence number (authenticated planes): the trailer's must match
  bool discard = false;  // thrown away: never delivered (a dropped packet is also received into nothing)
  bool queued = false;   // in unexpected_, counted against its peer's bounds
  Bytes bytes;           // the plane's buffer for the packet (not for direct receives)
  uint64_t held = 0;     // bytes of it counted in buffer_bytes_
  uint64_t payload_length = 0;  // what the receiver gets: length, less the trailer of an authenticated packet
  Clock::time_point arrived{}, finished{};
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::shared_ptr<TransferState> target;  // the receive it was matched to, if any yet
  uint64_t length = 0;
  bool direct = false;  // received straight into target->dst
  // The direct receive failed (fail_peer) while UCX was writing into target->dst. UCX cannot cancel a
  // matched receive, so the target fails with this once UCX reports the request finished, never before.
  std::optional<Status> aborted;
  Clock::time_point aborted_at{};

  // Hands `bytes` over (to a recv's Transfer) or frees them, for packet_buffer_bytes_peak's count.
  Bytes release() {
    plane->buffer_bytes_ -= held;
    held = 0;
    return std::move(bytes);
  }
  ~Inbound() {
    if (plane) plane->buffer_bytes_ -= held;
  }
};

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

Status UcxDataPlane::init(const UcxOptions& options) {
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
  // UCX reads its tcp transport's settings from the environment only, when the worker opens its interfaces
  // (ucp_config_modify does not reach them): set until the worker exists, then put back, under a lock so planes made
  // at once do not mix them. The port range (data_ports); and non-blocking connects unless the user chose: a blocking
  // one to a peer behind NAT would hold ucp_ep_create for the kernel's SYN retries (minutes), where the pre-flight's
  // connect timeout should decide.
  std::vector<std::pair<std::string, std::string>> env;
  if (!options.data_ports.empty()) env.push_back({"UCX_TCP_PORT_RANGE", options.data_ports});
  if (!std::getenv("UCX_TCP_CONN_NB")) env.push_back({"UCX_TCP_CONN_NB", "y"});
  static std::mutex env_mu;
  std::unique_lock<std::mutex> env_lock(env_mu);
  std::vector<std::optional<std::string>> env_before;
  for (const auto& [name, value] : env) {
    const char* before = std::getenv(name.c_str());
    env_before.push_back(before ? std::optional<std::string>(before) : std::nullopt);
    setenv(name.c_str(), value.c_str(), 1);
  }
  struct EnvRestore {
    const std::vector<std::pair<std::string, std::string>>& env;
    const std::vector<std::optional<std::string>>& before;
    ~EnvRestore() {
      for (size_t i = 0; i < env.size(); ++i) {
        if (before[i])
          setenv(env[i].first.c_str(), before[i]->c_str(), 1);
        else
          unsetenv(env[i].first.c_str());
      }
    }
  } env_restore{env, env_before};
  if (!options.advertise.empty()) {
    Status ok = check_advertised_host(options.advertise);
    if (!ok.ok()) return ok.prepend("advertised host '" + options.advertise + "'");
    LH_RETURN_IF_ERROR(choose_listen_address());
  } else if (!options.data_bind.empty()) {
    return invalid_argument("a data-plane bind address (" + options.data_bind + ") without an advertised address");
  }
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

  if (!options.advertise.empty()) LH_RETURN_IF_ERROR(open_listener());
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  LH_CHECK_CODE(ucp_worker_get_address(worker_, &addr, &len));
  address_ = wrap_worker_address(addr, len, options.advertise, listen_port_);
  ucp_worker_release_address(worker_, addr);

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
  LH_LOG_DEBUG("UCX data plane up (transports {}, address {} bytes, CUDA memory {})", tls_in_use_, address_.size(),
               cuda_direct_       ? "direct"
               : ucx_cuda_memory_ ? "staged (forced)"
                                  : "staged (UCX has no CUDA support)");
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

Status UcxDataPlane::connect(int self_rank, const std::map<int, Bytes>& peers, const DataPlaneSecurity& security) {
  if (self_rank < 0 || self_rank > UcxOptions::kMaxRank)
    return invalid_argument("rank " + std::to_string(self_rank) + " outside [0, " +
                            std::to_string(UcxOptions::kMaxRank) + "]");
  std::map<int, Bytes> raw;
  // Peers that advertise an address: its socket address, resolved here (not on the progress thread: a DNS lookup
  // may take seconds), or why it could not be.
  struct Advertised {
    std::string name;  // "advertised HOST:PORT"
    sockaddr_storage addr{};
    socklen_t addrlen = 0;
    std::string error;
  };
  std::map<int, Advertised> advertised;
  for (const auto& [r, env] : peers) {
    if (r < 0 || r > UcxOptions::kMaxRank) return invalid_argument("peer rank " + std::to_string(r) + " out of range");
    auto a = unwrap_peer_address(env);
    if (!a.ok()) return Status(a.status()).prepend("address of rank " + std::to_string(r));
    if (!a->host.empty() && r != self_rank) {
      Advertised& ad = advertised[r];
      ad.name = a->describe();
      addrinfo hints{};
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      const int rc = getaddrinfo(a->host.c_str(), std::to_string(a->port).c_str(), &hints, &found);
      if (rc != 0 || !found) {
        ad.error = "cannot resolve its " + ad.name + ": " + gai_strerror(rc);
      } else {
        std::memcpy(&ad.addr, found->ai_addr, found->ai_addrlen);
        ad.addrlen = found->ai_addrlen;
      }
      if (found) freeaddrinfo(found);
    }
    raw[r] = std::move(a->worker);
  }
  // The pairs' keys, derived before anything changes: a bad key fails connect() as a whole.
  std::map<int, std::shared_ptr<PeerCrypto>> crypto;
  if (rank_.load() >= 0 && protection_.load() != security.protection)
    return invalid_argument(std::string("packet protection cannot change from ") +
                            packet_protection_name(protection_.load()) + " to " +
                            packet_protection_name(security.protection) + " on a connected plane");
  if (security.protection != PacketProtection::kNone) {
    std::lock_guard<std::mutex> lock(crypto_mu_);
    for (const auto& [r, a] : raw) {
      if (r == self_rank) continue;
      auto k = security.peers.find(r);
      if (k == security.peers.end()) return invalid_argument("no data-plane public key for rank " + std::to_string(r));
      auto old = crypto_.find(r);
      if (old != crypto_.end() && old->second->public_key == k->second.public_key) {
        crypto[r] = old->second;  // the same peer: its sequence numbers and replay window go on
        continue;
      }
      LH_ASSIGN_OR_RETURN(PacketKeys keys,
                          PacketKeys::derive(self_rank, data_keys_, r, k->second.public_key, k->second.ciphers));
      auto pc = std::make_shared<PeerCrypto>();
      pc->public_key = k->second.public_key;
      pc->keys = keys;
      crypto[r] = std::move(pc);
    }
  }
  {
    std::lock_guard<std::mutex> lock(crypto_mu_);
    crypto_ = std::move(crypto);
    protection_ = security.protection;
    epoch_ = security.epoch;
  }
  Status st = run_on_progress([&]() -> Status {
    rank_ = self_rank;
    for (auto it = peer_table_.begin(); it != peer_table_.end();) {
      if (raw.count(it->first)) {
        ++it;
        continue;
      }
      fail_peer_locked(it->first, "no longer in the plan");
      it = peer_table_.erase(it);
    }
    for (const auto& [r, addr] : raw) {
      if (peer_table_.count(r) && peer_table_[r].ep && !peer_table_[r].failed) continue;
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_mode = options_.peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      ep.err_handler.cb = &UcxDataPlane::on_ep_error;
      ep.err_handler.arg = this;
      Peer p;
      auto ad = advertised.find(r);
      ucs_status_t s = UCS_OK;
      if (options_.relay_only) {
        p.failed = true;
        p.why = "this worker is relay-only (--relay-only): it opens no data ports, its pairs go through the relay";
        peer_table_[r] = p;
        continue;
      }
      if (ad == advertised.end()) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
        s = ucp_ep_create(worker_, &ep, &p.ep);
      } else {
        // Client–server mode: UCX connects to the peer's listener at the address it advertises.
        p.advertised = ad->second.name;
        ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
        ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ad->second.addr);
        ep.sockaddr.addrlen = ad->second.addrlen;
        s = ad->second.error.empty() ? ucp_ep_create(worker_, &ep, &p.ep) : UCS_ERR_UNREACHABLE;
      }
      if (s != UCS_OK) {
        // A peer this host cannot reach at its worker address (behind NAT, another site's private network) or at
        // the address it advertises: its transfers fail, named, until use_relay() routes it through the relay (the
        // pre-flight decides which).
        p.ep = nullptr;
        p.failed = true;
        const std::string to = ad == advertised.end() ? "worker address" : ad->second.name;
        p.why = ad != advertised.end() && !ad->second.error.empty()
                    ? ad->second.error
                    : "no UCX endpoint to its " + to + ": " + ucs_status_string(s);
        LH_LOG_WARN("data plane: rank {} cannot be reached directly: {}", r, p.why);
      }
      const bool hello = p.ep && !p.advertised.empty();
      peer_table_[r] = p;
      // The peer's listener accepted this connection from anyone: the hello proves it is ours (on_conn_request).
      if (hello) send_hello(r);
    }
    recheck_hellos();
    return Status::Ok();
  });
  LH_RETURN_IF_ERROR(st);
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peer_ranks_.clear();
    for (const auto& [r, a] : raw) peer_ranks_.push_back(r);
  }
  if (meter() && meter()->self_rank() < 0) meter()->set_self_rank(self_rank);
  LH_LOG_DEBUG("rank {} connected to {} peers over UCX (packets: {})", self_rank, raw.size(),
               packet_protection_name(security.protection));
  return Status::Ok();
}

std::vector<int> UcxDataPlane::peers() const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  return peer_ranks_;
}

void UcxDataPlane::fail_peer(int peer, const std::string& reason) {
  post([this, peer, reason] { fail_peer_locked(peer, reason); });
}

void UcxDataPlane::reset(const std::string& reason) {
  const bool connected = rank_.load() >= 0;
  if (connected) {
    (void)run_on_progress([&]() -> Status {
      rank_ = -1;  // from here every packet is keyless (dropped; a hello on an accepted connection is kept)
      for (auto& [r, p] : peer_table_) {
        fail_peer_locked(r, reason);  // its receives, queued packets and in-flight transfers; its endpoint closes
        force_close(p.ep);            // one that had failed before may not have been closed by UCX yet
      }
      drop_waiting(aborted(reason));
      peer_table_.clear();
      for (auto& [ep, a] : accepted_) {
        ucp_ep_h h = ep;
        force_close(h);
      }
      accepted_.clear();
      return Status::Ok();
    });
    // The endpoints' closes fail what UCX still held (their callbacks run on the progress thread): wait until UCX has
    // let go of every caller's buffer (sends, and receives written straight into the caller's memory).
    const auto deadline = Clock::now() + options_.close_timeout;
    size_t held = 0;
    for (;;) {
      (void)run_on_progress([&]() -> Status {
        held = sends_in_flight_.size();
        for (const auto& [raw, in] : inbound_in_flight_) held += in->direct ? 1 : 0;
        return Status::Ok();
      });
      if (held == 0 || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (held)
      LH_LOG_WARN("data plane: {} transfers still held by UCX {} ms after the plan ended ({})", held,
                  options_.close_timeout.count(), reason);
  }
  relay_.reset();  // its loop thread is joined: nothing arrives from the relay after this
  {
    std::lock_guard<std::mutex> lock(relay_mu_);
    relay_answer_.reset();
  }
  relay_partial_.clear();
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peer_ranks_.clear();
    relayed_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(crypto_mu_);
    crypto_.clear();
    data_keys_ = DataKeyPair::generate();
  }
  if (connected) {
    ++resets_;
    LH_LOG_DEBUG("data plane: the plan ended ({}); the UCX worker stays for the next one", reason);
  }
}

void UcxDataPlane::release_abandoned_receives(Clock::time_point now) {
  // A live sender finishes a packet whose receive failed well within this; a dead one never does (UCX keeps an
  // eager packet missing its last fragments forever). Its receive fails now rather than hang its caller until the
  // plane closes; UCX keeps the request, and the caller's buffer is only written again if the dead sender's
  // remaining fragments were still on their way after kAbandonAfter.
  for (auto& [ptr, in] : inbound_in_flight_) {
    if (!in->aborted || !in->target || now - in->aborted_at < kAbandonAfter) continue;
    in->target->complete(*in->aborted);
    in->target.reset();
    in->discard = true;
  }
}

void UcxDataPlane::fail_peer_locked(int peer, const std::string& reason) {
  auto it = peer_table_.find(peer);
  if (it == peer_table_.end() || it->second.failed) return;
  size_t pending = 0;
  for (auto& [key, v] : posted_) pending += key.first == peer ? v.size() : 0;
  for (auto& [ptr, ctx] : sends_in_flight_) pending += ctx.st->peer == peer;
  for (auto& [ptr, in] : inbound_in_flight_) pending += in->peer == peer && in->target;
  // A peer that simply finished (its endpoint times out after it exits) is not news; one that leaves
  // transfers behind is.
  if (pending)
    LH_LOG_WARN("data plane: rank {} failed with {} transfers pending: {}", peer, pending, reason);
  else
    LH_LOG_INFO("data plane: rank {} is gone: {}", peer, reason);
  it->second.failed = true;
  it->second.why = reason;
  Status why = unavailable("rank " + std::to_string(peer) + " failed: " + reason);
  for (auto p = posted_.begin(); p != posted_.end();) {
    if (p->first.first != peer) {
      ++p;
      continue;
    }
    for (auto& st : p->second) st->complete(why);
    p = posted_.erase(p);
  }
  force_close(it->second.ep);
  // Its packets that wait for receives will never be taken now; those still arriving are thrown away
  // when UCX is done with them (inbound_in_flight_ keeps them alive until then).
  for (auto u = unexpected_.begin(); u != unexpected_.end();) {
    if (u->first.first != peer) {
      ++u;
      continue;
    }
    for (auto& in : u->second) {
      unqueue_unexpected(*in);
      in->discard = true;
    }
    u = unexpected_.erase(u);
  }
  for (auto& [ptr, in] : inbound_in_flight_) {
    if (in->peer != peer || !in->target) continue;
    if (in->direct) {
      // UCX is writing into the caller's buffer and cannot cancel a receive it has matched (ucp_request_cancel
      // only takes back unmatched ones): the receive fails in on_recv_done, once UCX lets go of the buffer.
      // A sender that is still alive finishes the packet; one that died leaves it until the plane closes.
      in->aborted = why;
      in->aborted_at = Clock::now();
      continue;
    }
    in->target->complete(why);  // it arrives into the plane's own buffer, which nobody will read
    in->target.reset();
    in->discard = true;
  }
}

void UcxDataPlane::force_close(ucp_ep_h& ep) {
  // Force-closing the endpoint cancels its in-flight sends; their callbacks fail them once UCX has
  // let go of the buffers (a send_view's memory must stay valid until then).
  // Inside an active message's callback UCX may still use the endpoint it came on: closed once the callback is over.
  if (!ep) return;
  if (in_callback_) {
    to_close_.push_back(ep);
    ep = nullptr;
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  ep = nullptr;
}

void UcxDataPlane::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxDataPlane*>(arg);
  for (auto& [r, p] : self->peer_table_)
    if (p.ep == ep)
      self->fail_peer_locked(r, std::string("UCX endpoint error") +
                                    (p.advertised.empty() ? "" : " (to its " + p.advertised + ")") + ": " +
                                    ucs_status_string(status));
}

void UcxDataPlane::start_send(std::shared_ptr<TransferState> st) {
  if (protection_.load() != PacketProtection::kNone) {
    Status s = seal_outgoing(*st);
    if (!s.ok()) return st->complete(s);
  }
  post([this, st = std::move(st)] { issue_send(st); });
}

std::shared_ptr<UcxDataPlane::PeerCrypto> UcxDataPlane::crypto_of(int peer) const {
  std::lock_guard<std::mutex> lock(crypto_mu_);
  auto it = crypto_.find(peer);
  return it == crypto_.end() ? nullptr : it->second;
}

Status UcxDataPlane::seal_outgoing(TransferState& st) {
  std::shared_ptr<PeerCrypto> pc = crypto_of(st.peer);
  if (!pc) return Status::Ok();  // not in the plan: issue_send refuses it
  if (st.memory != Device::cpu)  // device_memory_direct says no for authenticated planes, so DataPlane staged it
    return internal_error("an authenticated plane was handed device memory to send");
  Bytes buf;
  if (!st.owned.empty() && st.data == st.owned.data() && st.size == st.owned.size())
    buf = std::move(st.owned);  // the plane's own packet: sealed where it is
  else
    buf.assign(st.data, st.data + st.size);  // the caller's memory (send_view) is never written
  buf.resize(st.size + kPacketTrailerBytes);
  PacketHeader h;
  h.epoch = epoch_.load();
  h.sender = rank_.load();
  h.receiver = st.peer;
  h.tag_bits = st.tag.pack();
  h.seq = pc->next_seq.fetch_add(1) + 1;
  seal_packet(protection_.load(), pc->keys, h, buf.data(), st.size);
  st.owned = std::move(buf);
  st.data = st.owned.data();
  st.size = st.owned.size();
  return Status::Ok();
}

std::string UcxDataPlane::open_inbound(Inbound& in) {
  std::shared_ptr<PeerCrypto> pc = crypto_of(in.peer);
  if (!pc) return "no data-plane key for rank " + std::to_string(in.peer);
  PacketHeader h;
  h.sender = in.peer;
  h.receiver = rank_.load();
  h.tag_bits = in.tag;
  Status s = open_packet(protection_.load(), pc->keys, h, in.bytes.data(), in.bytes.size());
  if (!s.ok()) return s.message();
  PacketTrailer t = read_trailer(in.bytes.data(), in.bytes.size()).value();
  if (in.seq && t.seq != in.seq)
    return "its trailer's sequence number " + std::to_string(t.seq) + " is not its header's " + std::to_string(in.seq);
  if (t.epoch != epoch_.load())
    return "sealed in plan epoch " + std::to_string(t.epoch) + ", this plane is in epoch " +
           std::to_string(epoch_.load()) + " (a packet from before a re-plan)";
  if (!pc->window.fresh(t.seq))
    return "a replay: packet " + std::to_string(t.seq) + " from this rank was seen before or is too old (newest " +
           std::to_string(pc->window.newest()) + ")";
  pc->window.accept(t.seq);
  in.payload_length = in.bytes.size() - kPacketTrailerBytes;
  in.bytes.resize(in.payload_length);
  return "";
}

void UcxDataPlane::refuse_inbound(const std::shared_ptr<Inbound>& in, const std::string& why) {
  // auth_failures_ is counted last (below), once the drop is counted and the packet is out of the unexpected queue:
  // whoever sees the failure then sees those too.
  note_drop(in->peer, in->length, why);
  in->discard = true;
  Key key{in->peer, in->tag};
  if (in->queued) {
    unqueue_unexpected(*in);
    auto u = unexpected_.find(key);
    if (u != unexpected_.end()) {
      auto& v = u->second;
      for (auto it = v.begin(); it != v.end(); ++it)
        if (it->get() == in.get()) {
          v.erase(it);
          break;
        }
      if (v.empty()) unexpected_.erase(u);
    }
  }
  in->release();
  // The receive it had matched waits for the next packet, first in line as it was.
  if (in->target) match_recv(std::move(in->target), /*first=*/true);
  auth_failures_ += 1;
}

void UcxDataPlane::start_recv(std::shared_ptr<TransferState> st) {
  post([this, st = std::move(st)] { issue_recv(st); });
}

namespace {
// A fault-injection variable's step (tests only); −1 when it is not set.
int64_t fault_step(const char* name) {
  const char* env = std::getenv(name);
  return env ? std::atoll(env) : int64_t(-1);
}
// LH_FAULT_DROP_SEND=STEP (tests only): the first activation this process sends for STEP is reported sent but never
// leaves, once per process — a packet the data plane lost.
bool fault_drop_send(const Tag& tag) {
  static const int64_t step = fault_step("LH_FAULT_DROP_SEND");
  static std::atomic<bool> dropped{false};
  if (step < 0 || tag.step != uint32_t(step) || tag.role != Role::kActivation || dropped.exchange(true)) return false;
  LH_LOG_WARN("fault injection: dropping the activation {} (LH_FAULT_DROP_SEND)", tag.to_string());
  return true;
}
// LH_FAULT_FORGE=STEP (tests only; authenticated planes): the step whose first activation this process sends is
// preceded by what an attacker who can reach the receiver would send: that packet with a payload byte flipped (its
// tag fails), the same packet under another member's rank (its tag fails: the pair keys differ), and the first
// activation sent for STEP − 1 again (a replay). The receiver must drop and count each and change nothing else.
int64_t fault_forge_step() {
  static const int64_t step = fault_step("LH_FAULT_FORGE");
  return step;
}
}  // namespace

void UcxDataPlane::forge_for_tests(const std::shared_ptr<TransferState>& st) {
  const int64_t step = fault_forge_step();
  if (step < 2 || st->tag.role != Role::kActivation || protection_.load() == PacketProtection::kNone) return;
  // A sealed packet sent as it is (no meter, nobody waits for it), claiming `wire_rank` when that is ≥ 0.
  auto raw = [&](int peer, Tag tag, Bytes bytes, int wire_rank) {
    auto f = std::make_shared<TransferState>();
    f->peer = peer;
    f->tag = tag;
    f->owned = std::move(bytes);
    f->data = f->owned.data();
    f->size = f->owned.size();
    issue_send(f, wire_rank);
  };
  if (int64_t(st->tag.step) == step - 1 && forge_replay_.empty()) {
    forge_replay_ = st->owned;
    forge_replay_peer_ = st->peer;
    forge_replay_tag_ = st->tag;
  }
  if (int64_t(st->tag.step) != step || forge_done_ || forge_replay_.empty()) return;
  forge_done_ = true;
  Bytes flipped = st->owned;
  flipped[0] ^= 0x40;
  raw(st->peer, st->tag, std::move(flipped), -1);
  for (const auto& [r, p] : peer_table_)
    if (r != rank_.load() && r != st->peer) {
      raw(st->peer, st->tag, st->owned, r);
      break;
    }
  raw(forge_replay_peer_, forge_replay_tag_, forge_replay_, -1);
  LH_LOG_WARN("fault injection: sent a forged, a misattributed and a replayed packet before {} (LH_FAULT_FORGE)",
              st->tag.to_string());
}

void UcxDataPlane::send_hello(int peer) {
  auto st = std::make_shared<TransferState>();
  st->peer = peer;
  st->on_done([peer](TransferState& t) {
    if (!t.status.ok()) LH_LOG_DEBUG("data plane: the hello to rank {} failed: {}", peer, t.status.message());
  });
  issue_send(st, -1, kWireHello);
}

Transfer UcxDataPlane::send_raw_for_tests(int peer, const std::array<uint8_t, kWireHeaderBytes>& header, Bytes packet) {
  auto st = std::make_shared<TransferState>();
  st->peer = peer;
  st->owned = std::move(packet);
  st->data = st->owned.data();
  st->size = st->owned.size();
  post([this, st, header] { issue_send(st, -1, 0, &header); });
  return Transfer(st);
}

void UcxDataPlane::issue_send(const std::shared_ptr<TransferState>& st, int wire_rank, uint8_t flags,
                              const std::array<uint8_t, kWireHeaderBytes>* given) {
  if (fault_drop_send(st->tag)) return st->complete(Status::Ok());
  if (wire_rank < 0 && fault_forge_step() >= 0) forge_for_tests(st);
  auto it = peer_table_.find(st->peer);
  if (it == peer_table_.end())
    return st->complete(invalid_argument("send to rank " + std::to_string(st->peer) + ", which is not in the plan"));
  if (it->second.failed)
    return st->complete(unavailable("send to failed rank " + std::to_string(st->peer) + ": " + it->second.why));
  if (it->second.relayed) {
    if (flags & kWireHello) return st->complete(Status::Ok());  // the relay vouches for ranks itself
    return relay_send(st);
  }
  WireHeader h;
  h.packet.epoch = epoch_.load();
  h.packet.sender = wire_rank >= 0 ? wire_rank : rank_.load();
  h.packet.receiver = st->peer;
  h.packet.tag_bits = st->tag.pack();
  h.length = st->size;
  h.flags = flags;
  std::shared_ptr<PeerCrypto> pc = protection_.load() == PacketProtection::kNone ? nullptr : crypto_of(st->peer);
  if (given) {
    pc = nullptr;  // sent under the header the test made
  } else if (pc && (flags & kWireHello)) {
    h.packet.seq = pc->next_seq.fetch_add(1) + 1;
  } else if (pc) {
    auto t = read_trailer(st->data, st->size);  // sealed by seal_outgoing: the header names the trailer's number
    if (!t.ok()) return st->complete(internal_error("an authenticated plane sending an unsealed packet"));
    h.packet.seq = t->seq;
    h.packet.epoch = t->epoch;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.datatype = ucp_dt_make_contig(1);
  p.cb.send = &UcxDataPlane::on_send_done;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the receiver learns which of its connections the packet came on
  SendCtx& ctx = sends_in_flight_[st.get()];
  ctx.plane = this;
  ctx.st = st;
  if (given)
    ctx.header = *given;
  else
    write_wire_header(h, pc ? &pc->keys : nullptr, ctx.header.data());
  p.user_data = &ctx;
  if (st->memory == Device::cuda && st->size) {  // only reaches here when cuda_direct_
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  const void* buf = st->size ? st->data : &g_empty_byte;
  ucs_status_ptr_t r = ucp_am_send_nbx(it->second.ep, kPacketAm, ctx.header.data(), ctx.header.size(), buf, st->size, &p);
  if (UCS_PTR_IS_PTR(r)) return;  // on_send_done finishes it
  sends_in_flight_.erase(st.get());
  ucs_status_t s = UCS_PTR_STATUS(r);
  if (s == UCS_OK) it->second.delivered = true;
  st->complete(s == UCS_OK ? Status::Ok() : send_failed(st->peer, s));
}

Status UcxDataPlane::send_failed(int peer, ucs_status_t status) const {
  auto it = peer_table_.find(peer);
  const std::string at =
      it != peer_table_.end() && !it->second.advertised.empty() ? " (at its " + it->second.advertised + ")" : "";
  return unavailable("UCX send to rank " + std::to_string(peer) + at + ": " + ucs_status_string(status));
}

void UcxDataPlane::on_send_done(void* request, ucs_status_t status, void* user) {
  auto* ctx = static_cast<SendCtx*>(user);
  ucp_request_free(request);
  std::shared_ptr<TransferState> st = std::move(ctx->st);
  ctx->plane->sends_in_flight_.erase(st.get());
  if (status == UCS_OK)
    if (auto it = ctx->plane->peer_table_.find(st->peer); it != ctx->plane->peer_table_.end())
      it->second.delivered = true;
  st->complete(status == UCS_OK ? Status::Ok() : ctx->plane->send_failed(st->peer, status));
}

void UcxDataPlane::issue_recv(const std::shared_ptr<TransferState>& st) {
  match_recv(st, /*first=*/false);
}

void UcxDataPlane::match_recv(const std::shared_ptr<TransferState>& st, bool first) {
  auto it = peer_table_.find(st->peer);
  if (it == peer_table_.end())
    return st->complete(
        invalid_argument("receive from rank " + std::to_string(st->peer) + ", which is not in the plan"));
  if (it->second.failed)
    return st->complete(unavailable("receive from failed rank " + std::to_string(st->peer) + ": " + it->second.why));
  Key key{st->peer, st->tag.pack()};
  auto u = unexpected_.find(key);
  if (u != unexpected_.end() && !u->second.empty()) {
    std::shared_ptr<Inbound> in = u->second.front();
    u->second.erase(u->second.begin());
    if (u->second.empty()) unexpected_.erase(u);
    unqueue_unexpected(*in);
    if (in->done) return deliver(in, st);
    in->target = st;  // still arriving; on_recv_done delivers
    return;
  }
  auto& queue = posted_[key];
  queue.insert(first ? queue.begin() : queue.end(), st);
}

void UcxDataPlane::deliver(const std::shared_ptr<Inbound>& in, const std::shared_ptr<TransferState>& st) {
  if (in->status != UCS_OK)
    return st->complete(unavailable(std::string("UCX receive from rank ") + std::to_string(in->peer) + ": " +
                                    ucs_status_string(in->status)));
  st->t_start = in->arrived;
  st->t_end = in->finished;
  const uint64_t n = in->payload_length;
  st->wire_bytes = n;
  if (st->dst && in->direct) return st->complete(Status::Ok());  // UCX wrote straight into it
  if (st->dst) {  // arrived before recv_into was posted (or authenticated): one copy out of the plane's buffer
    if (n > st->capacity) return st->complete(too_big(n, st->capacity, in->peer));
    if (n && st->memory == Device::cpu) std::memcpy(st->dst, in->bytes.data(), n);
    if (n && st->memory != Device::cpu)  // direct CUDA receive that arrived early
      return st->complete(copy_bytes(st->dst, st->memory, in->bytes.data(), Device::cpu, n));
    return st->complete(Status::Ok());
  }
  st->owned = in->release();
  st->complete(Status::Ok());
}

std::string UcxDataPlane::drop_reason(int peer, uint64_t tag_bits) {
  auto tag = Tag::unpack(tag_bits);
  if (!tag.ok()) return tag.status().message();
  auto pit = peer_table_.find(peer);
  if (pit == peer_table_.end()) return "not in the current plan";
  if (pit->second.failed) return "rank has failed";
  return "";
}

void UcxDataPlane::note_drop(int peer, uint64_t length, const std::string& why) {
  dropped_ += 1;
  // A stranger or a broken peer can send many: the first few are logged one by one, then one line a second.
  Clock::time_point now = Clock::now();
  if (drops_logged_ >= kDropsLoggedFreely && now < next_drop_log_) {
    ++drops_unlogged_;
    return;
  }
  LH_LOG_WARN("data plane: dropping a {}-byte packet from rank {}: {}{}", length, peer, why,
              drops_unlogged_ ? " (" + std::to_string(drops_unlogged_) + " more dropped since the last report)"
                              : std::string());
  ++drops_logged_;
  drops_unlogged_ = 0;
  next_drop_log_ = now + std::chrono::seconds(1);
}

void UcxDataPlane::allocate_packet(Inbound& in) {
  in.bytes.resize(in.length);
  in.held = in.length;
  uint64_t held = buffer_bytes_ += in.length;
  if (held > buffer_bytes_peak_) buffer_bytes_peak_ = held;  // only the progress thread allocates
}

void UcxDataPlane::queue_unexpected(const std::shared_ptr<Inbound>& in) {
  Peer& p = peer_table_.at(in->peer);
  p.unexpected_bytes += in->length;
  p.unexpected_packets += 1;
  unexpected_bytes_ += in->length;
  unexpected_packets_ += 1;
  in->queued = true;
  unexpected_[Key{in->peer, in->tag}].push_back(in);
}

void UcxDataPlane::unqueue_unexpected(Inbound& in) {
  if (!in.queued) return;
  in.queued = false;
  auto pit = peer_table_.find(in.peer);
  if (pit != peer_table_.end()) {
    pit->second.unexpected_bytes -= in.length;
    pit->second.unexpected_packets -= 1;
  }
  unexpected_bytes_ -= in.length;
  unexpected_packets_ -= 1;
}

ucs_status_t UcxDataPlane::on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxDataPlane*>(arg);
  self->in_callback_ = true;
  const ucs_status_t s = self->take_am(header, header_length, data, length, param);
  self->in_callback_ = false;
  return s;
}

std::string UcxDataPlane::epoch_mismatch(uint32_t epoch) const {
  return "sent in plan epoch " + std::to_string(epoch) + ", this plane is in epoch " + std::to_string(epoch_.load()) +
         " (a packet from before a re-plan)";
}

std::string UcxDataPlane::check_header(const WireHeader& h, const uint8_t* bytes, bool accept, bool* keyless) {
  *keyless = false;
  if (rank_.load() < 0) {
    *keyless = true;  // not connected yet: nobody's key is known
    return "this plane has no plan yet";
  }
  if (h.packet.receiver != rank_.load())
    return "addressed to rank " + std::to_string(h.packet.receiver) + ", not this one";
  if (protection_.load() == PacketProtection::kNone) {
    *keyless = !peer_table_.count(h.packet.sender);
    if (*keyless) return "not in the current plan";
    // Without keys the epoch is a peer's word, but it keeps a kept plane's next plan apart from packets of the last
    // (dropped, as a packet from outside the plan is: nothing is authenticated here to fail).
    if (h.packet.epoch == epoch_.load()) return "";
    *keyless = true;
    return epoch_mismatch(h.packet.epoch);
  }
  std::shared_ptr<PeerCrypto> pc = crypto_of(h.packet.sender);
  if (!pc) {
    *keyless = true;
    return "no data-plane key for rank " + std::to_string(h.packet.sender) + " (not in the current plan)";
  }
  if (!wire_header_authentic(pc->keys, bytes)) return "its header's MAC does not verify (forged, or another sender's)";
  if (h.packet.epoch != epoch_.load()) return epoch_mismatch(h.packet.epoch);
  if (!pc->window.fresh(h.packet.seq))
    return "a replay: packet " + std::to_string(h.packet.seq) + " from this rank was seen before or is too old (newest " +
           std::to_string(pc->window.newest()) + ")";
  if (accept) pc->window.accept(h.packet.seq);
  return "";
}

void UcxDataPlane::prove_connection(ucp_ep_h ep, int rank) {
  auto it = ep ? accepted_.find(ep) : accepted_.end();
  if (it == accepted_.end() || it->second.rank >= 0) return;
  it->second.rank = rank;
  it->second.early_hello.clear();
  LH_LOG_DEBUG("data plane: the connection from {} is rank {}'s", it->second.from, rank);
}

void UcxDataPlane::recheck_hellos() {
  for (auto& [ep, a] : accepted_) {
    if (a.rank >= 0 || a.early_hello.empty()) continue;
    Bytes hello = std::move(a.early_hello);
    a.early_hello.clear();
    auto h = read_wire_header(hello.data(), hello.size());
    bool keyless = false;
    const std::string bad = h.ok() ? check_header(*h, hello.data(), /*accept=*/true, &keyless) : "malformed";
    if (bad.empty())
      prove_connection(ep, h->packet.sender);
    else if (!keyless)
      auth_failures_ += 1;  // a stranger's early hello: the connection expires unproven
  }
}

void UcxDataPlane::expire_unproven(Clock::time_point now) {
  for (auto it = accepted_.begin(); it != accepted_.end();) {
    if (it->second.rank >= 0 || now - it->second.at < options_.unproven_timeout) {
      ++it;
      continue;
    }
    LH_LOG_WARN("data plane: closing the connection from {}: it proved no rank of the plan within {} ms",
                it->second.from, options_.unproven_timeout.count());
    ucp_ep_h ep = it->first;
    it = accepted_.erase(it);
    force_close(ep);
    ++unproven_closed_;
  }
}

void UcxDataPlane::set_bounds(uint64_t max_packet_bytes, uint64_t max_unexpected_bytes) {
  post([this, max_packet_bytes, max_unexpected_bytes] {
    options_.max_packet_bytes = max_packet_bytes;
    options_.max_unexpected_bytes = max_unexpected_bytes;
  });
}

ucs_status_t UcxDataPlane::take_am(const void* header, size_t header_length, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
  // Nothing of the packet is received, allocated or charged to anyone until its header is checked. A refused packet
  // sent by rendezvous is never fetched (its sender's send fails); an eager one is already here and just forgotten.
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ucp_ep_h from = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  auto refuse = [&](int peer, const std::string& why) {
    note_drop(peer, length, why);
    auth_failures_ += 1;
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  };
  auto h = read_wire_header(header, header_length);
  if (!h.ok()) return refuse(-1, h.status().message());
  const int sender = h->packet.sender;
  if (h->length != length)
    return refuse(sender, "its header announces " + std::to_string(h->length) + " bytes, " + std::to_string(length) +
                              " came");
  const uint8_t* raw = static_cast<const uint8_t*>(header);
  const bool hello = (h->flags & kWireHello) != 0;
  bool keyless = false;
  const std::string bad = check_header(*h, raw, /*accept=*/hello, &keyless);
  if (!bad.empty()) {
    auto a = from ? accepted_.find(from) : accepted_.end();
    if (hello && keyless && a != accepted_.end() && a->second.rank < 0 && a->second.early_hello.empty()) {
      a->second.early_hello.assign(raw, raw + kWireHeaderBytes);  // before connect(): checked again then
      return UCS_OK;
    }
    if (keyless) {  // a packet from outside the plan (or before connect): dropped as before, not an auth failure
      note_drop(sender, length, bad);
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    return refuse(sender, bad);
  }
  prove_connection(from, sender);
  if (hello) return UCS_OK;

  auto in = std::make_shared<Inbound>();
  in->plane = this;
  in->arrived = Clock::now();
  in->peer = sender;
  in->tag = h->packet.tag_bits;
  in->seq = h->packet.seq;
  in->length = length;
  admit_inbound(in);
  if (in->discard) return UCS_OK;  // a rendezvous packet dropped here is never fetched
  void* buf = !length     ? static_cast<void*>(&g_empty_byte)
              : in->direct ? static_cast<void*>(in->target->dst)
                           : static_cast<void*>(in->bytes.data());
  const bool device = in->direct && in->target->memory == Device::cuda && length;
  if (!rndv) {  // eager: the bytes are here, valid during this callback only
    Status copied = Status::Ok();
    if (length && device)
      copied = copy_bytes(buf, Device::cuda, data, Device::cpu, length);
    else if (length)
      std::memcpy(buf, data, length);
    if (!copied.ok() && in->target) {
      in->target->complete(copied);
      in->target.reset();
      in->discard = true;
    }
    finish_inbound(in, UCS_OK);
    return UCS_OK;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  p.cb.recv_am = &UcxDataPlane::on_recv_done;
  p.user_data = in.get();
  if (device) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  inbound_in_flight_[in.get()] = in;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, data, buf, length, &p);
  if (UCS_PTR_IS_PTR(r)) return UCS_INPROGRESS;  // the receive has the descriptor now
  on_recv_done(nullptr, UCS_PTR_STATUS(r), length, in.get());
  return UCS_OK;  // nothing was started on the descriptor: UCX answers the sender
}

void UcxDataPlane::admit_inbound(const std::shared_ptr<Inbound>& in) {
  const uint64_t length = in->length;
  in->payload_length = length;
  // An authenticated packet is received into the plane's buffer, never straight into a caller's: it is checked
  // before anything of it reaches the caller, and one that fails leaves the receive it matched waiting.
  const bool secure = protection_.load() != PacketProtection::kNone;
  if (secure) in->payload_length = length >= kPacketTrailerBytes ? length - kPacketTrailerBytes : 0;
  // Whether the packet is taken is decided before anything is allocated for it: `length` is the
  // sender's word, and a dropped packet is received into nothing.
  std::string drop = drop_reason(in->peer, in->tag);
  bool auth_failure = false;  // counted after the drop (see refuse_inbound)
  if (drop.empty() && secure && length < kPacketTrailerBytes) {
    auth_failure = true;
    drop = "shorter than the " + std::to_string(kPacketTrailerBytes) + "-byte authentication trailer";
  }
  if (drop.empty()) {
    Key key{in->peer, in->tag};
    auto posted = posted_.find(key);
    const bool matched = posted != posted_.end() && !posted->second.empty();
    // The most an authenticated packet for this receive may be: until it is checked it cannot fail the receive, so a
    // larger one is only dropped.
    const uint64_t secure_bound =
        matched && secure
            ? std::max(options_.max_packet_bytes,
                       posted->second.front()->dst ? posted->second.front()->capacity + kPacketTrailerBytes : 0)
            : 0;
    if (matched && secure && length > secure_bound) {
      drop = "over the bound of " + std::to_string(secure_bound) + " bytes per packet";
    } else if (matched) {
      std::shared_ptr<TransferState> target = posted->second.front();
      posted->second.erase(posted->second.begin());
      if (posted->second.empty()) posted_.erase(posted);
      if (secure) {
        in->target = std::move(target);  // too large for a recv_into: found out once authenticated (deliver)
        allocate_packet(*in);
      } else if (target->dst && length > target->capacity) {
        target->complete(too_big(length, target->capacity, in->peer));
        drop = "larger than the receive buffer posted for it";
      } else if (!target->dst && length > options_.max_packet_bytes) {
        drop = "over the bound of " + std::to_string(options_.max_packet_bytes) + " bytes per packet";
        target->complete(out_of_range("packet of " + std::to_string(length) + " bytes from rank " +
                                      std::to_string(in->peer) + " is " + drop));
      } else {
        in->target = std::move(target);
        in->direct = in->target->dst != nullptr;
        if (!in->direct) allocate_packet(*in);
      }
    } else {
      const Peer& p = peer_table_.at(in->peer);
      std::string over;
      if (length > options_.max_packet_bytes)
        over = "a packet of " + std::to_string(length) + " bytes, over the bound of " +
               std::to_string(options_.max_packet_bytes) + " bytes per packet";
      else if (p.unexpected_packets + 1 > options_.max_unexpected_packets)
        over = "more than " + std::to_string(options_.max_unexpected_packets) +
               " packets ahead of their receives, the bound per peer (max_unexpected_packets)";
      else if (p.unexpected_bytes + length > options_.max_unexpected_bytes)
        over = std::to_string(p.unexpected_bytes + length) + " bytes ahead of their receives, over the bound of " +
               std::to_string(options_.max_unexpected_bytes) + " bytes per peer (max_unexpected_bytes)";
      if (over.empty()) {
        allocate_packet(*in);
        queue_unexpected(in);
      } else {
        fail_peer_locked(in->peer, "sent " + over);
        drop = "its sender went over a bound: sent " + over;
      }
    }
  }
  if (!drop.empty()) {
    in->discard = true;
    note_drop(in->peer, length, drop);
  }
  if (auth_failure) auth_failures_ += 1;
}

void UcxDataPlane::on_recv_done(void* request, ucs_status_t status, size_t, void* user) {
  auto* raw = static_cast<Inbound*>(user);
  if (request) ucp_request_free(request);
  UcxDataPlane* self = raw->plane;
  auto it = self->inbound_in_flight_.find(raw);
  if (it == self->inbound_in_flight_.end()) return;
  std::shared_ptr<Inbound> in = it->second;
  self->inbound_in_flight_.erase(it);
  self->finish_inbound(in, status);
}

void UcxDataPlane::finish_inbound(const std::shared_ptr<Inbound>& in, ucs_status_t status) {
  in->done = true;
  in->status = status;
  in->finished = Clock::now();
  if (in->discard) return;
  if (status == UCS_OK && protection_.load() != PacketProtection::kNone) {
    std::string bad = open_inbound(*in);
    if (!bad.empty()) return refuse_inbound(in, bad);
  }
  if (in->target) {
    auto target = std::move(in->target);
    if (in->aborted) return target->complete(*in->aborted);  // UCX has let go of the caller's buffer only now
    deliver(in, target);
  }
}

// ---- the relay: packets of peers that cannot be reached directly (relay.h has the protocol) ----

Status UcxDataPlane::use_relay(const RelayClientOptions& options, const std::set<int>& peers) {
  if (rank_.load() < 0) return invalid_argument("use_relay() before connect()");
  if (peers.empty()) return Status::Ok();
  if (!relay_) {
    ZmqLoop::Options lo;
    lo.socket_type = ZMQ_DEALER;
    lo.endpoint = options.endpoint;
    lo.curve = options.curve;
    lo.max_message_bytes = int64_t(RelayOptions{}.max_message_bytes + 64);
    auto loop = ZmqLoop::start(lo, [this](Frames&& f) { on_relay_message(std::move(f)); }, [] {});
    if (!loop.ok()) return Status(loop.status()).prepend("the relay at " + options.endpoint);
    relay_ = std::move(loop).value();
    const std::string& t = options.token;
    relay_->send({Bytes(kRelayHello, kRelayHello + std::strlen(kRelayHello)), relay_u32(uint32_t(rank_.load())),
                  Bytes(t.begin(), t.end())});
    Status welcomed = Status::Ok();
    {
      std::unique_lock<std::mutex> lock(relay_mu_);
      if (!relay_cv_.wait_for(lock, options.timeout, [&] { return relay_answer_.has_value(); }))
        welcomed = unavailable("the relay at " + options.endpoint + " did not answer within " +
                               std::to_string(options.timeout.count()) + " ms (is its port open to this worker?)");
      else if (!relay_answer_->empty())
        welcomed = unavailable("the relay at " + options.endpoint + " refused this worker: " + *relay_answer_);
    }
    if (!welcomed.ok()) {
      // Not connected: a later call says hello again (it used to find the refused connection and take it as bound).
      relay_.reset();  // its loop thread is joined: no answer arrives after this
      std::lock_guard<std::mutex> lock(relay_mu_);
      relay_answer_.reset();
      return welcomed;
    }
  }
  LH_RETURN_IF_ERROR(run_on_progress([&]() -> Status {
    for (int r : peers)
      if (!peer_table_.count(r)) return invalid_argument("relay for rank " + std::to_string(r) + ", not in the plan");
    for (int r : peers) {
      Peer& p = peer_table_[r];
      force_close(p.ep);  // what UCX still held for it fails
      p.relayed = true;
      p.failed = false;  // a direct attempt that failed is not the relayed link's failure
      p.why.clear();
    }
    return Status::Ok();
  }));
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    relayed_.insert(peers.begin(), peers.end());
  }
  LH_LOG_INFO("rank {}: {} peer{} relayed through {}", rank_.load(), peers.size(), peers.size() == 1 ? "" : "s",
              options.endpoint);
  return Status::Ok();
}

std::set<int> UcxDataPlane::relayed_peers() const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  return relayed_;
}

void UcxDataPlane::on_relay_message(Frames&& f) {
  if (!f.empty() && (relay_frame_is(f[0], kRelayWelcome) || relay_frame_is(f[0], kRelayRefused))) {
    std::lock_guard<std::mutex> lock(relay_mu_);
    if (!relay_answer_)
      relay_answer_ = relay_frame_is(f[0], kRelayWelcome)
                          ? std::string()
                          : (f.size() > 1 ? std::string(f[1].begin(), f[1].end()) : std::string("no reason given"));
    relay_cv_.notify_all();
    return;
  }
  const bool last = !f.empty() && relay_frame_is(f[0], kRelayData);
  const bool part = !f.empty() && relay_frame_is(f[0], kRelayFragment);
  auto src = f.size() == 4 && (last || part) ? relay_read_u32(f[1]) : std::nullopt;
  auto tag = f.size() == 4 ? relay_read_u64(f[2]) : std::nullopt;
  if (!src || !tag) {
    dropped_ += 1;
    LH_LOG_WARN("data plane: dropping a malformed message from the relay ({} frames)", f.size());
    return;
  }
  // A packet in parts: its parts come one after another from one sender, the last as "data".
  auto partial = relay_partial_.find(int(*src));
  if (partial != relay_partial_.end() || part) {
    RelayPartial& p = relay_partial_[int(*src)];
    std::string bad;
    if (!p.bytes.empty() && p.tag != *tag)
      bad = "a part under another tag before the packet before it ended";
    else if (p.bytes.size() + f[3].size() > options_.max_packet_bytes)
      bad = "a packet in parts over the bound of " + std::to_string(options_.max_packet_bytes) + " bytes";
    if (!bad.empty()) {
      dropped_ += 1;
      LH_LOG_WARN("data plane: dropping a packet from rank {} through the relay: {}", *src, bad);
      relay_partial_.erase(int(*src));
      return;
    }
    p.tag = *tag;
    p.bytes.insert(p.bytes.end(), f[3].begin(), f[3].end());
    if (part) return;
    f[3] = std::move(p.bytes);
    relay_partial_.erase(int(*src));
  }
  post([this, src = int(*src), tag = *tag, payload = std::move(f[3])]() mutable {
    relay_inbound(src, tag, std::move(payload));
  });
}

void UcxDataPlane::relay_inbound(int src, uint64_t tag_bits, Bytes&& payload) {
  auto in = std::make_shared<Inbound>();
  in->plane = this;
  in->arrived = Clock::now();
  in->peer = src;
  in->tag = tag_bits & kTagMask;
  in->length = payload.size();
  // Taken from any rank of the plan: the relay vouches for the sender's rank (its hello carried that rank's token), and
  // a peer may switch to the relay a moment before this plane does.
  admit_inbound(in);
  if (in->discard) return;
  const uint64_t n = in->length;
  Status copied = Status::Ok();
  if (in->direct && n) {
    if (in->target->memory == Device::cpu)
      std::memcpy(in->target->dst, payload.data(), n);
    else
      copied = copy_bytes(in->target->dst, in->target->memory, payload.data(), Device::cpu, n);
  } else if (n) {
    std::memcpy(in->bytes.data(), payload.data(), n);
  }
  if (!copied.ok() && in->target) {
    in->target->complete(copied);
    in->target.reset();
    in->discard = true;
  }
  finish_inbound(in, UCS_OK);
}

void UcxDataPlane::relay_send(const std::shared_ptr<TransferState>& st) {
  const uint8_t* data = st->data;
  Bytes host;
  if (st->size && st->memory != Device::cpu) {
    host.resize(st->size);
    Status s = copy_bytes(host.data(), Device::cpu, st->data, st->memory, st->size);
    if (!s.ok()) return st->complete(s);
    data = host.data();
  }
  // In parts, so the relay forwards the first while the rest is on its way (relay.h).
  uint64_t off = 0;
  do {
    const uint64_t n = std::min(kRelayFragmentBytes, st->size - off);
    const char* kind = off + n < st->size ? kRelayFragment : kRelayData;
    relay_->send({Bytes(kind, kind + std::strlen(kind)), relay_u32(uint32_t(st->peer)), relay_u64(st->tag.pack()),
                  Bytes(data + off, data + off + n)});
    off += n;
  } while (off < st->size);
  st->complete(Status::Ok());
}

}  // namespace lh
