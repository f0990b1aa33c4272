// defines: the checked envelope around a UCX worker address (what a worker puts in its Join and peers read from
// the Plan): wrap_worker_address, unwrap_peer_address, PeerAddress, check_advertised_host. Used by UcxDataPlane and
// by the control plane (coordinator, control client), which read an envelope without the UCX data plane.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"
#include "transport/transfer.h"

namespace lh {

// A UCX worker address in a checked envelope ("LHUA", version, length, xxHash64), so a corrupt or
// foreign address from the control plane is refused before UCX parses it. With `host`, the envelope also carries the
// address the worker advertises (UcxOptions::advertise) and its listener's port: peers connect there.
Bytes wrap_worker_address(const void* ucx_address, size_t length, const std::string& host = "", int port = 0);
// What a peer's envelope holds.
struct PeerAddress {
  Bytes worker;                  // the UCX worker address
  std::string host;              // the advertised host, or "" when the peer advertises none (connect to `worker`)
  int port = 0;                  // its UCX listener's port
  std::string describe() const;  // "advertised HOST:PORT", or "" without one
};
// The envelope's contents, or Corrupt naming the bad field.
Result<PeerAddress> unwrap_peer_address(const Bytes& envelope);
// The UCX address inside `envelope`, or Corrupt naming the bad field.
Result<Bytes> unwrap_worker_address(const Bytes& envelope);
// OK when `host` can be advertised: a DNS name or an IPv4 address (letters, digits, '.', '-', '_'; at most 253).
Status check_advertised_host(const std::string& host);

}  // namespace lh
