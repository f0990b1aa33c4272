// defines: lh::PrometheusText — a writer of Prometheus' text exposition format (version 0.0.4): families with
// # HELP and # TYPE, samples with escaped label values. Used by the coordinator's /metrics.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lh {

using PromLabels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  // Starts a family (type: counter or gauge). Its samples follow; a family is written once.
  void family(const std::string& name, const std::string& type, const std::string& help);
  void sample(const std::string& name, const PromLabels& labels, double value);
  void sample(const std::string& name, const PromLabels& labels, uint64_t value);
  const std::string& str() const { return out_; }
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  void begin(const std::string& name, const PromLabels& labels);
  std::string out_;
  std::set<std::string> families_;
};

// A label value escaped for the format: backslash, double quote and newline.
std::string prometheus_escape(const std::string& value);

}  // namespace lh
