// defines: lh::Role (what a packet or stream carries: activations, their gradients, weight gradients, tp partial
// sums, other) and its names, and lh::LinkDir (which way a pipeline link's traffic goes: fwd or bwd). The one role type
// of the project: transport's Tag, compress's packet header and the metrics records all use it. Wire values: a Tag
// packs the enum's value in 8 bits (0..4); a codec packet's header byte 9 holds it too, for the four roles a codec
// stream may carry (0..3, kNumCodecRoles; kOther is refused there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

enum class Role : uint8_t {
  kActivation = 0,      // forward activations between pipeline stages
  kActivationGrad = 1,  // dL/dA flowing backwards between stages
  kWeightGrad = 2,      // data-parallel gradient synchronisation
  kTpPartial = 3,       // tensor-parallel partial sums
  kOther = 4,           // anything else (benchmarks, tests, checkpoints)
};
constexpr int kNumRoles = 5;
// Roles a codec stream (compress::StreamState, a packet's role byte) may carry: the first four.
constexpr int kNumCodecRoles = 4;

// "act", "act_grad", "grad", "tp", "other": the names in tags, link meters and metrics JSON.
const char* role_name(Role role);
Result<Role> parse_role(const std::string& name);
// role_name() of every role, in the enum's order (what a metrics record's "role" may be).
const std::vector<std::string>& role_names();

// "activation", "activation_grad", "weight_grad", "tp_partial" (and "other"): the spelled-out names in the
// codec's packet messages. parse_codec_role accepts the four codec roles only.
const char* codec_role_name(Role role);
Result<Role> parse_codec_role(const std::string& name);

// fwd: activations from stage s to s+1 (role act); bwd: activation gradients from s+1 back to s (role act_grad).
// The one link-direction type (a packet's send/recv end is transport's Direction, another thing).
enum class LinkDir { kFwd, kBwd };
Result<LinkDir> parse_link_dir(const std::string& text);  // "fwd" | "bwd"
const char* link_dir_name(LinkDir dir);

// How traffic of the role named `role` (role_name()) is labelled by direction: "fwd" for act, "bwd" for act_grad,
// else the role's own name ("grad", "tp", "other"). The vocabulary of a set-codec's "dir" (SetCodec::dir: fwd, bwd,
// grad, tp), of reports' and plots' "dir".
std::string role_dir_label(const std::string& role);

}  // namespace lh
