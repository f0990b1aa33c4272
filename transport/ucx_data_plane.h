// defines: lh::UcxDataPlane (the DataPlane over UCX active messages, one UCP context and worker per process,
// progressed by its own thread that sleeps on the worker's event fd when idle), and ErrorDomain<ucs_status_t> for
// LH_CHECK_CODE. Used by workers, `bench link` and tests.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "transport/data_plane.h"
#include "transport/packet_auth.h"
#include "transport/worker_address.h"
#include "transport/zmq_loop.h"

namespace lh {

template <>
struct ErrorDomain<ucs_status_t> {
  static bool ok(ucs_status_t s) { return s == UCS_OK; }
  static const char* name() { return "UCX"; }
  static std::string describe(ucs_status_t s) { return ucs_status_string(s); }
  static StatusCode status_code(ucs_status_t) { return StatusCode::kUnavailable; }
};

// "LO-HI" (1 ≤ LO ≤ HI ≤ 65535) as its two ports, or InvalidArgument saying what is wrong.
Result<std::pair<int, int>> parse_port_range(const std::string& text);
// The IP addresses of this host's interfaces that are up, as "10.1.0.5, fe80::1" (only those of `net_devices`, a UCX
// device list such as "eth0,lo", when it is not empty; loopback only when nothing else is up or it is named).
std::string interface_addresses(const std::string& net_devices = "");

struct UcxOptions {
  // UCX transports ("tcp", "shm,tcp", "rc,cuda_copy" …). Empty: the UCX_TLS environment variable, or
  // UCX's own choice when that is unset.
  std::string tls;
  // Network devices UCX may use ("lo", "eth0", "mlx5_0:1" …). Empty: UCX_NET_DEVICES or all. Tests
  // pin "lo": an interface that vanishes mid-run (another test's namespace bridge) would strand a lane.
  std::string net_devices;
  // UCP peer-failure handling on endpoints: a dead peer fails transfers quickly on its own, but UCX 1.13
  // then limits itself to transports that support it (tcp, not shared memory/CMA). Off: shared memory
  // is used between processes on one host, and a dead peer is failed through fail_peer() when the
  // control plane reports it.
  bool peer_error_handling = true;
  // The progress thread polls while transfers are in flight and this long after the last activity;
  // otherwise it sleeps on the worker's event fd (no core spent when idle). 0: sleep at once.
  std::chrono::microseconds poll_after_activity{200};
  // How long closing waits for in-flight sends to flush before cutting endpoints.
  std::chrono::milliseconds close_timeout{2000};
  // CUDA memory (DataPlane::send_device / recv_into_device) always goes through pinned host staging, even
  // when UCX could move it directly (for tests of the staged path, or a UCX whose CUDA transport misbehaves).
  bool force_device_staging = false;
  // "LO-HI": the TCP ports UCX's tcp transport listens on (UCX_TCP_PORT_RANGE; one port per interface it uses), so a
  // firewall can open exactly these. Empty: any free port (or the environment's UCX_TCP_PORT_RANGE).
  std::string data_ports;
  // HOST (a DNS name or IPv4 address) that peers should connect to instead of the interfaces' own addresses in the
  // UCX worker address: the plane opens a UCX listener (client–server mode) on a port of data_ports (any free port
  // when that is empty) on all IPv4 interfaces, and its address envelope names HOST and that port; peers create
  // their endpoints to it from the socket address. UCX then connects its data lanes itself.
  std::string advertise;
  // The IPv4 address of this host's interface the listener binds (and UCX's network devices are narrowed to, unless
  // net_devices or UCX_NET_DEVICES names them): for an advertised address that is not on this host (NAT, port
  // forwarding). Empty: the advertised address's own interface when it is local, else every interface (logged).
  std::string data_bind;
  // A worker that must expose nothing (--relay-only): UCX gets only its `self` transport, so the plane opens no socket
  // at all; connect() makes no endpoints, and every peer's transfers fail (named) until use_relay() routes them through
  // the relay (the pre-flight finds every pair unreachable and does so). tls, advertise and data_ports must be empty.
  bool relay_only = false;
  // Connections the listener accepted whose peer has not yet proven its rank (an authenticated hello or packet on
  // them): at most this many at once (further ones are refused), each closed when unproven this long.
  int max_unproven_connections = 16;
  std::chrono::milliseconds unproven_timeout{15000};
  // Bounds on what a peer can make this plane hold (a peer that is buggy or not ours must not exhaust
  // memory). The largest packet the plane allocates a buffer for (a recv(), or a packet that arrived before
  // its receive); a recv_into receives up to its own capacity whatever this says. A larger packet is dropped
  // without being stored: a recv() it matches fails with OutOfRange, and one that arrived unexpected fails
  // its sender.
  uint64_t max_packet_bytes = kDefaultMaxPacketBytes;
  // Packets that arrived before their receive was posted, per peer: a peer that would go over either
  // bound is failed (fail_peer, the reason names the bound) and its queued packets are dropped.
  uint64_t max_unexpected_bytes = kDefaultMaxUnexpectedBytes;
  uint64_t max_unexpected_packets = kDefaultMaxUnexpectedPackets;
  static constexpr uint64_t kDefaultMaxPacketBytes = uint64_t(16) << 30;
  static constexpr uint64_t kDefaultMaxUnexpectedBytes = uint64_t(16) << 30;
  static constexpr uint64_t kDefaultMaxUnexpectedPackets = 4096;
  // Largest rank that fits the wire tag (12 bits).
  static constexpr int kMaxRank = 4095;
};

// How a plane protects its packets, and the peers' data-plane keys (from the Plan).
struct DataPlaneSecurity {
  PacketProtection protection = PacketProtection::kNone;
  uint32_t epoch = 0;  // the plan's epoch: a packet sealed under another is refused as a replay
  struct Peer {
    std::array<uint8_t, DataKeyPair::kBytes> public_key{};
    uint32_t ciphers = 0;  // local_ciphers() of the peer's machine
  };
  std::map<int, Peer> peers;  // every rank connect() is given
};

// Where a plane finds the job's relay (transport/relay.h) for the peers it cannot reach directly.
struct RelayClientOptions {
  std::string endpoint;                 // "tcp://HOST:PORT"
  std::string token;                    // this rank's relay token (Plan::relay_token), or the join token
  std::optional<ZmqLoop::Curve> curve;  // the job's client keys, when the relay (like the control socket) uses CURVE
  std::chrono::milliseconds timeout{10000};  // how long to wait for the relay's welcome
};

class UcxDataPlane final : public DataPlane {
 public:
  static Result<std::unique_ptr<UcxDataPlane>> create(const UcxOptions& options = {});
  ~UcxDataPlane() override;

  // This worker's address envelope: put it in the Join message.
  const Bytes& address() const { return address_; }
  // The port of the listener --advertise opened (0 without one), the address it is bound to ("0.0.0.0" for every
  // interface), and the endpoints it has accepted so far.
  int listen_port() const { return listen_port_; }
  const std::string& listen_address() const { return listen_address_; }
  uint64_t accepted_connections() const { return accepted_count_.load(); }
  // Of those: connections refused because max_unproven_connections were open, and connections closed because they
  // proved no rank within unproven_timeout.
  uint64_t refused_connections() const { return refused_count_.load(); }
  uint64_t unproven_closed() const { return unproven_closed_.load(); }
  // The bounds of UcxOptions (max_packet_bytes, max_unexpected_bytes), changed on a running plane: a worker sets those
  // its job implies once it has the plan. Packets already held are not affected.
  void set_bounds(uint64_t max_packet_bytes, uint64_t max_unexpected_bytes);
  // This plane's data-plane public key (made fresh with the plane): put it in the Join too.
  const std::array<uint8_t, DataKeyPair::kBytes>& data_public_key() const { return data_keys_.public_key; }
  // Joins the plan: this process is `self_rank`; `peers` maps every other rank (self may be included)
  // to its address envelope from the Plan. Endpoints are created now; packets from ranks outside
  // `peers` are dropped and logged from then on, as are packets sealed in another epoch than `security.epoch` (with
  // any protection). Call before the plan's start barrier. Calling it again replaces the peer set (transfers with
  // removed peers fail); reset() first to start a new plan on a clean plane.
  //
  // With `security.protection` other than kNone every packet carries a 32-byte trailer (packet_auth.h) sealed with
  // the pair's own keys, derived from this plane's key pair and the peer's public key in `security.peers`: a packet
  // whose tag does not verify, sealed under another epoch, or seen before, is dropped and counted
  // (auth_failures()) and never completes a receive: the receive it had matched waits for the next packet. Such
  // a plane stages CUDA memory through host memory (the tag is computed on the host). Every connect() of a plane
  // must use the same protection.
  Status connect(int self_rank, const std::map<int, Bytes>& peers, const DataPlaneSecurity& security = {});

  // Ends the current plan on a plane that is kept for the next one (a worker keeps one UCX worker for its whole life,
  // so a rollback runs none of UCX's worker teardown, and its address and listener stay the same). Every pending
  // transfer fails with `reason`, packets waiting for a receive are dropped, the endpoints (made and accepted) and the
  // relay connection are closed, and the plane has no rank, keys or peers until the next connect(): packets that come
  // meanwhile are dropped (a hello on an accepted connection is kept and checked then, as on a new plane). Returns
  // once UCX has let go of every caller's buffer (at most options.close_timeout; longer is logged), so they may be
  // freed. The data key pair is made afresh: put the new data_public_key() in the next Join. Nothing happens to a plane
  // that was never connected, except the new key pair. Not on the plane's own thread.
  void reset(const std::string& reason);
  // How many times reset() ended a plan (for logs and tests).
  uint64_t resets() const { return resets_.load(); }

  // Sends and receives packets of `peers` (ranks of the plan) through the relay instead of UCX from now on: their
  // endpoints are closed (transfers UCX still held fail), and what arrives from the relay under their ranks is matched,
  // bounded and authenticated like UCX packets. Connects to the relay on the first call (a hello with this plane's
  // rank; the relay's refusal or silence within options.timeout is an error naming it). After connect().
  Status use_relay(const RelayClientOptions& options, const std::set<int>& peers);
  // The peers whose packets go through the relay.
  std::set<int> relayed_peers() const;

  // Tests only: sends `packet` to `peer` under exactly `header` (made with write_wire_header, or not): what anyone who
  // reaches the peer's data plane could send, with the pair's keys or without them.
  Transfer send_raw_for_tests(int peer, const std::array<uint8_t, kWireHeaderBytes>& header, Bytes packet);

  int rank() const override { return rank_.load(); }
  std::vector<int> peers() const override;
  void fail_peer(int peer, const std::string& reason) override;

  // Packets thrown away unread: from ranks outside the plan or failed, with a malformed header or tag, too large for
  // their receive or over a bound. None of them costs a buffer of its length. Logged at a bounded rate.
  uint64_t dropped_packets() const { return dropped_.load(); }
  // Of those, packets refused by authentication: a header or trailer whose MAC did not verify (forged, altered, or
  // claiming another sender), a malformed header, a replay, or another epoch's packet. A header is checked before its
  // packet's bytes are received: such a packet is never fetched (rendezvous) or kept (eager).
  uint64_t auth_failures() const { return auth_failures_.load(); }
  PacketProtection protection() const { return protection_.load(); }
  // Packets (and their bytes) that arrived before their receive and wait in the plane, all peers together.
  uint64_t unexpected_packets() const { return unexpected_packets_.load(); }
  uint64_t unexpected_bytes() const { return unexpected_bytes_.load(); }
  // The most bytes the plane has held at once in buffers it allocated for packets (not the callers' own
  // recv_into buffers), for tests and logs: a dropped packet never shows here.
  uint64_t packet_buffer_bytes_peak() const { return buffer_bytes_peak_.load(); }
  // The transports UCX chose, as "tcp" / "posix,sysv,cma,tcp"… (for logs and the bench).
  const std::string& transports() const { return tls_in_use_; }
  // Whether this UCX context handles CUDA memory (UCP_ATTR_FIELD_MEMORY_TYPES has UCS_MEMORY_TYPE_CUDA;
  // Debian's UCX has no CUDA support, so there it is false).
  bool ucx_supports_cuda_memory() const { return ucx_cuda_memory_; }
  // CUDA memory goes to UCX directly in a CUDA build whose UCX supports it, unless force_device_staging.
  bool device_memory_direct(Device device) const override {
    return device == Device::cpu ||
           (device == Device::cuda && cuda_direct_ && protection_.load() == PacketProtection::kNone);
  }

 protected:
  void start_send(std::shared_ptr<TransferState> st) override;
  void start_recv(std::shared_ptr<TransferState> st) override;

 private:
  struct Inbound;
  struct AdvertisedPeer;
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::string advertised;  // "advertised HOST:PORT" when the endpoint was made to the peer's advertised address
    bool relayed = false;  // packets go through relay_, not ep
    bool delivered = false;  // a send on ep has completed (the endpoint is connected)
    bool failed = false;
    std::string why;
    uint64_t unexpected_bytes = 0, unexpected_packets = 0;  // its packets queued in unexpected_
  };
  using Key = std::pair<int, uint64_t>;  // peer, packed tag

  UcxDataPlane() = default;
  Status init(const UcxOptions& options);
  // init's steps, in order.
  Status take_options(const UcxOptions& options);
  Status check_advertised_address();
  Status create_context();
  Status create_worker();
  Status make_address();
  Status start_progress_thread();
  // Runs `fn` on the progress thread (which owns every UCX object) and waits for its status.
  Status run_on_progress(std::function<Status()> fn);
  void post(std::function<void()> fn);
  void wake();
  void progress_loop();
  // A packet's active message (UCX calls it from ucp_worker_progress): its header is checked first.
  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param);
  ucs_status_t take_am(const void* header, size_t header_length, void* data, size_t length,
                       const ucp_am_recv_param_t* param);
  // Why the header `bytes` (from `sender`) does not authenticate, or "" (and, when `accept`, its sequence number is
  // recorded: a hello). `keyless` is set when the plane has no keys for the sender yet (not connected to it), or has
  // none at all and the packet is of another epoch: dropped, but no authentication failed.
  std::string check_header(const WireHeader& h, const uint8_t* bytes, bool accept, bool* keyless);
  std::string epoch_mismatch(uint32_t epoch) const;  // why a header of another plan's epoch is refused
  // A connection the listener accepted proved to be `rank`'s (an authenticated packet or hello came on it).
  void prove_connection(ucp_ep_h ep, int rank);
  // Closes accepted connections unproven for longer than options_.unproven_timeout (progress thread).
  void expire_unproven(Clock::time_point now);
  // Re-checks hellos that came before connect() gave the plane their senders' keys.
  void recheck_hellos();
  void send_hello(int peer);
  // connect()'s steps: the peers' addresses (resolving advertised ones), the pairs' keys, the endpoints.
  static Status read_peer_addresses(int self_rank, const std::map<int, Bytes>& peers, std::map<int, Bytes>* raw,
                                    std::map<int, AdvertisedPeer>* advertised);
  static AdvertisedPeer resolve_advertised(const PeerAddress& a);
  struct PeerCrypto;
  Result<std::map<int, std::shared_ptr<PeerCrypto>>> derive_pair_keys(int self_rank, const std::map<int, Bytes>& raw,
                                                                      const DataPlaneSecurity& security);
  Status open_endpoints(int self_rank, const std::map<int, Bytes>& raw,
                        const std::map<int, AdvertisedPeer>& advertised);
  Peer open_endpoint(int r, const Bytes& addr, const std::map<int, AdvertisedPeer>& advertised);
  // Decides what becomes of a packet announced from in->peer (in->length bytes): dropped (in->discard, counted), matched
  // to a posted receive (in->target; in->direct when UCX writes into the caller's buffer) or queued unexpected, with
  // the plane's buffer allocated unless direct or dropped.
  void admit_inbound(const std::shared_ptr<Inbound>& in);
  // Once the packet's bytes are in place: authenticates it and delivers it to its receive, if it has one yet.
  void finish_inbound(const std::shared_ptr<Inbound>& in, ucs_status_t status);
  // A packet the relay brought (progress thread).
  void relay_inbound(int src, uint64_t tag_bits, Bytes&& payload);
  void relay_send(const std::shared_ptr<TransferState>& st);
  void on_relay_message(Frames&& f);  // the relay client's thread
  // `wire_rank` ≥ 0: the sender rank the packet claims (fault injection only); `flags`: the header's (kWireHello);
  // `given`: the header to send instead (send_raw_for_tests).
  void issue_send(const std::shared_ptr<TransferState>& st, int wire_rank = -1, uint8_t flags = 0,
                  const std::array<uint8_t, kWireHeaderBytes>* given = nullptr);
  void forge_for_tests(const std::shared_ptr<TransferState>& st);  // LH_FAULT_FORGE (ucx_data_plane.cpp)
  void issue_recv(const std::shared_ptr<TransferState>& st);
  // Matches a receive to a packet waiting for it, or queues it (at the front: a receive whose packet was refused).
  void match_recv(const std::shared_ptr<TransferState>& st, bool first);
  void deliver(const std::shared_ptr<Inbound>& in, const std::shared_ptr<TransferState>& st);
  // Why a packet from `peer` with these tag bits is not for us, or "" (probe_inbound).
  std::string drop_reason(int peer, uint64_t tag_bits);
  void note_drop(int peer, uint64_t length, const std::string& why);
  void allocate_packet(Inbound& in);
  // Fails every receive still waiting for its packet with `why`, and drops every packet still waiting for its receive.
  void drop_waiting(const Status& why);
  void queue_unexpected(const std::shared_ptr<Inbound>& in);
  void unqueue_unexpected(Inbound& in);
  // Fails the receives fail_peer left to UCX (writing into the caller's buffer) that are still unfinished
  // kAbandonAfter later: their sender died mid-packet.
  static constexpr std::chrono::milliseconds kAbandonAfter{2000};
  void release_abandoned_receives(std::chrono::steady_clock::time_point now);
  // Authenticated planes: seals a send's packet (on the caller's thread, so sealing overlaps the progress thread's
  // work), and checks a packet that has arrived (progress thread; a failure drops it and re-posts its receive).
  struct PeerCrypto {
    std::array<uint8_t, DataKeyPair::kBytes> public_key{};
    PacketKeys keys;
    std::atomic<uint64_t> next_seq{0};
    ReplayWindow window;  // progress thread only
  };
  std::shared_ptr<PeerCrypto> crypto_of(int peer) const;
  Status seal_outgoing(TransferState& st);
  std::string open_inbound(Inbound& in);  // "" when the packet is authentic
  void refuse_inbound(const std::shared_ptr<Inbound>& in, const std::string& why);
  void fail_peer_locked(int peer, const std::string& reason);
  // Force-closes the endpoint, if any, and clears it (progress thread).
  void force_close(ucp_ep_h& ep);
  void close_endpoints();
  Status send_failed(int peer, ucs_status_t status) const;  // names the peer's advertised address, if any
  static void on_send_done(void* request, ucs_status_t status, void* user);
  static void on_recv_done(void* request, ucs_status_t status, size_t length, void* user);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // The listener's connection requests (a peer's endpoint to our advertised address), and errors on the endpoints
  // accepted from them.
  static void on_conn_request(ucp_conn_request_h request, void* arg);
  static void on_accepted_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  Status open_listener();
  // Chooses the listener's address (data_bind, the advertised address's interface, or every interface) and, when it
  // is one interface's, that interface's name (init, before UCX reads its devices).
  Status choose_listen_address();

  UcxOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int ucx_fd_ = -1, wake_fd_ = -1, epoll_fd_ = -1;
  Bytes address_;
  ucp_listener_h listener_ = nullptr;  // --advertise only
  int listen_port_ = 0;
  std::string listen_address_, listen_interface_;  // choose_listen_address
  uint32_t listen_in_addr_ = 0;                    // network order; INADDR_ANY for every interface
  struct Accepted {
    Clock::time_point at{};
    std::string from;     // "IP:PORT" of the peer
    int rank = -1;        // proven: the rank whose authenticated packet came on it; −1 until then
    Bytes early_hello;    // a hello that came before connect() gave its sender's keys (checked again then)
  };
  std::map<ucp_ep_h, Accepted> accepted_;  // endpoints accepted by the listener (progress thread)
  std::atomic<uint64_t> accepted_count_{0}, refused_count_{0}, unproven_closed_{0}, resets_{0};
  Clock::time_point next_expiry_check_{};
  bool in_callback_ = false;        // inside a UCX callback: endpoints are closed after it (force_close)
  std::vector<ucp_ep_h> to_close_;  // endpoints force_close was asked for inside a callback
  std::string tls_in_use_;
  bool ucx_cuda_memory_ = false;
  bool cuda_direct_ = false;
  std::atomic<int> rank_{-1};
  std::atomic<uint64_t> dropped_{0}, auth_failures_{0};
  DataKeyPair data_keys_;
  std::atomic<PacketProtection> protection_{PacketProtection::kNone};
  std::atomic<uint32_t> epoch_{0};
  mutable std::mutex crypto_mu_;  // guards crypto_ (read by senders' threads, replaced by connect)
  std::map<int, std::shared_ptr<PeerCrypto>> crypto_;
  std::atomic<uint64_t> unexpected_packets_{0}, unexpected_bytes_{0};
  std::atomic<uint64_t> buffer_bytes_{0}, buffer_bytes_peak_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::mutex cmd_mu_;
  std::vector<std::function<void()>> commands_;
  mutable std::mutex peers_mu_;  // guards peer_ranks_ for peers() from other threads
  std::vector<int> peer_ranks_;

  // Owned by the progress thread.
  std::map<int, Peer> peer_table_;
  std::map<Key, std::vector<std::shared_ptr<TransferState>>> posted_;  // receives waiting for a packet
  std::map<Key, std::vector<std::shared_ptr<Inbound>>> unexpected_;    // packets waiting for a receive
  struct SendCtx {
    UcxDataPlane* plane;
    std::shared_ptr<TransferState> st;
    std::array<uint8_t, kWireHeaderBytes> header{};  // UCX reads it until the send completes
  };
  std::map<TransferState*, SendCtx> sends_in_flight_;  // user_data of a UCX send points at its SendCtx
  std::vector<void*> closing_;                         // force-close requests of failed endpoints
  std::map<Inbound*, std::shared_ptr<Inbound>> inbound_in_flight_;
  Clock::time_point next_drop_log_{};  // drops are logged at most once a second after the first few
  uint64_t drops_logged_ = 0, drops_unlogged_ = 0;
  Bytes forge_replay_;  // LH_FAULT_FORGE: the packet it replays, to whom, under which tag
  int forge_replay_peer_ = -1;
  Tag forge_replay_tag_;
  bool forge_done_ = false;

  // The relay connection (use_relay), its answer to the hello, and the relayed peers (for relayed_peers()).
  std::unique_ptr<ZmqLoop> relay_;
  std::mutex relay_mu_;
  std::condition_variable relay_cv_;
  std::optional<std::string> relay_answer_;  // "" welcome, else the refusal
  std::set<int> relayed_;                    // guarded by peers_mu_
  // Parts of packets from the relay waiting for their last part, per sender (the relay client's thread only).
  struct RelayPartial {
    uint64_t tag = 0;
    Bytes bytes;
  };
  std::map<int, RelayPartial> relay_partial_;
};

}  // namespace lh
