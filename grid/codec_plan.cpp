// Per-link codec plans from flags and overrides, and the step-aligned history of live codec changes.
// Used by launch, the coordinator, workers' StageRunner and `ctl`.
#include "grid/codec_plan.h"

#include <algorithm>
#include <iterator>
#include <tuple>

#include "compress/codec_chain.h"

namespace lh {

Status check_codec_spec(const std::string& spec) {
  auto chain = compress::parse_codec_spec(spec);
  if (!chain.ok()) return chain.status();
  // A job's links do not send sample ids with their packets, so delta could not run at the first step.
  if (chain->needs_sample_ids())
    return invalid_argument("'" + spec +
                            "': delta needs each sample's id with every packet, which a job's links do not send "
                            "(it runs in `bench codecs` only)");
  return Status::Ok();
}

namespace {

Status check_spec(const CodecSpecCheck& check, const std::string& spec, const std::string& where) {
  Status s = check ? check(spec) : check_codec_spec(spec);
  if (!s.ok()) s.prepend(where);
  return s;
}

std::pair<int, int> key(const PipelineLink& link, LinkDir dir) {
  return {link.from, static_cast<int>(dir)};
}

}  // namespace

Result<LinkCodecOverride> parse_link_override(const std::string& text, const Topology& topology,
                                              const CodecSpecCheck& check) {
  const std::string where = "--compress-link '" + text + "'";
  // The spec itself may hold ':' and '=' (topk:ratio=0.1), so split at the first of each.
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return invalid_argument(where + ": expected LINK:DIR=SPEC, e.g. 1-2:fwd=int4");
  const size_t eq = text.find('=', colon + 1);
  if (eq == std::string::npos)
    return invalid_argument(where + ": expected LINK:DIR=SPEC, e.g. 1-2:fwd=int4 (no '=' after the direction)");
  LinkCodecOverride o;
  auto link = topology.parse_link(text.substr(0, colon));
  if (!link.ok()) return Status(link.status()).prepend(where);
  o.link = *link;
  auto dir = parse_link_dir(text.substr(colon + 1, eq - colon - 1));
  if (!dir.ok()) return Status(dir.status()).prepend(where);
  o.dir = *dir;
  o.spec = text.substr(eq + 1);
  LH_RETURN_IF_ERROR(check_spec(check, o.spec, where));
  return o;
}

Result<CodecPlan> CodecPlan::create(const Topology& topology, const std::string& fwd_spec, const std::string& bwd_spec,
                                    const std::vector<std::string>& overrides, const CodecSpecCheck& check) {
  LH_RETURN_IF_ERROR(check_spec(check, fwd_spec, "--compress-fwd"));
  LH_RETURN_IF_ERROR(check_spec(check, bwd_spec, "--compress-bwd"));
  CodecPlan plan;
  plan.links_ = topology.pipeline_links();
  for (const PipelineLink& l : plan.links_) {
    plan.specs_[key(l, LinkDir::kFwd)] = fwd_spec;
    plan.specs_[key(l, LinkDir::kBwd)] = bwd_spec;
  }
  for (const std::string& text : overrides) {
    LH_ASSIGN_OR_RETURN(LinkCodecOverride o, parse_link_override(text, topology, check));
    plan.specs_[key(o.link, o.dir)] = o.spec;
  }
  return plan;
}

const std::string& CodecPlan::spec(const PipelineLink& link, LinkDir dir) const {
  auto it = specs_.find(key(link, dir));
  LH_ASSERT(it != specs_.end(), "link " + link.name() + " is not in the codec plan");
  return it->second;
}

std::string CodecPlan::describe() const {
  if (links_.empty()) return "no pipeline links";
  std::string out;
  for (const PipelineLink& l : links_) {
    if (!out.empty()) out += "; ";
    out += l.name() + " fwd=" + spec(l, LinkDir::kFwd) + " bwd=" + spec(l, LinkDir::kBwd);
  }
  return out;
}

CodecSchedule::CodecSchedule(const Topology& topology, CodecPlan initial, CodecSpecCheck check)
    : topology_(topology), initial_(std::move(initial)), check_(std::move(check)) {}

Status CodecSchedule::begin_step(int64_t step) {
  if (step < 0) return invalid_argument("codec schedule: step " + std::to_string(step) + " is negative");
  if (step < current_step_)
    return invalid_argument("codec schedule: step " + std::to_string(step) + " begins after step " +
                            std::to_string(current_step_) + "; steps only go forward");
  current_step_ = step;
  return Status::Ok();
}

Status CodecSchedule::schedule_change(const CodecChange& change) {
  const std::string what = "set-codec " + change.link.name() + " " + link_dir_name(change.dir);
  bool known = false;
  for (const PipelineLink& l : initial_.links()) known |= l == change.link;
  if (!known)
    return invalid_argument(what + ": not a pipeline link of this job; links: " + link_list_string(initial_.links()));
  LH_RETURN_IF_ERROR(check_spec(check_, change.spec, what));
  if (change.from_step <= current_step_)
    return invalid_argument(what + ": step " + std::to_string(change.from_step) + " has already begun; the earliest " +
                            "step a change can take effect is " + std::to_string(current_step_ + 1));
  auto& history = changes_[key(change.link, change.dir)];
  if (!history.empty() && history.rbegin()->first > change.from_step)
    return invalid_argument(what + ": a change is already scheduled at step " +
                            std::to_string(history.rbegin()->first) + ", after step " +
                            std::to_string(change.from_step));
  history[change.from_step] = change.spec;
  return Status::Ok();
}

Result<CodecChange> CodecSchedule::request_change(const std::string& link, const std::string& dir,
                                                  const std::string& spec) {
  CodecChange c;
  LH_ASSIGN_OR_RETURN(c.link, topology_.parse_link(link));
  LH_ASSIGN_OR_RETURN(c.dir, parse_link_dir(dir));
  c.spec = spec;
  c.from_step = current_step_ + 1;
  LH_RETURN_IF_ERROR(schedule_change(c));
  return c;
}

const std::string& CodecSchedule::spec_at(const PipelineLink& link, LinkDir dir, int64_t step) const {
  auto it = changes_.find(key(link, dir));
  if (it != changes_.end()) {
    auto after = it->second.upper_bound(step);  // first change strictly after `step`
    if (after != it->second.begin()) return std::prev(after)->second;
  }
  return initial_.spec(link, dir);
}

std::vector<CodecChange> CodecSchedule::changes() const {
  std::vector<CodecChange> out;
  for (const auto& [k, history] : changes_)
    for (const auto& [step, spec] : history)
      out.push_back({PipelineLink{k.first, k.first + 1}, static_cast<LinkDir>(k.second), spec, step});
  std::sort(out.begin(), out.end(), [](const CodecChange& a, const CodecChange& b) {
    return std::make_tuple(a.from_step, a.link.from, int(a.dir)) <
           std::make_tuple(b.from_step, b.link.from, int(b.dir));
  });
  return out;
}

std::vector<CodecChange> CodecSchedule::changes_at(int64_t step) const {
  std::vector<CodecChange> out;
  for (const CodecChange& c : changes())
    if (c.from_step == step) out.push_back(c);
  return out;
}

}  // namespace lh
