// defines: lh::LinkShapeRule — one `--link` entry of a job's emulated network: "RATE[,DELAY]" for every link, or
// "LINK[:DIR]=RATE[,DELAY]" for the links a selector names (docs/grid.md §1: "0-1", "1-2:bwd", "s0d0-s0d1") — and
// shapes_of(), which applies a job's rules in order to the links one rank sends on; and `--slowdown RANK=FACTOR`.
// Used by the job config (validation), the worker (its LinkShaper), the coordinator (`ctl set-link`) and launch.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "grid/topology.h"
#include "transport/link_shaper.h"

namespace lh {

struct LinkShapeRule {
  std::string selector;  // "" for every link
  LinkShape shape;
};
// Syntax only (a selector is checked against a grid by check_link_rules / shapes_of).
Result<LinkShapeRule> parse_link_rule(const std::string& text);

// What one rank's shaper does: `default_shape` on every link it sends on, but `per_peer` where a rule named it.
struct RankShapes {
  LinkShape default_shape;
  std::map<int, LinkShape> per_peer;
};
// The rules in order, a later one winning on the links it names (a rule without a selector names every link).
// Errors name the rule and what is wrong with it.
Result<RankShapes> shapes_of(const Topology& topology, int rank, const std::vector<std::string>& rules,
                             const LinkShape& base = {});
Status check_link_rules(const Topology& topology, const std::vector<std::string>& rules);
// "20 Mbit/s, 20 ms; 0-1:fwd 5 Mbit/s, 80 ms" (rules that do not parse are shown as given).
std::string describe_link_rules(const std::vector<std::string>& rules);

// `--slowdown RANK=FACTOR` entries: rank → factor (≥ 1; the rank's forward and backward compute takes FACTOR times
// as long: it sleeps (FACTOR − 1) × what it computed). Errors name the entry.
Result<std::map<int, double>> parse_slowdowns(const std::vector<std::string>& entries, int workers);

}  // namespace lh
