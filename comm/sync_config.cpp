// --sync parsing and printing, and the --compress-grad checks. Used by the config layer (plan/) and the reducer.
#include "comm/sync_config.h"

#include "comm/powersgd.h"
#include "compress/codec_chain.h"
#include "grid/parse_number.h"

namespace lh {

Status check_grad_codec_spec(const std::string& spec) {
  if (is_powersgd_spec(spec)) {
    LH_ASSIGN_OR_RETURN(PowerSgdConfig c, parse_powersgd(spec));
    if (is_powersgd_spec(c.wire)) return invalid_argument("'" + spec + "': PowerSGD's factors need a codec chain");
    Status w = check_grad_codec_spec(c.wire);
    return w.ok() ? w : w.prepend("'" + spec + "': the codec of P and Q");
  }
  auto chain = compress::parse_codec_spec(spec);
  if (!chain.ok()) return chain.status();
  for (const compress::StageSpec& s : chain->stages()) {
    if (s.id == compress::CodecId::delta || s.id == compress::CodecId::subspace || s.id == compress::CodecId::lowrank)
      return invalid_argument("'" + std::string(compress::codec_name(s.id)) +
                              "' cannot compress weight gradients (buckets are flat vectors that every replica must "
                              "decode alike); use fp16, bf16, int8/int4, topk/randk, spikes, with ef");
  }
  return Status::Ok();
}

std::string SyncConfig::to_string() const {
  if (kind == Kind::kEveryStep) return "every-step";
  if (kind == Kind::kDelayed) return "delayed:D=" + std::to_string(D) + (predict ? "" : ",predict=off");
  auto num = [](double v) {
    std::string t = std::to_string(v);
    while (t.size() > 1 && t.back() == '0') t.pop_back();
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t;
  };
  return "diloco:H=" + std::to_string(H) + ",outer_lr=" + num(outer_lr) + ",outer_momentum=" + num(outer_momentum);
}

Result<SyncConfig> parse_sync(const std::string& text) {
  SyncConfig c;
  const std::string grammar =
      "expected every-step, delayed[:D=N,predict=on|off] or diloco[:H=N,outer_lr=X,outer_momentum=M]";
  if (text == "every-step") return c;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  if (kind != "diloco" && kind != "delayed")
    return invalid_argument("--sync '" + text + "': unknown kind '" + kind + "'; " + grammar);
  c.kind = kind == "diloco" ? SyncConfig::Kind::kDiloco : SyncConfig::Kind::kDelayed;
  if (colon == std::string::npos) return c;
  const std::string rest = text.substr(colon + 1);
  size_t pos = 0;
  while (true) {
    const size_t comma = rest.find(',', pos);
    const std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return invalid_argument("--sync '" + text + "': '" + item + "' is not KEY=VALUE; " + grammar);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (c.delayed() != (key == "D" || key == "predict"))
      return invalid_argument("--sync '" + text + "': " + kind + " has no key '" + key + "'; " + grammar);
    if (key == "predict") {
      if (value != "on" && value != "off")
        return invalid_argument("--sync '" + text + "': predict is on or off, got '" + value + "'");
      c.predict = value == "on";
    } else if (key == "D") {
      auto d = parse_int(value, "D");
      if (!d.ok() || *d < 1 || *d > kMaxSyncDelay)
        return invalid_argument("--sync '" + text + "': D must be an integer in 1.." + std::to_string(kMaxSyncDelay) +
                                " (steps between a gradient and its update), got '" + value + "'");
      c.D = *d;
    } else if (key == "H") {
      auto h = parse_int(value, "H");
      if (!h.ok() || *h < 1)
        return invalid_argument("--sync '" + text + "': H must be an integer >= 1 (local steps between syncs), got '" +
                                value + "'");
      c.H = *h;
    } else if (key == "outer_lr") {
      auto v = parse_double(value, "outer_lr");
      if (!v.ok() || !(*v > 0))
        return invalid_argument("--sync '" + text + "': outer_lr must be a number > 0, got '" + value + "'");
      c.outer_lr = *v;
    } else if (key == "outer_momentum") {
      auto v = parse_double(value, "outer_momentum");
      if (!v.ok() || !(*v >= 0 && *v < 1))
        return invalid_argument("--sync '" + text + "': outer_momentum must be in [0, 1), got '" + value + "'");
      c.outer_momentum = *v;
    } else {
      return invalid_argument("--sync '" + text + "': unknown key '" + key + "'; " + grammar);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return c;
}

Status check_grad_codec_spec(const std::string& spec, const SyncConfig& sync) {
  LH_RETURN_IF_ERROR(check_grad_codec_spec(spec));
  if (sync.diloco() && is_powersgd_spec(spec))
    return invalid_argument("'" + spec +
                            "': PowerSGD runs with --sync every-step; DiLoCo's pseudo-gradients take a codec chain "
                            "(e.g. int4)");
  if (sync.delayed() && is_powersgd_spec(spec))
    return invalid_argument("'" + spec +
                            "': PowerSGD runs with --sync every-step; its warm start and error feedback need each "
                            "step's result before the next step starts, which --sync delayed does not wait for");
  return Status::Ok();
}

}  // namespace lh
