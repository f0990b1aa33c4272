// Cluster descriptions: JSON/YAML parsing with named errors, the link matrix, and JSON output.
#include "plan/cluster.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "transport/link_shaper.h"

namespace lh {
namespace {

using nlohmann::json;

json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted: a string
      if (s == "true") return true;
      if (s == "false") return false;
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) {
        if (s.find_first_of(".eE") == std::string::npos && std::fabs(d) < 9e15) return int64_t(d);
        return d;
      }
      return s;
    }
    default:
      return nullptr;
  }
}

Status field_error(const std::string& source, const std::string& field, const std::string& what) {
  return invalid_argument(source + ": " + field + ": " + what);
}

}  // namespace

Result<double> parse_bandwidth(const json& v, const std::string& field) {
  double bps = 0;
  if (v.is_number()) {
    bps = v.get<double>();
  } else {
    auto r = v.is_string() ? parse_rate_bps(v.get<std::string>(), "bandwidth") : Result<double>(invalid_argument(""));
    if (!r.ok())
      return invalid_argument(field + ": '" + (v.is_string() ? v.get<std::string>() : v.dump()) +
                              "' is not a bandwidth (bits/s: a number, or \"100M\", \"1.5G\", \"800k\")");
    bps = *r;
  }
  if (!(bps > 0) || !std::isfinite(bps)) return invalid_argument(field + ": a bandwidth must be > 0, got " + v.dump());
  return bps;
}

Result<double> parse_latency(const json& v, const std::string& field, bool plain_seconds) {
  double s = 0;
  if (v.is_number()) {
    s = v.get<double>();
    if (!plain_seconds && s != 0)
      return invalid_argument(field + ": " + v.dump() + " has no unit: write \"" + v.dump() + "ms\", \"" + v.dump() +
                              "s\" or \"" + v.dump() + "us\" (plain seconds only in links.matrix, as probe writes it)");
  } else if (!v.is_string()) {
    return invalid_argument(field + ": " + v.dump() + " is not a latency (\"40ms\", \"50us\", \"0.1s\")");
  } else {
    const std::string text = v.get<std::string>();
    auto r = parse_duration_s(text, "latency");
    if (!r.ok() && r.status().message().find("has no unit") != std::string::npos)
      return Status(r.status()).prepend(field);
    if (!r.ok()) return invalid_argument(field + ": '" + text + "' is not a latency (\"40ms\", \"50us\", \"0.1s\")");
    s = *r;
  }
  if (!(s >= 0) || s > 3600) return invalid_argument(field + ": a latency must be in [0, 3600] s, got " + v.dump());
  return s;
}

Cluster Cluster::uniform(int n, double gflops, double bandwidth_bps, double latency_s) {
  Cluster c;
  for (int i = 0; i < n; ++i) c.workers_.push_back({"w" + std::to_string(i), "", gflops, 0});
  c.bandwidth_.assign(size_t(n) * size_t(n), bandwidth_bps);
  c.latency_.assign(size_t(n) * size_t(n), latency_s);
  return c;
}

void Cluster::set_link(int from, int to, double bandwidth_bps, double latency_s) {
  bandwidth_.at(size_t(from) * workers_.size() + size_t(to)) = bandwidth_bps;
  latency_.at(size_t(from) * workers_.size() + size_t(to)) = latency_s;
}

namespace {

// workers[i] of a cluster file: one worker, or `count` of them named NAME0, NAME1, …, appended to `workers` (and
// their names to `by_name`).
Status read_worker(const json& j, size_t i, const std::string& source, std::vector<ClusterWorker>* workers,
                   std::map<std::string, int>* by_name) {
  constexpr int kMaxWorkers = 100000;
  const json& w = j["workers"][i];
  const std::string f = "workers[" + std::to_string(i) + "]";
  if (!w.is_object()) return field_error(source, f, "must be an object");
  for (const auto& [key, _] : w.items())
    if (key != "name" && key != "site" && key != "gflops" && key != "memory_gb" && key != "count")
      return field_error(source, f + "." + key, "unknown field (name, site, gflops, memory_gb, count)");
  ClusterWorker cw;
  if (!w.contains("gflops") || !w["gflops"].is_number() || !(w["gflops"].get<double>() > 0) ||
      !std::isfinite(w["gflops"].get<double>()))
    return field_error(source, f + ".gflops", "must be a number > 0 (the worker's measured GFLOP/s)");
  cw.gflops = w["gflops"].get<double>();
  if (w.contains("memory_gb")) {
    if (!w["memory_gb"].is_number() || !(w["memory_gb"].get<double>() >= 0))
      return field_error(source, f + ".memory_gb", "must be a number >= 0 (0: unknown)");
    cw.memory_gb = w["memory_gb"].get<double>();
  }
  if (w.contains("site")) {
    if (!w["site"].is_string()) return field_error(source, f + ".site", "must be a string");
    cw.site = w["site"].get<std::string>();
  }
  int count = 1;
  if (w.contains("count")) {
    if (!w["count"].is_number_integer() || w["count"].get<int64_t>() < 1 || w["count"].get<int64_t>() > kMaxWorkers)
      return field_error(source, f + ".count", "must be an integer in [1, " + std::to_string(kMaxWorkers) + "]");
    count = w["count"].get<int>();
  }
  std::string name = "w" + std::to_string(workers->size());
  if (w.contains("name")) {
    if (!w["name"].is_string() || w["name"].get<std::string>().empty())
      return field_error(source, f + ".name", "must be a non-empty string");
    name = w["name"].get<std::string>();
  }
  for (int k = 0; k < count; ++k) {
    cw.name = count > 1 || w.contains("count") ? name + std::to_string(k) : name;
    if (!by_name->emplace(cw.name, int(workers->size())).second)
      return field_error(source, f + ".name", "'" + cw.name + "' names two workers");
    workers->push_back(cw);
    if (int(workers->size()) > kMaxWorkers)
      return field_error(source, "workers", "more than " + std::to_string(kMaxWorkers) + " workers");
  }
  return Status::Ok();
}

// A link's shape (links.default, a rule): its bandwidth and latency, each written with its unit.
Status read_link_shape(const json& o, const std::string& source, const std::string& f, double* bw, double* lat,
                       bool need_both) {
  if (!o.is_object()) return field_error(source, f, "must be an object with bandwidth and latency");
  if (need_both && (!o.contains("bandwidth") || !o.contains("latency")))
    return field_error(source, f, "needs both 'bandwidth' and 'latency'");
  if (!o.contains("bandwidth") && !o.contains("latency"))
    return field_error(source, f, "sets neither 'bandwidth' nor 'latency'");
  if (o.contains("bandwidth")) {
    auto b = parse_bandwidth(o["bandwidth"], source + ": " + f + ".bandwidth");
    if (!b.ok()) return b.status();
    *bw = *b;
  }
  if (o.contains("latency")) {
    auto l = parse_latency(o["latency"], source + ": " + f + ".latency", /*plain_seconds=*/false);
    if (!l.ok()) return l.status();
    *lat = *l;
  }
  return Status::Ok();
}

// links.matrix: a bandwidth and a latency per ordered pair of workers, each W×W.
Status read_link_matrix(const json& m, const std::string& source, size_t W, std::vector<double>* bandwidth,
                        std::vector<double>* latency) {
  if (!m.is_object() || !m.contains("bandwidth") || !m.contains("latency"))
    return field_error(source, "links.matrix", "must be an object with 'bandwidth' and 'latency', each W×W");
  for (const char* what : {"bandwidth", "latency"}) {
    const std::string f = std::string("links.matrix.") + what;
    const json& rows = m[what];
    if (!rows.is_array() || rows.size() != W)
      return field_error(source, f, "must have one row per worker (" + std::to_string(W) + ")");
    for (size_t a = 0; a < W; ++a) {
      if (!rows[a].is_array() || rows[a].size() != W)
        return field_error(source, f + "[" + std::to_string(a) + "]",
                           "must have one entry per worker (" + std::to_string(W) + ")");
      for (size_t b = 0; b < W; ++b) {
        if (a == b) continue;  // a worker's link to itself is not used
        const std::string fe = source + ": " + f + "[" + std::to_string(a) + "][" + std::to_string(b) + "]";
        auto v =
            what[0] == 'b' ? parse_bandwidth(rows[a][b], fe) : parse_latency(rows[a][b], fe, /*plain_seconds=*/true);
        if (!v.ok()) return v.status();
        (what[0] == 'b' ? *bandwidth : *latency)[a * W + b] = *v;
      }
    }
  }
  return Status::Ok();
}

// The workers a rule's end names: a worker's name or a site's.
Result<std::vector<int>> rule_members(const std::vector<ClusterWorker>& workers,
                                      const std::map<std::string, int>& by_name, const std::string& source,
                                      const json& v, const std::string& ff) {
  const size_t W = workers.size();
  if (!v.is_string()) return field_error(source, ff, "must be a worker's name or a site");
  const std::string n = v.get<std::string>();
  std::vector<int> out;
  if (auto it = by_name.find(n); it != by_name.end()) out.push_back(it->second);
  for (size_t w = 0; w < W; ++w)
    if (workers[w].site == n && (out.empty() || out[0] != int(w))) out.push_back(int(w));
  if (out.empty()) return field_error(source, ff, "'" + n + "' is neither a worker's name nor a site");
  return out;
}

// links.rules[i] (`f`): within a group, between two, or from one to another, a bandwidth and/or latency over the
// matrix or default.
Status apply_link_rule(const json& r, const std::string& f, const std::string& source,
                       const std::vector<ClusterWorker>& workers, const std::map<std::string, int>& by_name,
                       std::vector<double>* bandwidth, std::vector<double>* latency) {
  const size_t W = workers.size();
  if (!r.is_object()) return field_error(source, f, "must be an object");
  for (const auto& [key, _] : r.items())
    if (key != "within" && key != "between" && key != "from" && key != "to" && key != "bandwidth" && key != "latency")
      return field_error(source, f + "." + key, "unknown field (within, between, from, to, bandwidth, latency)");
  std::vector<std::pair<std::vector<int>, std::vector<int>>> sides;  // (senders, receivers)
  const int forms =
      int(r.contains("within")) + int(r.contains("between")) + int(r.contains("from") || r.contains("to"));
  if (forms != 1) return field_error(source, f, "needs exactly one of 'within', 'between', or 'from' with 'to'");
  if (r.contains("within")) {
    LH_ASSIGN_OR_RETURN(auto m, rule_members(workers, by_name, source, r["within"], f + ".within"));
    sides.push_back({m, m});
  } else if (r.contains("between")) {
    if (!r["between"].is_array() || r["between"].size() != 2)
      return field_error(source, f + ".between", "must be two names or sites, [\"a\", \"b\"]");
    LH_ASSIGN_OR_RETURN(auto a, rule_members(workers, by_name, source, r["between"][0], f + ".between[0]"));
    LH_ASSIGN_OR_RETURN(auto b, rule_members(workers, by_name, source, r["between"][1], f + ".between[1]"));
    sides.push_back({a, b});
    sides.push_back({b, a});
  } else {
    if (!r.contains("from") || !r.contains("to")) return field_error(source, f, "'from' and 'to' go together");
    LH_ASSIGN_OR_RETURN(auto a, rule_members(workers, by_name, source, r["from"], f + ".from"));
    LH_ASSIGN_OR_RETURN(auto b, rule_members(workers, by_name, source, r["to"], f + ".to"));
    sides.push_back({a, b});
  }
  double bw = -1, lat = -1;
  LH_RETURN_IF_ERROR(read_link_shape(r, source, f, &bw, &lat, false));
  for (const auto& [from, to] : sides)
    for (int a : from)
      for (int b : to) {
        if (a == b) continue;
        if (bw > 0) (*bandwidth)[size_t(a) * W + size_t(b)] = bw;
        if (lat >= 0) (*latency)[size_t(a) * W + size_t(b)] = lat;
      }
  return Status::Ok();
}

}  // namespace

Result<Cluster> Cluster::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) return field_error(source, "(top level)", "must be an object with 'workers' and 'links'");
  for (const auto& [key, _] : j.items())
    if (key != "workers" && key != "links")
      return field_error(source, key, "unknown field (a cluster has 'workers' and 'links')");
  if (!j.contains("workers") || !j["workers"].is_array() || j["workers"].empty())
    return field_error(source, "workers", "must be a non-empty array of workers");
  Cluster c;
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < j["workers"].size(); ++i) LH_RETURN_IF_ERROR(read_worker(j, i, source, &c.workers_, &by_name));
  const size_t W = c.workers_.size();
  if (!j.contains("links") || !j["links"].is_object())
    return field_error(source, "links", "must be an object with 'default' and/or 'matrix' (and optional 'rules')");
  const json& links = j["links"];
  for (const auto& [key, _] : links.items())
    if (key != "default" && key != "matrix" && key != "rules")
      return field_error(source, "links." + key, "unknown field (default, matrix, rules)");
  if (!links.contains("default") && !links.contains("matrix"))
    return field_error(source, "links", "needs 'default' (every link) or 'matrix' (each pair)");
  c.bandwidth_.assign(W * W, 0);
  c.latency_.assign(W * W, 0);
  if (links.contains("default")) {
    double bw = 0, lat = 0;
    LH_RETURN_IF_ERROR(read_link_shape(links["default"], source, "links.default", &bw, &lat, true));
    c.bandwidth_.assign(W * W, bw);
    c.latency_.assign(W * W, lat);
  }
  if (links.contains("matrix"))
    LH_RETURN_IF_ERROR(read_link_matrix(links["matrix"], source, W, &c.bandwidth_, &c.latency_));
  if (links.contains("rules")) {
    if (!links["rules"].is_array()) return field_error(source, "links.rules", "must be an array");
    for (size_t i = 0; i < links["rules"].size(); ++i)
      LH_RETURN_IF_ERROR(apply_link_rule(links["rules"][i], "links.rules[" + std::to_string(i) + "]", source,
                                         c.workers_, by_name, &c.bandwidth_, &c.latency_));
  }
  if (!links.contains("default"))  // a matrix alone must cover every pair (a rule may have filled some)
    for (size_t a = 0; a < W; ++a)
      for (size_t b = 0; b < W; ++b)
        if (a != b && !(c.bandwidth_[a * W + b] > 0))
          return field_error(source, "links.matrix",
                             "no bandwidth from worker " + std::to_string(a) + " to " + std::to_string(b));
  return c;
}

Result<Cluster> Cluster::parse(const std::string& text, bool yaml, const std::string& source) {
  json j;
  if (yaml) {
    try {
      j = yaml_to_json(YAML::Load(text));
    } catch (const YAML::Exception& e) {
      return invalid_argument(source + ": not valid YAML: " + e.what());
    }
  } else {
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      return invalid_argument(source + ": not valid JSON: " + e.what());
    }
  }
  return from_json(j, source);
}

Result<Cluster> Cluster::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cluster file " + path + ": cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  auto ends_with = [&](const char* ext) {
    const std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  return parse(ss.str(), ends_with(".yaml") || ends_with(".yml"), path);
}

json Cluster::to_json() const {
  json workers = json::array();
  for (const auto& w : workers_) {
    json o = {{"name", w.name}, {"gflops", w.gflops}};
    if (!w.site.empty()) o["site"] = w.site;
    if (w.memory_gb > 0) o["memory_gb"] = w.memory_gb;
    workers.push_back(o);
  }
  const size_t W = workers_.size();
  json bw = json::array(), lat = json::array();
  for (size_t a = 0; a < W; ++a) {
    json rb = json::array(), rl = json::array();
    for (size_t b = 0; b < W; ++b) {
      rb.push_back(a == b ? 0.0 : bandwidth_[a * W + b]);
      rl.push_back(a == b ? 0.0 : latency_[a * W + b]);
    }
    bw.push_back(rb);
    lat.push_back(rl);
  }
  return {{"workers", workers}, {"links", {{"matrix", {{"bandwidth", bw}, {"latency", lat}}}}}};
}

}  // namespace lh
