// defines: lh::AutoDecision — one choice of adaptive compression (plan/auto_codec.h makes them) with its reasons, as
// the metrics carry it and `report` prints it, and its JSON form.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace lh {

// One decision, as the metrics carry it ("auto" on the link's sender's next record) and `report` prints it.
struct AutoDecision {
  int64_t step = 0;       // decided after this step's metrics
  int64_t from_step = 0;  // takes effect from this step
  std::string link;       // "0-1:fwd"
  std::string from, to;   // codec specs
  double bandwidth_bps = 0, transfer_s = 0, compute_s = 0;
  // The link's one-way latency as its sender measured it (transport/link_meter.h; in older records, from the pair's
  // small messages): only the serial part of a message's time shrinks with compression. 0 when unknown.
  double latency_s = 0;
  std::string reason;
};
nlohmann::json auto_decision_to_json(const AutoDecision& d);
Result<AutoDecision> auto_decision_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace lh
