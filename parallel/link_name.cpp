// Names of directed worker pairs. Used by parallel/stage_runner.cpp (metrics) and the tests.
#include "parallel/link_name.h"

#include <tuple>

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
