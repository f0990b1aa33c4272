// The UCX data plane's internals shared by its .cpp files (ucx_data_plane.cpp: setup, listener, progress thread;
// ucx_connect.cpp: endpoints and failures; ucx_tag_matching.cpp: sending, receiving and matching packets;
// ucx_fault_injection.cpp: the tests' faults; ucx_relay.cpp: the relay fallback). Not for use outside them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "transport/ucx_data_plane.h"

namespace lh {
namespace ucx_internal {

inline constexpr uint64_t kTagMask = (uint64_t(1) << Tag::kBits) - 1;
inline constexpr unsigned kPacketAm = 7;  // the active-message id of every packet

inline uint8_t g_empty_byte = 0;  // a valid pointer for 0-byte packets and for packets received into nothing
inline constexpr uint64_t kDropsLoggedFreely = 10;  // then at most one line a second

inline Status too_big(uint64_t length, uint64_t capacity, int peer) {
  return out_of_range("packet of " + std::to_string(length) + " bytes from rank " + std::to_string(peer) +
                      " does not fit the receive buffer of " + std::to_string(capacity) + " bytes");
}

// LH_FAULT_DROP_SEND=STEP (tests only): the first activation this process sends for STEP is reported sent but never
// leaves, once per process — a packet the data plane lost.
bool fault_drop_send(const Tag& tag);
// LH_FAULT_FORGE=STEP (tests only; authenticated planes): the step before whose first activation forged packets go
// out (UcxDataPlane::forge_for_tests); −1 when it is not set.
int64_t fault_forge_step();

}  // namespace ucx_internal

struct UcxDataPlane::Inbound {
  UcxDataPlane* plane = nullptr;
  int peer = -1;
  uint64_t tag = 0;
  uint64_t seq = 0;             // the header's sequence number (authenticated planes): the trailer's must match
  bool discard = false;         // thrown away: never delivered (a dropped packet is also received into nothing)
  bool queued = false;          // in unexpected_, counted against its peer's bounds
  Bytes bytes;                  // the plane's buffer for the packet (not for direct receives)
  uint64_t held = 0;            // bytes of it counted in buffer_bytes_
  uint64_t payload_length = 0;  // what the receiver gets: length, less the trailer of an authenticated packet
  Clock::time_point arrived{}, finished{};
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::shared_ptr<TransferState> target;  // the receive it was matched to, if any yet
  uint64_t length = 0;
  bool direct = false;  // received straight into target->dst
  // The direct receive failed (fail_peer) while UCX was writing into target->dst. UCX cannot cancel a
  // matched receive, so the target fails with this once UCX reports the request finished, never before.
  std::optional<Status> aborted;
  Clock::time_point aborted_at{};

  // Hands `bytes` over (to a recv's Transfer) or frees them, for packet_buffer_bytes_peak's count.
  Bytes release() {
    plane->buffer_bytes_ -= held;
    held = 0;
    return std::move(bytes);
  }
  ~Inbound() {
    if (plane) plane->buffer_bytes_ -= held;
  }
};

}  // namespace lh
