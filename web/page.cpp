// The live page and the static report built from it.
#include "web/page.h"

#include <stdexcept>

namespace lh {

extern const char* const kLivePageHtml;  // generated from web/page.html (web/CMakeLists.txt)

const std::string& live_page_html() {
  static const std::string page(kLivePageHtml);
  return page;
}

std::string report_page_html(const nlohmann::json& data) {
  static const std::string marker = "<!--LH-DATA-->";
  std::string page = live_page_html();
  const size_t at = page.find(marker);
  if (at == std::string::npos) throw std::logic_error("web/page.html lost its <!--LH-DATA--> marker");
  // JSON inside a script element: "</" would end it, so it is written "<\/" (the same string to JSON).
  std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), safe;
  safe.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/') {
      safe += "<\\/";
      ++i;
    } else {
      safe += json[i];
    }
  }
  page.replace(at, marker.size(), "<script id=\"lh-data\" type=\"application/json\">" + safe + "</script>");
  return page;
}

}  // namespace lh
