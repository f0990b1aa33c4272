// defines: lh::Transfer, the completion handle of one non-blocking send or receive, and its shared state.
// Used by every DataPlane (UcxDataPlane, LinkShaper) and by callers that overlap compute with communication.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "transport/tag.h"

namespace lh {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

enum class Direction : uint8_t { kSend = 0, kRecv = 1 };
inline const char* direction_name(Direction d) {
  return d == Direction::kSend ? "send" : "recv";
}

// Shared between the issuing thread and the thread that completes the transfer (a progress or shaper
// thread). Everything after `done` is written once, before completion, and read after it.
struct TransferState {
  Direction direction = Direction::kSend;
  int peer = -1;
  Tag tag;
  uint64_t raw_bytes = 0;                // what the caller says the packet stands for (uncompressed fp32)
  uint64_t wire_bytes = 0;               // bytes that crossed (or will cross) the link
  Clock::time_point t_start{}, t_end{};  // link busy from t_start (post, or arrival for receives) to t_end

  Bytes owned;                    // send: the buffer kept alive until done; recv: the received packet
  uint8_t* dst = nullptr;         // recv_into: the caller's buffer (then `owned` stays empty) …
  uint64_t capacity = 0;          // … and its size
  const uint8_t* data = nullptr;  // send: what goes on the wire (owned.data() or caller memory)
  uint64_t size = 0;
  // Where `data` (send) or `dst` (recv_into) lives. Device::cuda only reaches a plane that said it moves
  // CUDA memory itself (DataPlane::device_memory_direct); otherwise the DataPlane stages through pinned host
  // memory and the plane sees host memory.
  Device memory = Device::cpu;
  // Runs once on the completing thread before a successful completion is final (before the hooks and the
  // waiters), e.g. the pinned→device copy of a staged receive; an error it returns becomes the status.
  std::function<Status(TransferState&)> finish;

  // Completes the transfer once: runs the completion hooks, then wakes waiters. Later calls are ignored.
  void complete(Status status);
  bool is_done() const;
  // Runs `fn` on the completing thread (or right away if already done). Hooks must be quick.
  void on_done(std::function<void(TransferState&)> fn);

  mutable std::mutex mu;
  std::condition_variable cv;
  bool finishing = false;   // complete() was called; `finish` may be running
  bool completing = false;  // status is final; hooks are running or ran
  bool done = false;        // hooks ran; waiters may read everything
  Status status;
  std::vector<std::function<void(TransferState&)>> hooks;
};

// A handle to one in-flight send or receive. Cheap to copy; all copies see the same transfer.
class Transfer {
 public:
  Transfer() = default;
  explicit Transfer(std::shared_ptr<TransferState> s) : s_(std::move(s)) {}
  // An already-failed transfer (bad peer, closed plane …).
  static Transfer failed(Direction dir, int peer, Tag tag, Status why);

  bool valid() const { return s_ != nullptr; }
  // Non-blocking: has it finished (successfully or not)?
  bool done() const;
  // Blocks until done or `timeout`; returns the transfer's status, or Unavailable on timeout (the
  // transfer then continues and may still finish).
  Status wait(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) const;
  // Blocks until one of `transfers` (valid ones; others are skipped) is done or `timeout` passes; returns the index
  // of a done one (the lowest), or −1 on timeout or when none is valid.
  static int wait_any(const std::vector<Transfer>& transfers, std::chrono::milliseconds timeout);
  // How long some thread of this process has been blocked in wait() without a break (0: none is): heartbeats carry
  // it, so the coordinator can tell ranks stuck on each other from ranks busy computing.
  static std::chrono::milliseconds blocked_for();
  // The final status; Unavailable("still in flight") before done().
  Status status() const;
  // A finished receive's packet, moved out (empty for sends, recv_into, or before done()).
  Bytes take();
  // Bytes on the wire; for a finished receive (also recv_into), the packet's size.
  uint64_t wire_bytes() const;
  int peer() const;
  Tag tag() const;
  Direction direction() const;
  // Runs `fn(status)` when the transfer finishes, on the completing thread (keep it short).
  void on_done(std::function<void(const Status&)> fn);

  TransferState* state() const { return s_.get(); }

 private:
  std::shared_ptr<TransferState> s_;
};

}  // namespace lh
