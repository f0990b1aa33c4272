// UcxDataPlane: sending and receiving packets, the wire header's checks and our matching by (peer, tag), the
// unexpected-packet queue and its bounds. See ucx_data_plane.cpp.
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
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
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
  ucs_status_ptr_t r =
      ucp_am_send_nbx(it->second.ep, kPacketAm, ctx.header.data(), ctx.header.size(), buf, st->size, &p);
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
    return "a replay: packet " + std::to_string(h.packet.seq) +
           " from this rank was seen before or is too old (newest " + std::to_string(pc->window.newest()) + ")";
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
    return refuse(sender,
                  "its header announces " + std::to_string(h->length) + " bytes, " + std::to_string(length) + " came");
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
  void* buf = !length      ? static_cast<void*>(&g_empty_byte)
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

}  // namespace lh
