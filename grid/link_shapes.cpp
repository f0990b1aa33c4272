// Link shape rules (`--link`, `ctl set-link`) applied to a rank's outgoing links, and `--slowdown` entries.
#include "grid/link_shapes.h"

#include <cmath>

#include "grid/link_name.h"
#include "grid/parse_number.h"

namespace lh {

Result<LinkShapeRule> parse_link_rule(const std::string& text) {
  LinkShapeRule r;
  const size_t eq = text.find('=');
  std::string shape = text;
  if (eq != std::string::npos) {
    r.selector = text.substr(0, eq);
    shape = text.substr(eq + 1);
    if (r.selector.empty())
      return invalid_argument("link rule '" + text + "': nothing before '=' (expected LINK=RATE)");
  }
  auto s = parse_link_shape(shape);
  if (!s.ok()) return Status(s.status()).prepend("link rule '" + text + "'");
  r.shape = *s;
  return r;
}

Result<RankShapes> shapes_of(const Topology& topology, int rank, const std::vector<std::string>& rules,
                             const LinkShape& base) {
  RankShapes out;
  out.default_shape = base;
  for (const std::string& text : rules) {
    LH_ASSIGN_OR_RETURN(LinkShapeRule r, parse_link_rule(text));
    if (r.selector.empty()) {
      out.default_shape = r.shape;
      out.per_peer.clear();
      continue;
    }
    auto sel = parse_link_selector(topology, r.selector);
    if (!sel.ok()) return Status(sel.status()).prepend("link rule '" + text + "'");
    for (const auto& [src, dst] : sel->pairs)
      if (src == rank) out.per_peer[dst] = r.shape;
  }
  return out;
}

Status check_link_rules(const Topology& topology, const std::vector<std::string>& rules) {
  return shapes_of(topology, 0, rules).status();
}

std::string describe_link_rules(const std::vector<std::string>& rules) {
  std::string out;
  for (const std::string& text : rules) {
    auto r = parse_link_rule(text);
    out += out.empty() ? "" : "; ";
    out += !r.ok() ? text : r->selector.empty() ? r->shape.to_string() : r->selector + " " + r->shape.to_string();
  }
  return out;
}

Result<std::map<int, double>> parse_slowdowns(const std::vector<std::string>& entries, int workers) {
  std::map<int, double> out;
  for (const std::string& e : entries) {
    const std::string where = "--slowdown '" + e + "'";
    const size_t eq = e.find('=');
    if (eq == std::string::npos) return invalid_argument(where + ": expected RANK=FACTOR, e.g. 1=2.5");
    auto rank = parse_int64(e.substr(0, eq), "rank");
    if (!rank.ok() || *rank < 0 || *rank >= workers)
      return invalid_argument(where + ": the rank must be a worker of the job, 0.." + std::to_string(workers - 1));
    auto factor = parse_double(e.substr(eq + 1), "factor");
    if (!factor.ok() || !std::isfinite(*factor) || *factor < 1 || *factor > 1000)
      return invalid_argument(where + ": the factor must be a number from 1 to 1000 (how many times slower)");
    if (out.count(int(*rank))) return invalid_argument(where + ": rank " + std::to_string(*rank) + " given twice");
    out[int(*rank)] = *factor;
  }
  return out;
}

}  // namespace lh
