// JSON-lines form of WorkerStepMetrics: writing, and reading with a validation error per bad field.
// Used by workers, the coordinator, `train` and `report`.
#include "metrics/step_metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <istream>

#include "core/json_fields.h"
#include "core/json_limits.h"

namespace lh {

nlohmann::json step_metrics_to_json(const WorkerStepMetrics& m) {
  nlohmann::json j;
  j["step"] = m.step;
  j["worker"] = m.worker;
  j["stage"] = m.stage;
  if (m.loss) j["loss"] = *m.loss;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.lr) j["lr"] = *m.lr;
  if (m.tokens_per_s) j["tokens_per_s"] = *m.tokens_per_s;
  if (m.auth_failures) j["auth_failures"] = *m.auth_failures;
  if (m.compute_s) j["compute_s"] = *m.compute_s;
  if (!m.auto_decisions.empty()) j["auto"] = m.auto_decisions;
  nlohmann::json links = nlohmann::json::array();
  for (const LinkTraffic& t : m.links) {
    nlohmann::json l{{"src", t.src}, {"dst", t.dst}, {"role", t.role}, {"dir", t.dir}};
    if (!t.codec.empty()) l["codec"] = t.codec;
    if (!t.link.empty()) l["link"] = t.link;
    l["raw_bytes"] = t.raw_bytes;
    l["wire_bytes"] = t.wire_bytes;
    l["messages"] = t.messages;
    l["seconds"] = t.seconds;
    if (t.serial_s) l["serial_s"] = *t.serial_s;
    if (t.latency_s) l["latency_s"] = *t.latency_s;
    if (t.relayed) l["relayed"] = true;
    links.push_back(std::move(l));
  }
  j["links"] = std::move(links);
  return j;
}

std::string step_metrics_to_line(const WorkerStepMetrics& m) {
  return step_metrics_to_json(m).dump();
}

namespace {

// A worker or stage number: a non-negative integer up to a million.
Status small_uint(const JsonFields& r, const std::string& field, bool required, int& out) {
  uint64_t v = static_cast<uint64_t>(out);
  LH_RETURN_IF_ERROR(r.uint(field, v, JsonFields::Need(required)));
  if (v > 1000000) return r.error(field, "value " + std::to_string(v) + " is too large");
  out = static_cast<int>(v);
  return Status::Ok();
}

constexpr size_t kShown = 40;  // a metrics line may be long: its values are cut in errors

Result<LinkTraffic> parse_link(const nlohmann::json& j, const std::string& where, const std::string& prefix) {
  JsonFields r(j, where, prefix, kShown);
  if (!j.is_object())
    return invalid_argument(where + ": field '" + prefix.substr(0, prefix.size() - 1) + "': expected an object, got " +
                            JsonFields::shown(j, kShown));
  LinkTraffic t;
  t.role.clear();
  LH_RETURN_IF_ERROR(small_uint(r, "src", true, t.src));
  LH_RETURN_IF_ERROR(small_uint(r, "dst", true, t.dst));
  if (t.src == t.dst) return r.error("dst", "equals src (" + std::to_string(t.src) + "); a link joins two workers");
  if (j.find("role") == j.end()) return r.error("role", "missing");
  LH_RETURN_IF_ERROR(r.string("role", t.role, JsonFields::kOptional));
  if (auto role = parse_role(t.role); !role.ok()) return r.error("role", role.status().message());
  LH_RETURN_IF_ERROR(r.string("dir", t.dir, JsonFields::kOptional));
  if (t.dir != "send" && t.dir != "recv") return r.error("dir", "expected send or recv, got '" + t.dir + "'");
  LH_RETURN_IF_ERROR(r.string("codec", t.codec, JsonFields::kOptional));
  LH_RETURN_IF_ERROR(r.string("link", t.link, JsonFields::kOptional));
  LH_RETURN_IF_ERROR(r.uint("raw_bytes", t.raw_bytes, JsonFields::kOptional));
  LH_RETURN_IF_ERROR(r.uint("wire_bytes", t.wire_bytes, JsonFields::kOptional));
  LH_RETURN_IF_ERROR(r.uint("messages", t.messages, JsonFields::kOptional));
  std::optional<double> seconds;
  LH_RETURN_IF_ERROR(r.number("seconds", seconds, true));
  t.seconds = seconds.value_or(0.0);
  LH_RETURN_IF_ERROR(r.number("serial_s", t.serial_s, true));
  LH_RETURN_IF_ERROR(r.number("latency_s", t.latency_s, true));
  LH_RETURN_IF_ERROR(r.boolean("relayed", t.relayed, JsonFields::kOptional));
  return t;
}

}  // namespace

Result<std::vector<LinkTraffic>> link_traffic_from_json(const nlohmann::json& links, const std::string& source) {
  if (!links.is_array())
    return invalid_argument(source + ": field 'links': expected an array, got " + JsonFields::shown(links, kShown));
  std::vector<LinkTraffic> out;
  for (size_t i = 0; i < links.size(); ++i) {
    LH_ASSIGN_OR_RETURN(LinkTraffic t, parse_link(links[i], source, "links[" + std::to_string(i) + "]."));
    out.push_back(std::move(t));
  }
  return out;
}

Result<WorkerStepMetrics> parse_step_metrics_line(const std::string& line, int line_number, const std::string& source) {
  const std::string where = source + " line " + std::to_string(line_number);
  LH_ASSIGN_OR_RETURN(nlohmann::json j, parse_json_bounded(line, JsonLimits{kMaxMetricsLineBytes}, where));
  if (!j.is_object()) return invalid_argument(where + ": expected a JSON object, got " + JsonFields::shown(j, kShown));
  JsonFields r(j, where, "", kShown);
  WorkerStepMetrics m;
  m.source_line = line_number;
  uint64_t step = 0;
  LH_RETURN_IF_ERROR(r.uint("step", step, JsonFields::kRequired));
  if (step > (uint64_t(1) << 53)) return r.error("step", "value " + std::to_string(step) + " is too large");
  m.step = static_cast<int64_t>(step);
  LH_RETURN_IF_ERROR(small_uint(r, "worker", false, m.worker));
  LH_RETURN_IF_ERROR(small_uint(r, "stage", false, m.stage));
  LH_RETURN_IF_ERROR(r.number("loss", m.loss, false));
  LH_RETURN_IF_ERROR(r.number("val_loss", m.val_loss, false));
  LH_RETURN_IF_ERROR(r.number("lr", m.lr, false));
  LH_RETURN_IF_ERROR(r.number("tokens_per_s", m.tokens_per_s, true));
  if (j.contains("auth_failures")) {
    uint64_t n = 0;
    LH_RETURN_IF_ERROR(r.uint("auth_failures", n, JsonFields::kRequired));
    m.auth_failures = n;
  }
  LH_RETURN_IF_ERROR(r.number("compute_s", m.compute_s, true));
  if (auto a = j.find("auto"); a != j.end() && !a->is_null()) {
    if (!a->is_array()) return invalid_argument(where + ": field auto: expected an array");
    for (const auto& d : *a) m.auto_decisions.push_back(d);
  }
  auto links = j.find("links");
  if (links != j.end() && !links->is_null()) {
    LH_ASSIGN_OR_RETURN(m.links, link_traffic_from_json(*links, where));
  }
  return m;
}

Result<std::vector<WorkerStepMetrics>> read_step_metrics(std::istream& in, const std::string& source) {
  std::vector<WorkerStepMetrics> out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    LH_ASSIGN_OR_RETURN(WorkerStepMetrics m, parse_step_metrics_line(line, number, source));
    out.push_back(std::move(m));
  }
  if (in.bad()) return io_error(source + ": read failed after line " + std::to_string(number));
  return out;
}

Result<std::vector<WorkerStepMetrics>> read_step_metrics_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("metrics file '" + path + "' cannot be opened: " + std::strerror(errno));
  return read_step_metrics(in, path);
}

Result<StepMetricsWriter> StepMetricsWriter::open(const std::string& path, bool append) {
  StepMetricsWriter w;
  w.path_ = path;
  w.file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!w.file_) return io_error("metrics file '" + path + "' cannot be opened for writing: " + std::strerror(errno));
  return w;
}

StepMetricsWriter::StepMetricsWriter(StepMetricsWriter&& o) noexcept : path_(std::move(o.path_)), file_(o.file_) {
  o.file_ = nullptr;
}

StepMetricsWriter& StepMetricsWriter::operator=(StepMetricsWriter&& o) noexcept {
  if (this != &o) {
    if (file_) std::fclose(file_);
    path_ = std::move(o.path_);
    file_ = o.file_;
    o.file_ = nullptr;
  }
  return *this;
}

StepMetricsWriter::~StepMetricsWriter() {
  if (file_) std::fclose(file_);
}

Status StepMetricsWriter::write(const WorkerStepMetrics& m) {
  return write_line(step_metrics_to_line(m));
}

Status StepMetricsWriter::write_line(const std::string& json_line) {
  LH_ASSERT(file_ != nullptr, "write to a closed metrics file");
  if (json_line.find('\n') != std::string::npos)
    return invalid_argument("metrics file '" + path_ + "': a metrics record must be one line");
  if (std::fputs(json_line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF || std::fflush(file_) != 0)
    return io_error("metrics file '" + path_ + "': write failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace lh
