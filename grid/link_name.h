// defines: lh::link_name — the one name of every directed worker pair a job uses (docs/grid.md §1): pipeline pairs
// by stage ("0-1:fwd", "s0d1-s1d1:bwd"), data-parallel pairs by replica ("s0d0-s0d1:fwd"), tensor-parallel pairs
// by shard ("s1t0-s1t1:bwd"), anything else by full coordinates. Axes of size 1 are left out, so a pipeline-only
// job keeps its stage names. Used by the worker's metrics (each link row carries it), the table and `report`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "grid/topology.h"

namespace lh {

// "A-B:DIR" for traffic from rank `src` to rank `dst`: the ends are written low → high (stage, then replica,
// then shard) and DIR is fwd when src is the low end, bwd when it is the high end. Asserts on ranks outside
// the grid (our own invariant: the meter only sees the plan's ranks); src == dst is not a link.
std::string link_name(const Topology& topology, int src, int dst);

// The kind of a pair: "pipeline" (adjacent stages, same replica and shard), "dp" (same stage and shard),
// "tp" (same stage and replica), or "cross" (anything else, e.g. the norm between non-neighbours).
std::string link_kind(const Topology& topology, int src, int dst);

// What a link selector names: its kind and every directed pair it covers.
struct LinkSelection {
  std::string kind;                        // pipeline | dp | tp | cross
  std::vector<std::pair<int, int>> pairs;  // (src, dst) ranks, in rank order
};
// Parses LINK[:DIR] (docs/grid.md §1): LINK := END-END, END := STAGE | [sN][dN][tN]; an axis named on neither end
// is a wildcard; the ends differ in exactly one axis (pipeline: adjacent stages, written in forward order; dp:
// replicas; tp: shards) or name full coordinates (cross). DIR fwd is low end → high end, bwd the reverse, none both.
// Errors name the text and what is wrong with it.
Result<LinkSelection> parse_link_selector(const Topology& topology, const std::string& text);

}  // namespace lh
