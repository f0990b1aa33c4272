// defines: lh::JobConfig — the settings of a multi-worker training job (model and training,
// grid, partition, schedule, microbatches, codecs), validated into a Topology, Partition and
// CodecPlan, and carried as JSON in the control plane's Plan; plus the conversions between codec
// plans/changes and the control messages (LinkCodec, SetCodec). Used by launch, coordinator, worker, ctl.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/trainer.h"
#include "grid/codec_plan.h"
#include "grid/partition.h"
#include "grid/pipeline_schedule.h"
#include "grid/topology.h"
#include "grid/tp_split.h"
#include "transport/messages.h"

namespace lh {

struct JobConfig {
  TrainConfig train;  // model, data, steps, global batch, optimizer, seed, device, evaluation
  int workers = 1, pp = 1, tp = 1, dp = 1;
  // "" = even split; block counts per stage ("3,3,2"); "speed": the coordinator splits in
  // proportion to the compute speed each worker reports when it joins (even when any is unknown)
  // and sends the resulting counts in every worker's plan; or "auto": the coordinator plans it with the planner
  // (plan/planner.h plan_partition) from those speeds, --slowdown, the --link rules and the codecs.
  std::string partition;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int microbatches = 4;
  // A spec, or "auto" (also in --compress-link entries): adaptive compression (plan/auto_codec.h) from the
  // ladder, re-decided every auto_every steps; such a link starts with the ladder's first codec.
  std::string compress_fwd = "none", compress_bwd = "none";
  std::string auto_ladder = "none,bf16,int8,int4";
  int auto_every = 10;
  float auto_fit = 0.5f;                   // AutoCodecConfig::fit
  float auto_tolerance = 0.05f;            // AutoCodecConfig::step_tolerance
  std::vector<std::string> compress_link;  // "1-2:fwd=int4" …
  // Weight gradients between replicas (dp > 1): a spec, or "auto" (also as a --compress-link replica entry): per
  // stage's replica group, the least lossy codec of auto_grad_ladder whose all-reduce fits under --auto-fit of the
  // pipeline's compute per microbatch (the last backward it overlaps), re-decided with the pipeline links'.
  std::string compress_grad = "none";
  std::string auto_grad_ladder = "none,bf16,int8,ef+int4";
  std::string sync = "every-step";  // --sync: every-step | diloco:H=…,outer_lr=…,outer_momentum=…
  // Heads per tp shard: "" even, "3:1" weights, or "speed" (the coordinator splits by the workers' reported
  // compute speed and sends the resulting split, e.g. "3:1" in heads, in every worker's plan).
  std::string tp_split;
  // The tp groups' partial sums (tp > 1): a spec, or "auto": every group's codec together, the least lossy of
  // auto_tp_ladder whose step is within 5% of the fastest codec's (tp sums overlap no compute), re-decided with the
  // pipeline links'.
  std::string compress_tp = "none";
  std::string auto_tp_ladder = "none,bf16,int8";
  Result<std::string> tp_spec() const;  // compress_tp, with auto as its ladder's first
  // --dp-split: how the global batch is shared among the replicas. "" equal slices; weights per replica ("3:1");
  // or "speed": the coordinator shares it in proportion to each replica's slowest worker (reported compute speed
  // over --slowdown) and sends the resulting sequences per replica ("12:4") in every plan. Each replica's share is a
  // multiple of --microbatches, and its gradients are weighted by share × dp / batch, so the averaged update is the
  // whole batch's (exactly as with equal slices).
  std::string dp_split;
  // Sequences of the global batch per replica, in replica order; empty for equal slices (and for "speed" until it is
  // planned).
  Result<std::vector<int>> dp_rows() const;
  // The split for workers of these speeds (rank order; each replica takes the slowest of its workers), as sequences
  // per replica ("12:4"); the configured one unless dp_split is "speed".
  Result<std::string> planned_dp_split(const std::vector<double>& speeds) const;
  // Workers send their state to the coordinator after every this many steps and after the last (a job checkpoint,
  // committed by the coordinator once every shard is durable); 0: never.
  int64_t checkpoint_every = 0;
  // How the data plane protects packets: "mac" (authenticated, the default), "aead" (--encrypt-data: also
  // encrypted) or "none" (--no-data-auth: trusted networks and benchmarks only). See transport/packet_auth.h.
  std::string data_protection = "mac";
  // Emulation for tests and demos (grid/link_shapes.h): the in-process link shapes, in order ("20M,10ms" for
  // every link, "0-1:fwd=5M,80ms" for the links a selector names; `ctl set-link` appends), and per-rank compute
  // slow-downs ("1=2.5").
  std::vector<std::string> links;
  std::vector<std::string> slowdown;
  // --elastic: the job went on without lost replicas. The sampler still draws the original global batch, cut into
  // `batch_slices` equal slices (0: dp), and replica d trains on slice replica_slices[d] (empty: slice d); the
  // lost replicas' slices are skipped, so the global batch shrinks and the data order stays the original job's.
  int batch_slices = 0;
  std::vector<int> replica_slices;
  int slices() const { return batch_slices > 0 ? batch_slices : dp; }
  int slice_of(int replica) const { return replica_slices.empty() ? replica : replica_slices.at(size_t(replica)); }
  // The job without replica `replica` (dp − 1 replicas; the others keep their slices), validated.
  Result<JobConfig> without_replica(int replica) const;

  // Everything checked together; the first problem is the error, naming the flag.
  Status validate() const;
  Status check_tp(const Partition& part) const;  // validate()'s steps
  Status check_grad_codecs() const;
  Result<Topology> topology() const;
  Result<Partition> make_partition() const;  // "speed" and "auto" give the even split until planned
  // The data plane's bounds this job implies (UcxDataPlane::set_bounds), whatever codec a link switches to: a packet
  // is at most twice the largest raw tensor any role sends (the whole batch's activations at one boundary, or the
  // whole model's parameters — an upper bound of any gradient bucket or pseudo-gradient — or a pre-flight burst; twice
  // for codecs such as a dense top-k that outgrow their input), plus 1 MiB; a peer may have what a step keeps in
  // flight ahead of its receives: every microbatch's activations twice over and the model's gradients twice, plus
  // 16 MiB.
  struct DataPlaneBounds {
    uint64_t max_packet_bytes = 0, max_unexpected_bytes = 0;
  };
  DataPlaneBounds data_plane_bounds() const;
  // The partition for workers of these speeds (in rank order), as a string for `partition`.
  Result<std::string> planned_partition(const std::vector<double>& speeds) const;
  // Heads per tp shard ("speed" gives the even split until planned).
  Result<std::vector<int>> tp_heads_split() const;
  // The split for workers of these speeds (in rank order: each shard index gets the slowest of its workers' speeds),
  // as heads per shard ("3:1"); the configured one unless tp_split is "speed".
  Result<std::string> planned_tp_split(const std::vector<double>& speeds) const;
  Result<CodecPlan> codec_plan() const;  // from the --compress-link entries that name pipeline links; auto: ladder[0]
  // The pipeline links and directions whose codec is "auto".
  Result<std::vector<std::pair<PipelineLink, LinkDir>>> auto_links() const;
  // The weight-gradient codec of each stage's dp group: --compress-grad, replaced for the groups a --compress-link
  // entry naming replica links touches (e.g. s1d0-s1d1=int4 or d0-d1=ef+int4; later entries win). A group's
  // all-reduce needs one codec, so these entries take no :DIR.
  Result<std::vector<std::string>> grad_specs(bool keep_auto = false) const;  // auto: the grad ladder's first
  // The stages whose replica group's gradient codec is "auto".
  Result<std::vector<int>> auto_grad_stages() const;

  // What a checkpoint of this job must agree with to be resumed: every field but the step count, the checkpoint
  // interval, the evaluation cadence, the partition and the tp split (each worker's state checks its own blocks and
  // heads), and the replicas (dp, workers and slices: a checkpoint's grid is checked on its own, so that an
  // --elastic job's smaller grid still resumes from its bigger one's checkpoints), hashed (hex).
  std::string resume_hash() const;

  // Every field; from_json refuses missing or mistyped fields, naming them, then validates.
  nlohmann::json to_json() const;
  static Result<JobConfig> from_json(const std::string& text);
};

// The plan's codec entries: for every pair of pipeline neighbours (r → next), the forward codec on
// (src r, dst next, "fwd") and the backward one on (src next, dst r, "bwd").
std::vector<LinkCodec> link_codecs_of(const CodecPlan& plan, const Topology& topology);
// Back from a Plan: every entry must name neighbours, fwd or bwd in the right direction, and a
// valid spec; all pairs of one pipeline link must agree; every link and direction must be present.
Result<CodecPlan> codec_plan_from_link_codecs(const std::vector<LinkCodec>& codecs, const Topology& topology,
                                              const CodecSpecCheck& check = check_codec_spec);

// A SetCodec message as a change for `schedule` (apply_at_step −1: the next step boundary).
Result<CodecChange> codec_change_of(const SetCodec& message, const Topology& topology, const CodecSchedule& schedule);
// The SetCodec the coordinator sends for a change (src/dst: the stage-0-shard ranks of the link ends).
SetCodec set_codec_message(const CodecChange& change, const Topology& topology);

}  // namespace lh
