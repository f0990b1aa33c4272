// Completion handles for non-blocking transfers. Used by UcxDataPlane, LinkShaper and their callers.
#include "transport/transfer.h"

#include <atomic>

namespace lh {

void TransferState::complete(Status st) {
  std::vector<std::function<void(TransferState&)>> run;
  std::function<Status(TransferState&)> fin;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (finishing) return;
    finishing = true;
    fin.swap(finish);
  }
  // The last step (a staged receive's copy to the device) belongs to the transfer: its failure is the
  // transfer's. Later complete() calls are already ignored while it runs; hooks added meanwhile queue.
  if (fin && st.ok()) st = fin(*this);
  fin = nullptr;  // releases what it held (a staging buffer) before anyone wakes
  {
    std::lock_guard<std::mutex> lock(mu);
    completing = true;
    status = std::move(st);
    if (t_end == Clock::time_point{}) t_end = Clock::now();
    run.swap(hooks);
  }
  // Hooks (the meter, a decorator's chaining) run before waiters wake, so a caller returning from
  // wait() already sees the meter updated.
  for (auto& fn : run) fn(*this);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
}

bool TransferState::is_done() const {
  std::lock_guard<std::mutex> lock(mu);
  return done;
}

void TransferState::on_done(std::function<void(TransferState&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!completing) {
      hooks.push_back(std::move(fn));
      return;
    }
  }
  fn(*this);
}

Transfer Transfer::failed(Direction dir, int peer, Tag tag, Status why) {
  auto s = std::make_shared<TransferState>();
  s->direction = dir;
  s->peer = peer;
  s->tag = tag;
  s->t_start = Clock::now();
  s->complete(std::move(why));
  return Transfer(std::move(s));
}

bool Transfer::done() const {
  return s_ && s_->is_done();
}

namespace {
std::atomic<int> g_waiters{0};
std::atomic<int64_t> g_blocked_since_ns{0};  // steady clock, while g_waiters > 0

struct BlockedScope {
  BlockedScope() {
    if (g_waiters.fetch_add(1) == 0) g_blocked_since_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  }
  ~BlockedScope() { g_waiters.fetch_sub(1); }
};
}  // namespace

std::chrono::milliseconds Transfer::blocked_for() {
  if (g_waiters.load() == 0) return std::chrono::milliseconds(0);
  const auto since = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(g_blocked_since_ns));
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since);
}

int Transfer::wait_any(const std::vector<Transfer>& transfers, std::chrono::milliseconds timeout) {
  auto first_done = [&] {
    for (size_t i = 0; i < transfers.size(); ++i)
      if (transfers[i].valid() && transfers[i].done()) return int(i);
    return -1;
  };
  bool any_valid = false;
  for (const Transfer& t : transfers) any_valid |= t.valid();
  if (!any_valid) return -1;
  if (int i = first_done(); i >= 0) return i;
  // One waker shared by completion hooks on every transfer: the hooks outlive this call, so it is shared.
  struct Waker {
    std::mutex mu;
    std::condition_variable cv;
    int which = -1;  // the first transfer whose hook ran
  };
  auto waker = std::make_shared<Waker>();
  for (size_t i = 0; i < transfers.size(); ++i)
    if (transfers[i].valid())
      transfers[i].state()->on_done([waker, i](TransferState&) {
        std::lock_guard<std::mutex> lock(waker->mu);
        if (waker->which < 0) waker->which = int(i);
        waker->cv.notify_all();
      });
  const auto deadline = Clock::now() + timeout;
  int which = -1;
  {
    BlockedScope blocked;
    std::unique_lock<std::mutex> lock(waker->mu);
    waker->cv.wait_until(lock, deadline, [&] { return waker->which >= 0; });
    which = waker->which;
  }
  if (which < 0) return first_done();
  // Its hooks may still be running: done() turns true when they have.
  (void)transfers[size_t(which)].wait(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) +
                                      std::chrono::milliseconds(1));
  return transfers[size_t(which)].done() ? which : first_done();
}

Status Transfer::wait(std::chrono::milliseconds timeout) const {
  if (!s_) return invalid_argument("wait on an empty Transfer");
  BlockedScope blocked;
  std::unique_lock<std::mutex> lock(s_->mu);
  if (!s_->cv.wait_for(lock, timeout, [&] { return s_->done; }))
    return unavailable("transfer " + std::string(direction_name(s_->direction)) + " peer " + std::to_string(s_->peer) +
                       " " + s_->tag.to_string() + " not done after " + std::to_string(timeout.count()) + " ms");
  return s_->status;
}

Status Transfer::status() const {
  if (!s_) return invalid_argument("status of an empty Transfer");
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->done) return unavailable("transfer still in flight");
  return s_->status;
}

Bytes Transfer::take() {
  if (!s_) return {};
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->done || s_->direction != Direction::kRecv) return {};
  return std::move(s_->owned);
}

uint64_t Transfer::wire_bytes() const {
  return s_ ? s_->wire_bytes : 0;
}
int Transfer::peer() const {
  return s_ ? s_->peer : -1;
}
Tag Transfer::tag() const {
  return s_ ? s_->tag : Tag{};
}
Direction Transfer::direction() const {
  return s_ ? s_->direction : Direction::kSend;
}

void Transfer::on_done(std::function<void(const Status&)> fn) {
  if (!s_) return;
  s_->on_done([fn = std::move(fn)](TransferState& st) { fn(st.status); });
}

}  // namespace lh
