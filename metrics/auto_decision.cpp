// AutoDecision to and from the JSON the metrics carry (see auto_decision.h).
#include "metrics/auto_decision.h"

namespace lh {

nlohmann::json auto_decision_to_json(const AutoDecision& d) {
  return {{"step", d.step},
          {"from_step", d.from_step},
          {"link", d.link},
          {"from", d.from},
          {"to", d.to},
          {"bandwidth_bps", d.bandwidth_bps},
          {"transfer_s", d.transfer_s},
          {"compute_s", d.compute_s},
          {"latency_s", d.latency_s},
          {"reason", d.reason}};
}

Result<AutoDecision> auto_decision_from_json(const nlohmann::json& j, const std::string& where) {
  AutoDecision d;
  try {
    if (!j.is_object()) return invalid_argument(where + ": an auto decision is not an object");
    d.step = j.at("step").get<int64_t>();
    d.from_step = j.at("from_step").get<int64_t>();
    d.link = j.at("link").get<std::string>();
    d.from = j.at("from").get<std::string>();
    d.to = j.at("to").get<std::string>();
    d.bandwidth_bps = j.at("bandwidth_bps").get<double>();
    d.transfer_s = j.at("transfer_s").get<double>();
    d.compute_s = j.at("compute_s").get<double>();
    d.latency_s = j.value("latency_s", 0.0);  // absent in records written before it was measured
    d.reason = j.at("reason").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(where + ": auto decision: " + e.what());
  }
  return d;
}

}  // namespace lh
