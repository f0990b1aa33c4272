// PrometheusText: the text exposition format, written by hand (a few lines; Debian's C++ Prometheus client is not
// packaged, and the format is a stable, documented text).
#include "metrics/prometheus_text.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace lh {

std::string prometheus_escape(const std::string& value) {
  std::string s;
  s.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      s += "\\\\";
    else if (c == '"')
      s += "\\\"";
    else if (c == '\n')
      s += "\\n";
    else
      s += c;
  }
  return s;
}

void PrometheusText::family(const std::string& name, const std::string& type, const std::string& help) {
  if (!families_.insert(name).second) throw std::logic_error("prometheus family written twice: " + name);
  std::string h;
  for (char c : help) h += c == '\n' ? ' ' : c;  // HELP is one line (its backslashes stay literal text)
  out_ += "# HELP " + name + " " + h + "\n# TYPE " + name + " " + type + "\n";
}

void PrometheusText::begin(const std::string& name, const PromLabels& labels) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first + "=\"" + prometheus_escape(labels[i].second) + "\"";
    }
    out_ += '}';
  }
  out_ += ' ';
}

void PrometheusText::sample(const std::string& name, const PromLabels& labels, double value) {
  begin(name, labels);
  if (std::isnan(value)) {
    out_ += "NaN\n";
  } else if (std::isinf(value)) {
    out_ += value > 0 ? "+Inf\n" : "-Inf\n";
  } else {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g\n", value);
    out_ += buf;
  }
}

void PrometheusText::sample(const std::string& name, const PromLabels& labels, uint64_t value) {
  begin(name, labels);
  out_ += std::to_string(value) + "\n";
}

}  // namespace lh
