// The DataPlane front half shared by all implementations: state creation, metering and blocking helpers.
// Used through UcxDataPlane and LinkShaper.
#include "transport/data_plane.h"

namespace lh {

std::shared_ptr<TransferState> DataPlane::make_state(Direction dir, int peer, Tag tag, uint64_t raw_bytes) {
  auto st = std::make_shared<TransferState>();
  st->direction = dir;
  st->peer = peer;
  st->tag = tag;
  st->raw_bytes = raw_bytes;
  st->t_start = Clock::now();
  // A meter handed over before the plan was known (e.g. by a LinkShaper) learns its rank here.
  if (meter_ && meter_->self_rank() < 0 && rank() >= 0) meter_->set_self_rank(rank());
  if (meter_) {
    std::shared_ptr<LinkMeter> m = meter_;
    st->on_done([m](TransferState& t) {
      if (!t.status.ok()) return;
      if (t.raw_bytes == 0) t.raw_bytes = t.wire_bytes;
      m->record(t);
    });
  }
  return st;
}

Transfer DataPlane::send(int peer, Tag tag, Bytes packet, uint64_t raw_bytes) {
  auto st = make_state(Direction::kSend, peer, tag, raw_bytes);
  st->owned = std::move(packet);
  st->data = st->owned.data();
  st->size = st->owned.size();
  st->wire_bytes = st->size;
  Transfer t(st);
  start_send(std::move(st));
  return t;
}

Transfer DataPlane::send_view(int peer, Tag tag, const void* data, uint64_t size, uint64_t raw_bytes) {
  auto st = make_state(Direction::kSend, peer, tag, raw_bytes);
  st->data = static_cast<const uint8_t*>(data);
  st->size = size;
  st->wire_bytes = size;
  Transfer t(st);
  start_send(std::move(st));
  return t;
}

Transfer DataPlane::recv(int peer, Tag tag, uint64_t raw_bytes) {
  auto st = make_state(Direction::kRecv, peer, tag, raw_bytes);
  Transfer t(st);
  start_recv(std::move(st));
  return t;
}

Transfer DataPlane::recv_into(int peer, Tag tag, void* dst, uint64_t capacity, uint64_t raw_bytes) {
  auto st = make_state(Direction::kRecv, peer, tag, raw_bytes);
  st->dst = static_cast<uint8_t*>(dst);
  st->capacity = capacity;
  Transfer t(st);
  start_recv(std::move(st));
  return t;
}

Status DataPlane::send_blocking(int peer, Tag tag, Bytes packet, uint64_t raw_bytes,
                                std::chrono::milliseconds timeout) {
  return send(peer, tag, std::move(packet), raw_bytes).wait(timeout);
}

Result<Bytes> DataPlane::recv_blocking(int peer, Tag tag, std::chrono::milliseconds timeout, uint64_t raw_bytes) {
  Transfer t = recv(peer, tag, raw_bytes);
  LH_RETURN_IF_ERROR(t.wait(timeout));
  return t.take();
}

}  // namespace lh
