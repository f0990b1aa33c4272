// defines: lh::CodecPlan (which codec spec each pipeline link uses, forward and backward, from
// --compress-fwd/--compress-bwd and --compress-link overrides) and lh::CodecSchedule (live
// set-codec changes that take effect at a step boundary on both ends). Used by launch, the
// coordinator, workers' StageRunner and `ctl`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/role.h"
#include "core/status.h"
#include "grid/topology.h"

namespace lh {

// LinkDir (fwd, bwd), parse_link_dir and link_dir_name are core/role.h's.

// Checks one codec spec string ("int8", "lowrank:rank=8+int8"); returns an error naming the bad
// token. Injectable so tests and tools can narrow what a job accepts.
using CodecSpecCheck = std::function<Status(const std::string& spec)>;
// The default check: compress's parse_codec_spec, so the list of codecs lives in one place, less what a job's links
// cannot run (delta: they send no sample ids).
Status check_codec_spec(const std::string& spec);

// One --compress-link value, "LINK:DIR=SPEC", e.g. "1-2:fwd=int4" or "0-1:bwd=topk:ratio=0.1+int8".
struct LinkCodecOverride {
  PipelineLink link;
  LinkDir dir = LinkDir::kFwd;
  std::string spec;
};
Result<LinkCodecOverride> parse_link_override(const std::string& text, const Topology& topology,
                                              const CodecSpecCheck& check = check_codec_spec);

// The codec spec of every (pipeline link, direction) at the start of a job.
class CodecPlan {
 public:
  // fwd_spec/bwd_spec apply to every link; each override replaces one link direction (a later
  // override of the same link direction wins). Every spec goes through `check`.
  static Result<CodecPlan> create(const Topology& topology, const std::string& fwd_spec, const std::string& bwd_spec,
                                  const std::vector<std::string>& overrides,
                                  const CodecSpecCheck& check = check_codec_spec);

  const std::string& spec(const PipelineLink& link, LinkDir dir) const;
  const std::vector<PipelineLink>& links() const { return links_; }
  // "0-1 fwd=int8 bwd=int8; 1-2 fwd=int4 bwd=int8" (or "no pipeline links").
  std::string describe() const;

 private:
  CodecPlan() = default;
  std::vector<PipelineLink> links_;
  std::map<std::pair<int, int>, std::string> specs_;  // (link.from, dir) → spec
  friend class CodecSchedule;
};

// A change of one link direction's codec, effective from `from_step` (inclusive) on both ends.
struct CodecChange {
  PipelineLink link;
  LinkDir dir = LinkDir::kFwd;
  std::string spec;
  int64_t from_step = 0;
};

// The codec history of a job: the initial plan plus live changes. The coordinator and every worker
// hold one; the coordinator decides from_step (the next step boundary) and tells the workers, so
// both ends of a link switch at the same step whatever the message delays are, as long as the
// SetCodec message arrives before that step begins (the coordinator's barrier ensures it).
class CodecSchedule {
 public:
  CodecSchedule(const Topology& topology, CodecPlan initial, CodecSpecCheck check = check_codec_spec);

  // Marks `step` as begun: changes can no longer take effect at or before it. Steps only go up.
  Status begin_step(int64_t step);
  // The last step begun, or −1 before the first.
  int64_t current_step() const { return current_step_; }

  // Records a change from `from_step`. Refused (with the reason) when the link or spec is bad, when
  // from_step has already begun, or when the same link direction already has a change scheduled
  // after from_step (history is never rewritten). A second change at the same step replaces the first.
  Status schedule_change(const CodecChange& change);
  // A user's set-codec: "1-2", "fwd", "int4" → scheduled at the next step boundary; returns it.
  Result<CodecChange> request_change(const std::string& link, const std::string& dir, const std::string& spec);

  // The spec in force on the link direction during `step`.
  const std::string& spec_at(const PipelineLink& link, LinkDir dir, int64_t step) const;
  // Every change in the order of (from_step, link, dir); and those that start exactly at `step`.
  std::vector<CodecChange> changes() const;
  std::vector<CodecChange> changes_at(int64_t step) const;
  const CodecPlan& initial() const { return initial_; }

 private:
  Topology topology_;
  CodecPlan initial_;
  CodecSpecCheck check_;
  int64_t current_step_ = -1;
  // (link.from, dir) → from_step → spec, ascending.
  std::map<std::pair<int, int>, std::map<int64_t, std::string>> changes_;
};

}  // namespace lh
