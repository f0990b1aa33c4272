// defines: lh::DataPlane, the interface for moving whole packets between ranks by (peer, Tag), non-blocking
// with completion handles, metered per link. Implemented by UcxDataPlane, decorated by LinkShaper; used by
// StageRunner, the TP/DP collectives, `bench link` and the transport tests.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "transport/link_meter.h"
#include "transport/tag.h"
#include "transport/transfer.h"

namespace lh {

// Usage (on any thread; transfers make progress on the plane's own thread, so compute overlaps):
//   Transfer s = plane.send(/*peer=*/1, make_tag(step, mb, Role::kActivation), std::move(packet), raw_bytes);
//   Transfer r = plane.recv(/*peer=*/0, make_tag(step, mb, Role::kActivation));
//   … compute …
//   LH_RETURN_IF_ERROR(r.wait());  Bytes packet = r.take();
// A receive matches exactly one send from `peer` with the same Tag; several packets with the same
// (peer, Tag) match receives in the order they were sent. Sends and receives may be posted in any
// order relative to each other. Packets may be from 0 bytes to several GiB.
class DataPlane {
 public:
  virtual ~DataPlane() = default;
  DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // This process's rank in the current plan (-1 before connect).
  virtual int rank() const = 0;
  // Ranks this plane can exchange packets with (the current plan's peers).
  virtual std::vector<int> peers() const = 0;
  // Fails every pending transfer with `peer` and refuses new ones, e.g. after the control plane
  // reports the peer dead. Idempotent.
  virtual void fail_peer(int peer, const std::string& reason) = 0;

  // Non-blocking send of a packet the plane takes ownership of. `raw_bytes` is what the packet
  // stands for uncompressed in fp32 (for the meter; 0 means "same as the packet").
  Transfer send(int peer, Tag tag, Bytes packet, uint64_t raw_bytes = 0);
  // Zero-copy send: the caller keeps [data, data + size) alive and unchanged until the Transfer is done.
  Transfer send_view(int peer, Tag tag, const void* data, uint64_t size, uint64_t raw_bytes = 0);
  // Non-blocking receive of the next packet from `peer` with `tag`; Transfer::take() yields it.
  // `raw_bytes` is for the meter (the receiver usually knows the shape; 0 means "same as the packet").
  Transfer recv(int peer, Tag tag, uint64_t raw_bytes = 0);
  // Receive into the caller's buffer (no allocation; zero-copy when posted before the packet arrives):
  // [dst, dst + capacity) stays valid until done; Transfer::wire_bytes() is then the packet's size.
  // A packet larger than `capacity` fails the receive with OutOfRange (and is consumed).
  Transfer recv_into(int peer, Tag tag, void* dst, uint64_t capacity, uint64_t raw_bytes = 0);

  // Device memory. Device::cpu: the same as send_view / recv_into. Device::cuda: `data`/`dst` is plain
  // cudaMalloc memory (any device; the producing stream must be synchronised before send_device). When the
  // plane moves CUDA memory itself (device_memory_direct) it goes straight to the transport; otherwise it
  // is staged through pinned host memory the plane keeps for reuse: send_device copies device→pinned before
  // it returns (the caller's buffer is free again then), and a receive copies pinned→device before its
  // Transfer completes. Without CUDA (a CPU-only build, no device) they fail with Unavailable saying why.
  Transfer send_device(int peer, Tag tag, const void* data, uint64_t size, Device device, uint64_t raw_bytes = 0);
  Transfer recv_into_device(int peer, Tag tag, void* dst, uint64_t capacity, Device device, uint64_t raw_bytes = 0);
  // Whether transfers of `device` memory go to the transport as they are (no staging). Device::cpu: true.
  virtual bool device_memory_direct(Device device) const { return device == Device::cpu; }
  // Pinned staging memory currently held for device transfers, in use or kept for reuse (for tests/logs).
  uint64_t staging_bytes() const;

  // Blocking conveniences.
  Status send_blocking(int peer, Tag tag, Bytes packet, uint64_t raw_bytes = 0,
                       std::chrono::milliseconds timeout = std::chrono::minutes(10));
  Result<Bytes> recv_blocking(int peer, Tag tag, std::chrono::milliseconds timeout = std::chrono::minutes(10),
                              uint64_t raw_bytes = 0);

  // What this plane's callers are waiting on, per peer and way (for stall detection: heartbeats carry it). Only
  // transfers pending at least `min_age`. since_progress: since a transfer with that peer last finished (either way)
  // or this one started, whichever is later.
  struct PendingLink {
    int peer = -1;
    bool send = false;
    std::chrono::milliseconds pending{0}, since_progress{0};
  };
  std::vector<PendingLink> pending_links(std::chrono::milliseconds min_age = std::chrono::milliseconds(0)) const;

  // Every finished transfer is recorded here (may be null: no metering). Set before traffic starts.
  void set_meter(std::shared_ptr<LinkMeter> meter) { meter_ = std::move(meter); }
  const std::shared_ptr<LinkMeter>& meter() const { return meter_; }

 protected:
  // Implementations start the transfer described by `st` (peer, tag, data/size for sends already
  // set; raw_bytes set) and complete it later with TransferState::complete. Receives set st->owned,
  // st->wire_bytes and may move st->t_start to the packet's arrival.
  virtual void start_send(std::shared_ptr<TransferState> st) = 0;
  virtual void start_recv(std::shared_ptr<TransferState> st) = 0;

 private:
  struct StagingPool;  // pinned host buffers for device transfers (data_plane.cpp)
  struct Tracker;      // the transfers pending, for pending_links (data_plane.cpp)
  std::shared_ptr<Tracker> tracker_;
  std::shared_ptr<TransferState> make_state(Direction dir, int peer, Tag tag, uint64_t raw_bytes);
  std::shared_ptr<StagingPool> staging();
  std::shared_ptr<LinkMeter> meter_;
  mutable std::mutex staging_mu_;
  std::shared_ptr<StagingPool> staging_;  // created on the first staged transfer; freed with the plane
};

}  // namespace lh
