// UcxDataPlane: the relay fallback, packets of peers that cannot be reached directly (relay.h has the protocol).
// See ucx_data_plane.cpp.
#include <cstring>

#include "core/log.h"
#include "core/tensor.h"
#include "transport/relay.h"
#include "transport/ucx_data_plane_internal.h"

namespace lh {
using namespace ucx_internal;

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
    auto loop = ZmqLoop::start(
        lo, [this](Frames&& f) { on_relay_message(std::move(f)); }, [] {});
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
