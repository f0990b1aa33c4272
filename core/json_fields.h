// defines: lh::JsonFields — the one reader for the fields of a JSON object longhaul loads (a checkpoint's job.json,
// the workers' metrics lines). Every error names where the object came from and the field's path:
// "WHERE: field 'PREFIX.NAME': what, got VALUE". Used by plan/job_config.cpp and metrics/step_metrics.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

class JsonFields {
 public:
  enum Need : bool { kOptional = false, kRequired = true };

  // shown_limit > 0 cuts a value quoted in an error to that many characters (a metrics line may be long).
  JsonFields(const nlohmann::json& obj, std::string where, std::string prefix = "", size_t shown_limit = 0)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)), shown_limit_(shown_limit) {}

  Status error(const std::string& field, const std::string& what) const {
    return invalid_argument(where_ + ": field '" + prefix_ + field + "': " + what);
  }
  static std::string shown(const nlohmann::json& v, size_t limit) {
    std::string s = v.dump();
    return limit > 3 && s.size() > limit ? s.substr(0, limit - 3) + "..." : s;
  }
  std::string shown(const nlohmann::json& v) const { return shown(v, shown_limit_); }
  const nlohmann::json* find(const std::string& field) const {
    auto it = obj_.find(field);
    return it == obj_.end() ? nullptr : &*it;
  }

  // An integer that fits Int (JSON integers only: 3.0 is refused).
  template <class Int>
  Status integer(const std::string& field, Int& out, Need need = kRequired) const {
    const nlohmann::json* v = find(field);
    if (!v) return absent(field, need);
    if (!v->is_number_integer()) return error(field, "expected an integer, got " + shown(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) return error(field, "out of range");
    const int64_t x = v->get<int64_t>();
    if (x < int64_t(std::numeric_limits<Int>::min()) ||
        (x > 0 && uint64_t(x) > uint64_t(std::numeric_limits<Int>::max())))
      return error(field, "out of range: " + shown(*v));
    out = static_cast<Int>(x);
    return Status::Ok();
  }
  // A non-negative integer, so byte counts and seeds are never rounded. Built (not parsed) JSON holds signed
  // integers even for values ≥ 0, so those count too.
  Status uint(const std::string& field, uint64_t& out, Need need = kRequired) const {
    const nlohmann::json* v = find(field);
    if (!v) return absent(field, need);
    if (v->is_number_unsigned()) {
      out = v->get<uint64_t>();
      return Status::Ok();
    }
    if (v->is_number_integer()) {
      if (v->get<int64_t>() < 0) return error(field, "must not be negative, got " + shown(*v));
      out = static_cast<uint64_t>(v->get<int64_t>());
      return Status::Ok();
    }
    return error(field, "expected a non-negative integer, got " + shown(*v));
  }
  // A finite number. Optional fields: absent or null leaves `out` as it is.
  Status number(const std::string& field, double& out, Need need = kRequired, bool min_zero = false) const {
    const nlohmann::json* v = find(field);
    if (!v || (need == kOptional && v->is_null())) return absent(field, need);
    if (!v->is_number()) return error(field, "expected a number, got " + shown(*v));
    const double x = v->get<double>();
    if (!std::isfinite(x)) return error(field, "expected a finite number, got " + shown(*v));
    if (min_zero && x < 0) return error(field, "must not be negative, got " + shown(*v));
    out = x;
    return Status::Ok();
  }
  Status number(const std::string& field, float& out, Need need = kRequired) const {
    double x = out;
    // Plain returns here and below: the error is the file's, and names its field; no [file:line] of ours.
    if (Status s = number(field, x, need); !s.ok()) return s;
    out = static_cast<float>(x);
    return Status::Ok();
  }
  Status number(const std::string& field, std::optional<double>& out, bool min_zero) const {
    double x = 0;
    const nlohmann::json* v = find(field);
    if (!v || v->is_null()) return Status::Ok();
    if (Status s = number(field, x, kOptional, min_zero); !s.ok()) return s;
    out = x;
    return Status::Ok();
  }
  Status boolean(const std::string& field, bool& out, Need need = kRequired) const {
    const nlohmann::json* v = find(field);
    if (!v) return absent(field, need);
    if (!v->is_boolean()) return error(field, "expected true or false, got " + shown(*v));
    out = v->get<bool>();
    return Status::Ok();
  }
  Status string(const std::string& field, std::string& out, Need need = kRequired) const {
    const nlohmann::json* v = find(field);
    if (!v) return absent(field, need);
    if (!v->is_string()) return error(field, "expected a string, got " + shown(*v));
    out = v->get<std::string>();
    return Status::Ok();
  }
  // At most 4096 int32 values.
  Status integers(const std::string& field, std::vector<int>& out, Need need = kRequired) const {
    const nlohmann::json* v = find(field);
    if (!v) return absent(field, need);
    if (!v->is_array() || v->size() > 4096) return error(field, "expected an array of integers, got " + shown(*v));
    std::vector<int> got;
    for (const auto& e : *v) {
      if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX)
        return error(field, "expected an array of integers, got " + shown(*v));
      got.push_back(e.get<int>());
    }
    out = std::move(got);
    return Status::Ok();
  }
  Status strings(const std::string& field, std::vector<std::string>& out, Need need = kRequired) const {
    const nlohmann::json* v = find(field);
    if (!v) return absent(field, need);
    if (!v->is_array()) return error(field, "expected an array of strings, got " + shown(*v));
    std::vector<std::string> got;
    for (const auto& e : *v) {
      if (!e.is_string()) return error(field, "expected an array of strings, got " + shown(*v));
      got.push_back(e.get<std::string>());
    }
    out = std::move(got);
    return Status::Ok();
  }

 private:
  Status absent(const std::string& field, Need need) const {
    return need == kRequired ? error(field, "missing") : Status::Ok();
  }

  const nlohmann::json& obj_;
  std::string where_, prefix_;
  size_t shown_limit_ = 0;
};

}  // namespace lh
