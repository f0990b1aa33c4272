// Names of directed worker pairs. Used by runtime/stage_runner.cpp (metrics) and the tests.
#include "grid/link_name.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include "core/role.h"
#include "grid/parse_number.h"

namespace lh {
namespace {

// One end, with the axes the pair needs: a bare stage number when only the stage axis is printed.
std::string end_name(const Topology& t, const WorkerCoord& c, bool stage, bool dp, bool tp) {
  if (!dp && !tp) return std::to_string(c.stage);
  std::string s;
  if (stage) s += "s" + std::to_string(c.stage);
  if (dp) s += "d" + std::to_string(c.dp);
  if (tp) s += "t" + std::to_string(c.tp);
  return s;
}

}  // namespace

namespace {

// One end: the coordinates it names (-1: not named).
struct End {
  int stage = -1, dp = -1, tp = -1;
};

Result<End> parse_end(const std::string& text, const std::string& where) {
  End e;
  if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) {
    auto s = parse_int(text, where + ": stage");
    if (!s.ok()) return s.status();
    e.stage = *s;
    return e;
  }
  size_t i = 0;
  int last_axis = -1;
  while (i < text.size()) {
    const char axis = text[i];
    const int order = axis == 's' ? 0 : axis == 'd' ? 1 : axis == 't' ? 2 : -1;
    if (order < 0 || order <= last_axis)
      return invalid_argument(where + ": end '" + text + "' is not STAGE or [sN][dN][tN] (in that order)");
    size_t j = i + 1;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i + 1)
      return invalid_argument(where + ": '" + std::string(1, axis) + "' in '" + text + "' needs a number");
    auto v = parse_int(text.substr(i + 1, j - i - 1), where);
    if (!v.ok()) return v.status();
    (order == 0 ? e.stage : order == 1 ? e.dp : e.tp) = *v;
    last_axis = order;
    i = j;
  }
  if (last_axis < 0) return invalid_argument(where + ": an end of the link is empty");
  return e;
}

}  // namespace

Result<LinkSelection> parse_link_selector(const Topology& t, const std::string& text) {
  const std::string where = "link '" + text + "'";
  std::string name = text, dir;
  if (const size_t colon = text.find(':'); colon != std::string::npos) {
    name = text.substr(0, colon);
    dir = text.substr(colon + 1);
    if (!parse_link_dir(dir).ok()) return invalid_argument(where + ": direction '" + dir + "' is not fwd or bwd");
  }
  const size_t dash = name.find('-');
  if (dash == std::string::npos) return invalid_argument(where + ": expected END-END, e.g. 0-1 or s0d0-s0d1");
  // The errors below are the user's, not ours: they carry no [file:line].
  auto end_a = parse_end(name.substr(0, dash), where);
  if (!end_a.ok()) return end_a.status();
  auto end_b = parse_end(name.substr(dash + 1), where);
  if (!end_b.ok()) return end_b.status();
  const End a = *end_a, b = *end_b;
  if ((a.stage < 0) != (b.stage < 0) || (a.dp < 0) != (b.dp < 0) || (a.tp < 0) != (b.tp < 0))
    return invalid_argument(where + ": both ends must name the same axes");
  auto check = [&](int v, int size, const char* axis) -> Status {
    if (v >= size)
      return invalid_argument(where + ": " + axis + " " + std::to_string(v) + " is outside this job (" + t.describe() +
                              ")");
    return Status::Ok();
  };
  for (const End& e : {a, b})
    for (Status s : {check(e.stage, t.pp(), "stage"), check(e.dp, t.dp(), "replica"), check(e.tp, t.tp(), "shard")})
      if (!s.ok()) return s;
  const int differ = (a.stage != b.stage) + (a.dp != b.dp) + (a.tp != b.tp);
  LinkSelection sel;
  if (differ == 0) return invalid_argument(where + ": both ends are the same workers");
  if (differ == 1) {
    const bool low_first = a.stage < b.stage || a.dp < b.dp || a.tp < b.tp;
    if (!low_first)
      return invalid_argument(
          where + ": write the low end first" + (a.stage != b.stage ? ", stages in forward order" : std::string()) +
          " (" + name.substr(dash + 1) + "-" + name.substr(0, dash) + ") and choose the direction with :fwd or :bwd");
    if (a.stage != b.stage) {
      if (b.stage != a.stage + 1)
        return invalid_argument(where + ": stages " + std::to_string(a.stage) + " and " + std::to_string(b.stage) +
                                " are not neighbours");
      sel.kind = "pipeline";
    } else {
      sel.kind = a.dp != b.dp ? "dp" : "tp";
    }
  } else {
    if ((t.pp() > 1 && a.stage < 0) || (t.dp() > 1 && a.dp < 0) || (t.tp() > 1 && a.tp < 0))
      return invalid_argument(where + ": ends that differ in more than one axis must name every axis of the job");
    sel.kind = "cross";
  }
  // Expand the wildcards: every worker pair with the named coordinates.
  for (int s = 0; s < t.pp(); ++s)
    for (int d = 0; d < t.dp(); ++d)
      for (int k = 0; k < t.tp(); ++k) {
        const WorkerCoord lo{a.stage < 0 ? s : a.stage, a.tp < 0 ? k : a.tp, a.dp < 0 ? d : a.dp};
        const WorkerCoord hi{b.stage < 0 ? s : b.stage, b.tp < 0 ? k : b.tp, b.dp < 0 ? d : b.dp};
        if ((a.stage >= 0 && s > 0) || (a.dp >= 0 && d > 0) || (a.tp >= 0 && k > 0)) continue;  // named: once
        const int l = t.rank_of(lo), h = t.rank_of(hi);
        if (dir != "bwd") sel.pairs.push_back({l, h});
        if (dir != "fwd") sel.pairs.push_back({h, l});
      }
  std::sort(sel.pairs.begin(), sel.pairs.end());
  return sel;
}

std::string link_kind(const Topology& t, int src, int dst) {
  const WorkerCoord a = t.coord_of(src), b = t.coord_of(dst);
  const bool same_stage = a.stage == b.stage, same_dp = a.dp == b.dp, same_tp = a.tp == b.tp;
  if (same_dp && same_tp && (a.stage - b.stage == 1 || b.stage - a.stage == 1)) return "pipeline";
  if (same_stage && same_tp && !same_dp) return "dp";
  if (same_stage && same_dp && !same_tp) return "tp";
  return "cross";
}

std::string link_name(const Topology& t, int src, int dst) {
  const WorkerCoord a = t.coord_of(src), b = t.coord_of(dst);
  const bool fwd = std::make_tuple(a.stage, a.dp, a.tp) < std::make_tuple(b.stage, b.dp, b.tp);
  const WorkerCoord& lo = fwd ? a : b;
  const WorkerCoord& hi = fwd ? b : a;
  const bool has_dp = t.dp() > 1, has_tp = t.tp() > 1;
  // Every axis of size > 1 is written, so a name is the same whichever kind of traffic it carries.
  const bool stage_axis = t.pp() > 1 || (!has_dp && !has_tp);
  return end_name(t, lo, stage_axis, has_dp, has_tp) + "-" + end_name(t, hi, stage_axis, has_dp, has_tp) +
         (fwd ? ":fwd" : ":bwd");
}

}  // namespace lh
