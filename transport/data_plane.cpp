// The DataPlane front half shared by all implementations: state creation, metering and blocking helpers.
// Also device memory: direct where the plane moves it, else staged through pinned host buffers.
// Used through UcxDataPlane and LinkShaper.
#include "transport/data_plane.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/cuda_runtime.h"

namespace lh {

struct DataPlane::Tracker {
  std::mutex mu;
  uint64_t next = 0;
  std::map<uint64_t, std::tuple<int, bool, Clock::time_point>> pending;  // id → peer, send, start
  std::map<int, Clock::time_point> last_done;                            // per peer
};

DataPlane::DataPlane() : tracker_(std::make_shared<Tracker>()) {}

std::vector<DataPlane::PendingLink> DataPlane::pending_links(std::chrono::milliseconds min_age) const {
  const auto now = Clock::now();
  std::map<std::pair<int, bool>, Clock::time_point> oldest;
  std::lock_guard<std::mutex> lock(tracker_->mu);
  for (const auto& [id, p] : tracker_->pending) {
    const auto& [peer, send, start] = p;
    auto [it, fresh] = oldest.try_emplace({peer, send}, start);
    if (!fresh && start < it->second) it->second = start;
  }
  std::vector<PendingLink> out;
  for (const auto& [key, start] : oldest) {
    if (now - start < min_age) continue;
    auto done = tracker_->last_done.find(key.first);
    const auto moved = done == tracker_->last_done.end() ? start : std::max(start, done->second);
    out.push_back({key.first, key.second, std::chrono::duration_cast<std::chrono::milliseconds>(now - start),
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - moved)});
  }
  return out;
}

std::shared_ptr<TransferState> DataPlane::make_state(Direction dir, int peer, Tag tag, uint64_t raw_bytes) {
  auto st = std::make_shared<TransferState>();
  st->direction = dir;
  st->peer = peer;
  st->tag = tag;
  st->raw_bytes = raw_bytes;
  st->t_start = Clock::now();
  {
    std::shared_ptr<Tracker> tr = tracker_;
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(tr->mu);
      id = tr->next++;
      tr->pending.emplace(id, std::make_tuple(peer, dir == Direction::kSend, st->t_start));
    }
    st->on_done([tr, id, peer](TransferState&) {
      std::lock_guard<std::mutex> lock(tr->mu);
      tr->pending.erase(id);
      tr->last_done[peer] = Clock::now();
    });
  }
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

// --- Device memory --------------------------------------------------------------------------------------

// Pinned host buffers for staged device transfers. A transfer leases one for its lifetime; a buffer
// comes back for reuse when its transfer succeeded (the transport is done with it). After a failure the
// transport may still be writing into it (a receive failed under a live UCX request), so it is retired
// and freed only with the pool, which lives as long as the plane or its last staged transfer.
struct DataPlane::StagingPool {
  struct Lease {
    std::shared_ptr<StagingPool> pool;
    void* ptr = nullptr;
    uint64_t capacity = 0;
    bool reusable = false;  // set by the transfer's finish step (success only)
    ~Lease() {
      if (pool) pool->release(ptr, capacity, reusable);
    }
  };
  static constexpr size_t kKeep = 4;                // free buffers kept for reuse
  static constexpr uint64_t kMinBytes = 64u << 10;  // smallest buffer allocated
  std::mutex mu;
  std::vector<std::pair<void*, uint64_t>> free;
  std::vector<void*> retired;
  uint64_t held = 0;  // bytes allocated: free + leased + retired

  ~StagingPool() {
    for (auto& [p, n] : free) free_pinned(p);
    for (void* p : retired) free_pinned(p);
  }
  static void free_pinned(void* p) {
#if defined(LH_USE_CUDA)
    if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();  // e.g. at exit, after the runtime unloaded
#else
    (void)p;
#endif
  }
  static uint64_t round_up(uint64_t n) {
    if (n <= kMinBytes) return kMinBytes;
    if (n > (uint64_t(1) << 30)) return (n + (1u << 20) - 1) & ~uint64_t((1u << 20) - 1);
    uint64_t c = kMinBytes;
    while (c < n) c <<= 1;
    return c;
  }
  // A buffer of at least `n` bytes: the smallest free one that fits, else a new one (dropping a free one
  // that is too small, so the pool grows rather than accumulates).
  static Result<std::shared_ptr<Lease>> acquire(const std::shared_ptr<StagingPool>& self, uint64_t n) {
    auto lease = std::make_shared<Lease>();
    lease->pool = self;
    void* drop = nullptr;
    {
      std::lock_guard<std::mutex> lock(self->mu);
      size_t best = self->free.size();
      for (size_t i = 0; i < self->free.size(); ++i)
        if (self->free[i].second >= n && (best == self->free.size() || self->free[i].second < self->free[best].second))
          best = i;
      if (best < self->free.size()) {
        lease->ptr = self->free[best].first;
        lease->capacity = self->free[best].second;
        self->free.erase(self->free.begin() + long(best));
        lease->reusable = true;  // until the transfer takes it over
        return lease;
      }
      if (!self->free.empty()) {
        auto smallest = std::min_element(self->free.begin(), self->free.end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; });
        drop = smallest->first;
        self->held -= smallest->second;
        self->free.erase(smallest);
      }
    }
    if (drop) free_pinned(drop);
#if defined(LH_USE_CUDA)
    uint64_t cap = round_up(n);
    void* p = nullptr;
    cudaError_t e = cudaMallocHost(&p, cap);
    if (e != cudaSuccess) {
      cudaGetLastError();
      lease->pool = nullptr;  // nothing to give back
      return unavailable("pinned staging buffer of " + std::to_string(cap) +
                         " bytes for a device transfer: " + ErrorDomain<cudaError_t>::describe(e));
    }
    lease->ptr = p;
    lease->capacity = cap;
    lease->reusable = true;
    std::lock_guard<std::mutex> lock(self->mu);
    self->held += cap;
    return lease;
#else
    lease->pool = nullptr;
    return unavailable("pinned staging memory needs a CUDA build");
#endif
  }
  void release(void* p, uint64_t n, bool reusable) {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!reusable) {
        retired.push_back(p);
        return;
      }
      if (free.size() < kKeep) {
        free.emplace_back(p, n);
        return;
      }
      held -= n;
    }
    free_pinned(p);
  }
};

namespace {

// Why device memory of `device` cannot be moved here, or Ok.
Status device_usable(Device device, const char* what, int peer) {
  std::string ctx = std::string(what) + " rank " + std::to_string(peer) + " with " + device_name(device) + " memory: ";
  if (device == Device::cpu) return Status::Ok();
  if (device != Device::cuda) return invalid_argument(ctx + "unknown device");
#if defined(LH_USE_CUDA)
  if (!cuda_available()) return unavailable(ctx + "no CUDA device (" + cuda_device_summary() + ")");
  return Status::Ok();
#else
  return unavailable(ctx +
                     "this is a CPU-only build of longhaul (LH_CUDA=OFF or no nvcc), it cannot touch CUDA memory");
#endif
}

}  // namespace

std::shared_ptr<DataPlane::StagingPool> DataPlane::staging() {
  std::lock_guard<std::mutex> lock(staging_mu_);
  if (!staging_) staging_ = std::make_shared<StagingPool>();
  return staging_;
}

uint64_t DataPlane::staging_bytes() const {
  std::shared_ptr<StagingPool> pool;
  {
    std::lock_guard<std::mutex> lock(staging_mu_);
    pool = staging_;
  }
  if (!pool) return 0;
  std::lock_guard<std::mutex> lock(pool->mu);
  return pool->held;
}

Transfer DataPlane::send_device(int peer, Tag tag, const void* data, uint64_t size, Device device, uint64_t raw_bytes) {
  if (device == Device::cpu) return send_view(peer, tag, data, size, raw_bytes);
  Status usable = device_usable(device, "send to", peer);
  if (!usable.ok()) return Transfer::failed(Direction::kSend, peer, tag, std::move(usable));
  if (!data && size) return Transfer::failed(Direction::kSend, peer, tag, invalid_argument("send_device: null data"));
  if (device_memory_direct(device)) {
    auto st = make_state(Direction::kSend, peer, tag, raw_bytes);
    st->data = static_cast<const uint8_t*>(data);
    st->size = size;
    st->wire_bytes = size;
    st->memory = device;
    Transfer t(st);
    start_send(std::move(st));
    return t;
  }
#if defined(LH_USE_CUDA)
  auto lease = StagingPool::acquire(staging(), size);
  if (!lease.ok()) return Transfer::failed(Direction::kSend, peer, tag, Status(lease.status()).prepend("send_device"));
  std::shared_ptr<StagingPool::Lease> l = std::move(lease).value();
  if (size) {
    cudaError_t e = cudaMemcpy(l->ptr, data, size, cudaMemcpyDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Transfer::failed(Direction::kSend, peer, tag,
                              unavailable("send_device: staging " + std::to_string(size) +
                                          " bytes device→host: " + ErrorDomain<cudaError_t>::describe(e)));
    }
  }
  l->reusable = false;  // the transport owns it until the send succeeds
  auto st = make_state(Direction::kSend, peer, tag, raw_bytes);
  st->data = static_cast<const uint8_t*>(l->ptr);
  st->size = size;
  st->wire_bytes = size;
  st->finish = [l](TransferState&) {
    l->reusable = true;
    return Status::Ok();
  };
  Transfer t(st);
  start_send(std::move(st));
  return t;
#else
  return Transfer::failed(Direction::kSend, peer, tag, unavailable("send_device: CPU-only build"));
#endif
}

Transfer DataPlane::recv_into_device(int peer, Tag tag, void* dst, uint64_t capacity, Device device,
                                     uint64_t raw_bytes) {
  if (device == Device::cpu) return recv_into(peer, tag, dst, capacity, raw_bytes);
  Status usable = device_usable(device, "receive from", peer);
  if (!usable.ok()) return Transfer::failed(Direction::kRecv, peer, tag, std::move(usable));
  if (!dst) return Transfer::failed(Direction::kRecv, peer, tag, invalid_argument("recv_into_device: null buffer"));
  if (device_memory_direct(device)) {
    auto st = make_state(Direction::kRecv, peer, tag, raw_bytes);
    st->dst = static_cast<uint8_t*>(dst);
    st->capacity = capacity;
    st->memory = device;
    Transfer t(st);
    start_recv(std::move(st));
    return t;
  }
#if defined(LH_USE_CUDA)
  auto lease = StagingPool::acquire(staging(), capacity);
  if (!lease.ok())
    return Transfer::failed(Direction::kRecv, peer, tag, Status(lease.status()).prepend("recv_into_device"));
  std::shared_ptr<StagingPool::Lease> l = std::move(lease).value();
  l->reusable = false;  // the transport may write into it until the receive succeeds
  auto st = make_state(Direction::kRecv, peer, tag, raw_bytes);
  st->dst = static_cast<uint8_t*>(l->ptr);
  st->capacity = capacity;
  // Runs on the completing thread once the packet is in the pinned buffer, before the Transfer is done.
  st->finish = [l, dst, peer](TransferState& t) -> Status {
    l->reusable = true;
    if (t.wire_bytes == 0) return Status::Ok();
    cudaError_t e = cudaMemcpy(dst, l->ptr, t.wire_bytes, cudaMemcpyDefault);
    if (e == cudaSuccess) return Status::Ok();
    cudaGetLastError();
    return unavailable("receive from rank " + std::to_string(peer) + ": copying " + std::to_string(t.wire_bytes) +
                       " staged bytes host→device: " + ErrorDomain<cudaError_t>::describe(e));
  };
  Transfer t(st);
  start_recv(std::move(st));
  return t;
#else
  return Transfer::failed(Direction::kRecv, peer, tag, unavailable("recv_into_device: CPU-only build"));
#endif
}

}  // namespace lh
