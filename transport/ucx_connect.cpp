// UcxDataPlane: connecting to the plan's peers (endpoints, hellos), failing a peer, reset. See ucx_data_plane.cpp.
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

// A peer that advertises an address: its socket address, resolved on the caller's thread (not on the progress thread:
// a DNS lookup may take seconds), or why it could not be.
struct UcxDataPlane::AdvertisedPeer {
  std::string name;  // "advertised HOST:PORT"
  sockaddr_storage addr{};
  socklen_t addrlen = 0;
  std::string error;
};

Status UcxDataPlane::connect(int self_rank, const std::map<int, Bytes>& peers, const DataPlaneSecurity& security) {
  if (self_rank < 0 || self_rank > UcxOptions::kMaxRank)
    return invalid_argument("rank " + std::to_string(self_rank) + " outside [0, " +
                            std::to_string(UcxOptions::kMaxRank) + "]");
  std::map<int, Bytes> raw;
  std::map<int, AdvertisedPeer> advertised;
  LH_RETURN_IF_ERROR(read_peer_addresses(self_rank, peers, &raw, &advertised));
  LH_ASSIGN_OR_RETURN(auto crypto, derive_pair_keys(self_rank, raw, security));
  {
    std::lock_guard<std::mutex> lock(crypto_mu_);
    crypto_ = std::move(crypto);
    protection_ = security.protection;
    epoch_ = security.epoch;
  }
  LH_RETURN_IF_ERROR(run_on_progress([&]() -> Status { return open_endpoints(self_rank, raw, advertised); }));
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

// connect()'s first step: each peer's UCX worker address from its envelope (`raw`), and for those that advertise an
// address, that address resolved.
Status UcxDataPlane::read_peer_addresses(int self_rank, const std::map<int, Bytes>& peers, std::map<int, Bytes>* raw,
                                         std::map<int, AdvertisedPeer>* advertised) {
  for (const auto& [r, env] : peers) {
    if (r < 0 || r > UcxOptions::kMaxRank) return invalid_argument("peer rank " + std::to_string(r) + " out of range");
    auto a = unwrap_peer_address(env);
    if (!a.ok()) return Status(a.status()).prepend("address of rank " + std::to_string(r));
    if (!a->host.empty() && r != self_rank) (*advertised)[r] = resolve_advertised(*a);
    (*raw)[r] = std::move(a->worker);
  }
  return Status::Ok();
}

UcxDataPlane::AdvertisedPeer UcxDataPlane::resolve_advertised(const PeerAddress& a) {
  AdvertisedPeer ad;
  ad.name = a.describe();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &found);
  if (rc != 0 || !found) {
    ad.error = "cannot resolve its " + ad.name + ": " + gai_strerror(rc);
  } else {
    std::memcpy(&ad.addr, found->ai_addr, found->ai_addrlen);
    ad.addrlen = found->ai_addrlen;
  }
  if (found) freeaddrinfo(found);
  return ad;
}

// The pairs' keys, derived before anything changes: a bad key fails connect() as a whole.
Result<std::map<int, std::shared_ptr<UcxDataPlane::PeerCrypto>>> UcxDataPlane::derive_pair_keys(
    int self_rank, const std::map<int, Bytes>& raw, const DataPlaneSecurity& security) {
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
  return crypto;
}

// On the progress thread: forgets the peers no longer in the plan and makes an endpoint to each new or failed one.
Status UcxDataPlane::open_endpoints(int self_rank, const std::map<int, Bytes>& raw,
                                    const std::map<int, AdvertisedPeer>& advertised) {
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
    Peer p = open_endpoint(r, addr, advertised);
    const bool hello = p.ep && !p.advertised.empty();
    peer_table_[r] = p;
    // The peer's listener accepted this connection from anyone: the hello proves it is ours (on_conn_request).
    if (hello) send_hello(r);
  }
  recheck_hellos();
  return Status::Ok();
}

// An endpoint to rank `r`: to its worker address, or (client–server) to the address it advertises; a failed Peer,
// named, when it cannot be reached directly (or this plane is relay-only).
UcxDataPlane::Peer UcxDataPlane::open_endpoint(int r, const Bytes& addr,
                                               const std::map<int, AdvertisedPeer>& advertised) {
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
    return p;
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
  return p;
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

}  // namespace lh
