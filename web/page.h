// defines: the live page (web/page.html, built into the binary) — as served by the coordinator's `/`, and as the
// static report `longhaul report --html` writes, with the job's data inside. Used by the coordinator and report.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace lh {

// The page that polls api/page (the coordinator's `/`).
const std::string& live_page_html();
// The same page with `data` (the shape api/page answers) inside it, for a browser with no coordinator.
std::string report_page_html(const nlohmann::json& data);

}  // namespace lh
