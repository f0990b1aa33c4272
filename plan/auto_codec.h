// defines: lh::AutoCodec — adaptive compression (`--compress-fwd auto`, `--compress-bwd auto`, `--compress-link
// LINK:DIR=auto`, `--compress-grad auto`, `--compress-tp auto`): from what the job measured over the last `every` steps
// (each link's rate and latency as its sender's meter saw them, each stage's compute per microbatch) it picks codecs
// of a ladder, with hysteresis: a pipeline's auto links together by the step the pipeline simulator predicts
// (choose_jointly), a gradient exchange by a share of the compute it overlaps (choose_auto_codec), tp sums by the step
// (choose_step_codec). Each choice is an lh::AutoDecision (metrics/auto_decision.h). Used by JobCoordinator.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "grid/pipeline_schedule.h"
#include "grid/pipeline_sim.h"
#include "grid/topology.h"
#include "metrics/auto_decision.h"
#include "metrics/step_metrics.h"

namespace lh {

struct AutoCodecConfig {
  // Least to most lossy; every entry a valid activation codec spec.
  std::vector<std::string> ladder = {"none", "bf16", "int8", "int4"};
  int every = 10;  // steps between decisions
  // A transfer "fits" when it takes at most this share of the pace. Under 1: in a 1F1B step each link's transfer also
  // sits on the critical path while the pipeline fills and drains, so hiding it needs headroom (scripts/bench_auto.sh).
  double fit = 0.5;
  // Hysteresis: a less lossy codec is taken only when its transfer fits in this share of the compute; the current
  // one is kept while it fits in all of it. So a link near the boundary does not flap.
  double relax = 0.7;
  // A switch is made once this many decisions in a row chose it (a noisy window alone moves nothing). A link's first
  // move, away from the ladder's first codec it started on untested, needs no confirmation.
  int confirm = 2;
  // Tokens of one step (the global batch), for the step time of links that overlap no compute.
  double tokens_per_step = 0;
  // The job's pipeline, when its auto links are stage boundaries: each choice is then the planner's (the pipeline
  // simulator's step, with every auto link's measured rate and latency and each stage's measured compute) instead of a
  // share of the pace: per link, the least lossy codec whose predicted step is within step_tolerance of the fastest
  // codec's (within relax × step_tolerance for a less lossy one than the current). Unset: the share of the pace.
  struct Pipeline {
    ScheduleKind kind = ScheduleKind::k1F1B;
    int stages = 0;
    std::map<int, int> stage_of;  // rank → its stage
  };
  std::optional<Pipeline> pipeline;
  double step_tolerance = 0.05;  // --auto-tolerance
  // How much the measured bandwidth, latency or compute must change (a ratio: 0.25 is ±25%) before auto goes back to
  // a codec it left: the same measurements cannot make both choices right.
  double changed = 0.25;
};
// "none,bf16,int8,int4" → the ladder, each spec checked. Errors name the entry.
// `check` (default: an activation codec) and `flag` (in errors) serve --auto-grad-ladder too.
Result<std::vector<std::string>> parse_auto_ladder(const std::string& text,
                                                   const std::function<Status(const std::string&)>& check = {},
                                                   const std::string& flag = "--auto-ladder");
// The --auto-grad-ladder: parse_auto_ladder with each entry a gradient codec (check_grad_codec_spec).
Result<std::vector<std::string>> parse_auto_grad_ladder(const std::string& text);
// The --auto-tp-ladder: parse_auto_ladder under that flag's name.
Result<std::vector<std::string>> parse_auto_tp_ladder(const std::string& text);

// The choice for one link and direction, given the bytes per microbatch of every ladder entry.
struct AutoChoice {
  int index = 0;
  double transfer_s = 0;  // per microbatch, with the chosen codec
  std::string reason;
};
// A transfer fits when it takes at most `fit` × compute_s_per_mb (see AutoCodecConfig).
AutoChoice choose_auto_codec(const std::vector<uint64_t>& bytes_per_mb, int current, double bandwidth_bps,
                             double compute_s_per_mb, double relax, double fit = 1.0);

// The choice for a transfer that overlaps no compute (tp partial sums): every op of the step waits for it, so the
// step is what is minimised within the ladder (the loss budget). `ops_per_step` transfers of bytes_per_op[i] each;
// `step_s` the measured step with the `current` codec. The least lossy whose predicted step is within `tolerance` of
// the fastest codec's; a less lossy one than the current only within relax × tolerance (hysteresis).
AutoChoice choose_step_codec(const std::vector<uint64_t>& bytes_per_op, int current, double bandwidth_bps,
                             int64_t ops_per_step, double step_s, double relax, double tolerance = 0.05);

// The codecs of several links chosen together by the step they make: link k has sizes[k] ladder entries (least lossy
// first) and is on current[k]; step(choice) predicts the step with link k on entry choice[k]. First the fastest
// choice (each link in turn moved to the entry that shortens the step most, until none does), then each link in turn
// on the least lossy entry that keeps the whole step within `tolerance` of the fastest's (relax · tolerance for an
// entry less lossy than its current one: hysteresis): the links share the tolerance. Used by AutoCodec with the
// pipeline simulator and by the planner's --evaluate with its model of the job.
struct JointChoice {
  std::vector<int> index;
  double fastest_s = 0;  // the fastest choice's step
  double step_s = 0;     // the chosen one's
};
Result<JointChoice> choose_jointly(const std::vector<int>& sizes, const std::vector<int>& current,
                                   const std::function<Result<double>(const std::vector<int>&)>& step, double relax,
                                   double tolerance);

// What the coordinator accumulates between decisions and decides from.
class AutoCodec {
 public:
  // `links`: the (sender, receiver) rank pairs whose codec is auto, each with its link name ("0-1:fwd") and the
  // packet bytes of every ladder entry for one microbatch. `workers`: how many report each step.
  struct Link {
    int src = -1, dst = -1;
    std::string name;  // "0-1:fwd"
    std::string role;  // metrics role of its traffic: act | act_grad
    std::vector<uint64_t> bytes_per_mb;
    int current = 0;  // ladder index in force
    // false (tp sums): nothing hides the transfer; chosen by choose_step_codec over `ops_per_step` transfers of
    // bytes_per_mb[i] each and the step time measured (AutoCodecConfig::tokens_per_step / the slowest tokens/s).
    bool overlaps_compute = true;
    int64_t ops_per_step = 1;
    int wanted = -1, wanted_times = 0;  // the choice of the last decisions, when not the current one
    bool moved = false;                 // auto has switched it before
    // The codecs auto moved away from, each with what it was weighed against then (the link's bandwidth and latency,
    // and the compute or step it hides under): going back to one needs one of them to have changed since (by more
    // than AutoCodecConfig::changed), so a decision settles.
    struct Situation {
      double bps = 0, latency_s = 0, compute_s = 0;
    };
    std::map<int, Situation> left;
  };
  AutoCodec(AutoCodecConfig config, std::vector<Link> links, int workers, int microbatches);

  const AutoCodecConfig& config() const { return config_; }
  const std::vector<Link>& links() const { return links_; }
  // One worker's record of one step; returns the step if that completed a step whose turn it is to decide.
  std::optional<int64_t> observe(const WorkerStepMetrics& m);
  // The decisions for the window just completed (changes only), then a new window. `from_step` is filled by the
  // caller when it schedules them.
  std::vector<AutoDecision> decide(int64_t step);
  // Forget the window (a rollback: its steps will be run again).
  void reset_window();

 private:
  struct Totals;
  // What a window says of one link: its rate, latency, and the records it comes from.
  struct Measured {
    bool ok = false;
    double bw = 0, latency = 0;
    bool saturated = false;
    const Totals* tr = nullptr;
  };
  // decide()'s steps.
  std::vector<Measured> measure_links(double pace, double step_s) const;
  std::optional<PipelineCosts> pipeline_costs() const;
  std::map<size_t, AutoChoice> choose_pipeline_links(const std::vector<Measured>& measured, PipelineCosts costs) const;
  std::optional<AutoDecision> decide_link(size_t k, const Measured& m, const AutoChoice* joint, double pace,
                                          double step_s, int64_t step);
  struct Totals {
    uint64_t wire = 0, messages = 0;
    double seconds = 0;
    double serial = 0;         // the link's serial time (LinkTraffic::serial_s), when the records carry it
    uint64_t serial_wire = 0;  // the wire bytes of the records that carry it
    double latency = -1;       // the least one-way latency reported (LinkTraffic::latency_s); −1: none
  };
  AutoCodecConfig config_;
  std::vector<Link> links_;
  int workers_ = 1, microbatches_ = 1;
  std::map<std::pair<int, int>, Totals> traffic_;  // (src, dst) of auto links, this window
  std::map<std::pair<int, int>, Totals> small_;    // their small messages (role other): the latency
  std::map<int, double> compute_s_;                // rank → compute seconds, this window
  std::map<int, int> compute_steps_;               // rank → steps reported, this window
  std::map<int64_t, double> slowest_tps_;          // step → the slowest worker's tokens/s, this window
  std::map<int64_t, int> reports_;                 // step → records seen
};

}  // namespace lh
