// Role names (the short ones of tags and metrics, the spelled-out ones of codec packets) and link directions.
#include "core/role.h"

namespace lh {

const char* role_name(Role role) {
  switch (role) {
    case Role::kActivation:
      return "act";
    case Role::kActivationGrad:
      return "act_grad";
    case Role::kWeightGrad:
      return "grad";
    case Role::kTpPartial:
      return "tp";
    case Role::kOther:
      return "other";
  }
  return "unknown";
}

Result<Role> parse_role(const std::string& name) {
  for (int r = 0; r < kNumRoles; ++r)
    if (name == role_name(static_cast<Role>(r))) return static_cast<Role>(r);
  return invalid_argument("unknown role '" + name + "' (allowed: act, act_grad, grad, tp, other)");
}

const std::vector<std::string>& role_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (int r = 0; r < kNumRoles; ++r) v.push_back(role_name(static_cast<Role>(r)));
    return v;
  }();
  return names;
}

const char* codec_role_name(Role role) {
  switch (role) {
    case Role::kActivation:
      return "activation";
    case Role::kActivationGrad:
      return "activation_grad";
    case Role::kWeightGrad:
      return "weight_grad";
    case Role::kTpPartial:
      return "tp_partial";
    case Role::kOther:
      return "other";
  }
  return "?";
}

Result<Role> parse_codec_role(const std::string& name) {
  for (int r = 0; r < kNumCodecRoles; ++r)
    if (name == codec_role_name(static_cast<Role>(r))) return static_cast<Role>(r);
  return invalid_argument("unknown role '" + name + "'; allowed: activation, activation_grad, weight_grad, tp_partial");
}

Result<LinkDir> parse_link_dir(const std::string& text) {
  if (text == "fwd") return LinkDir::kFwd;
  if (text == "bwd") return LinkDir::kBwd;
  return invalid_argument("direction '" + text +
                          "' is unknown; choose fwd (activations) or bwd (activation gradients)");
}

const char* link_dir_name(LinkDir dir) {
  return dir == LinkDir::kFwd ? "fwd" : "bwd";
}

std::string role_dir_label(const std::string& role) {
  if (role == role_name(Role::kActivation)) return link_dir_name(LinkDir::kFwd);
  if (role == role_name(Role::kActivationGrad)) return link_dir_name(LinkDir::kBwd);
  return role;
}

}  // namespace lh
