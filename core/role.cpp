// Role names (the short ones of tags and metrics, the spelled-out ones of codec packets) and link directions.
#include "core/role.h"

namespace lh {
namespace {

// Each role's names, in the enum's order: its short name and the codec's spelled-out one.
struct RoleNames {
  const char* name;
  const char* codec_name;
};
constexpr RoleNames kRoleNames[kNumRoles] = {
    {"act", "activation"}, {"act_grad", "activation_grad"}, {"grad", "weight_grad"}, {"tp", "tp_partial"},
    {"other", "other"},
};

bool known(Role role) {
  return static_cast<int>(role) < kNumRoles;
}

}  // namespace

const char* role_name(Role role) {
  return known(role) ? kRoleNames[static_cast<int>(role)].name : "unknown";
}

Result<Role> parse_role(const std::string& name) {
  for (int r = 0; r < kNumRoles; ++r)
    if (name == kRoleNames[r].name) return static_cast<Role>(r);
  return invalid_argument("unknown role '" + name + "' (allowed: act, act_grad, grad, tp, other)");
}

const std::vector<std::string>& role_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const RoleNames& n : kRoleNames) v.push_back(n.name);
    return v;
  }();
  return names;
}

const char* codec_role_name(Role role) {
  return known(role) ? kRoleNames[static_cast<int>(role)].codec_name : "?";
}

Result<Role> parse_codec_role(const std::string& name) {
  for (int r = 0; r < kNumCodecRoles; ++r)
    if (name == kRoleNames[r].codec_name) return static_cast<Role>(r);
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
