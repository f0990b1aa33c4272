// UcxDataPlane's fault injection for tests (LH_FAULT_DROP_SEND, LH_FAULT_FORGE). See ucx_data_plane.cpp.
#include <atomic>
#include <cstdlib>

#include "core/log.h"
#include "transport/ucx_data_plane_internal.h"

namespace lh {
using namespace ucx_internal;

namespace {
// A fault-injection variable's step (tests only); −1 when it is not set.
int64_t fault_step(const char* name) {
  const char* env = std::getenv(name);
  return env ? std::atoll(env) : int64_t(-1);
}
}  // namespace

// LH_FAULT_DROP_SEND=STEP (tests only): the first activation this process sends for STEP is reported sent but never
// leaves, once per process — a packet the data plane lost.
bool ucx_internal::fault_drop_send(const Tag& tag) {
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
int64_t ucx_internal::fault_forge_step() {
  static const int64_t step = fault_step("LH_FAULT_FORGE");
  return step;
}

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

}  // namespace lh
