// One pipeline stage's training step: the schedule's actions on a model part, its links through the
// PipelineBoundary, and the optimizer step with the whole model's gradient norm. Used by `longhaul worker`.
#include "runtime/stage_runner.h"

#include <cmath>
#include <cstring>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/log.h"
#include "core/ops.h"
#include "grid/link_name.h"

namespace lh {
namespace {

// Microbatch slots share the tag's slot field with the norm's.
constexpr uint16_t kNormSlot = AllPairsGradNorm::kSlot;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The checks before a stage runner is built: the partition fits the grid and the model, and the batch splits into
// `slices` slices of equal microbatches (or the --dp-split shares).
Status check_batch_split(const TrainConfig& train, const Topology& topology, const Partition& partition,
                         const StageRunnerOptions& options, int slices, int slice) {
  if (partition.stages() != topology.pp())
    return invalid_argument("stage runner: partition " + partition.to_string() + " has " +
                            std::to_string(partition.stages()) + " stages but the job has " +
                            std::to_string(topology.pp()));
  if (partition.layers() != train.model.layers)
    return invalid_argument("stage runner: partition " + partition.to_string() + " covers " +
                            std::to_string(partition.layers()) + " blocks but the model has " +
                            std::to_string(train.model.layers));
  if (options.microbatches < 1 || options.microbatches >= kNormSlot)
    return invalid_argument("stage runner: --microbatches must be in 1.." + std::to_string(kNormSlot - 1) + ", got " +
                            std::to_string(options.microbatches));
  if (slices < topology.dp() || slice >= slices)
    return invalid_argument("stage runner: slice " + std::to_string(slice) + " of " + std::to_string(slices) +
                            " slices of the batch for " + std::to_string(topology.dp()) + " replicas");
  if (!options.dp_rows.empty()) {
    int64_t sum = 0;
    bool whole = int(options.dp_rows.size()) == topology.dp() && slices == topology.dp();
    for (int n : options.dp_rows) {
      sum += n;
      whole &= n >= options.microbatches && n % options.microbatches == 0;
    }
    if (!whole || sum != train.batch)
      return invalid_argument("stage runner: --dp-split shares " + nlohmann::json(options.dp_rows).dump() +
                              " are not " + std::to_string(topology.dp()) + " multiples of --microbatches " +
                              std::to_string(options.microbatches) + " summing to the batch of " +
                              std::to_string(train.batch));
  } else if (train.batch % (slices * options.microbatches) != 0)
    return invalid_argument("stage runner: the batch of " + std::to_string(train.batch) +
                            " sequences does not split into " + std::to_string(slices) + " replicas × " +
                            std::to_string(options.microbatches) + " equal microbatches");
  return Status::Ok();
}

// The heads each tp shard holds (--tp-split, or an even split), checked, and whether a step's tags have room for the
// stage's tp all-reduces.
Result<std::vector<int>> checked_tp_heads(const TrainConfig& train, const Topology& topology,
                                          const Partition& partition, const WorkerCoord& coord,
                                          const StageRunnerOptions& options) {
  std::vector<int> heads = options.tp_heads;
  if (heads.empty()) {
    LH_ASSIGN_OR_RETURN(heads, tp_heads("", topology.tp(), train.model.heads));
  }
  {
    int sum = 0;
    for (int h : heads) sum += h < 1 ? train.model.heads + 1 : h;
    if (static_cast<int>(heads.size()) != topology.tp() || sum != train.model.heads)
      return invalid_argument("stage runner: the tp split " + tp_split_string(heads) + " does not give " +
                              std::to_string(topology.tp()) + " shards at least one of the " +
                              std::to_string(train.model.heads) + " heads each");
  }
  if (topology.tp() > 1) {
    const int blocks = partition.stage(coord.stage).num_blocks;
    const int64_t per_step = tp_all_reduces_per_step(blocks, options.microbatches, train.eval_batches);
    if (per_step >= kNormSlot)
      return invalid_argument(
          "stage runner: --tp with " + std::to_string(blocks) + " blocks on stage " + std::to_string(coord.stage) +
          ", " + std::to_string(options.microbatches) + " microbatches and " + std::to_string(train.eval_batches) +
          " evaluation batches needs " + std::to_string(per_step) + " all-reduces per step; at most " +
          std::to_string(kNormSlot - 1) + " fit a step's tags: use fewer --microbatches or more stages");
  }
  return heads;
}

}  // namespace

Result<std::unique_ptr<StageRunner>> StageRunner::create(const TrainConfig& train, const Topology& topology,
                                                         const Partition& partition, int rank,
                                                         const StageRunnerOptions& options, DataPlane& plane,
                                                         CodecSchedule& codecs) {
  LH_RETURN_IF_ERROR(train.model.validate());
  LH_ASSIGN_OR_RETURN(WorkerCoord coord, topology.checked_coord_of(rank));
  const int slices = options.batch_slices > 0 ? options.batch_slices : topology.dp();
  const int slice = options.batch_slice >= 0 ? options.batch_slice : coord.dp;
  if (Status s = check_batch_split(train, topology, partition, options, slices, slice); !s.ok()) return s;
  auto checked_heads = checked_tp_heads(train, topology, partition, coord, options);
  if (!checked_heads.ok()) return checked_heads.status();
  const std::vector<int> heads = std::move(checked_heads).value();
  std::unique_ptr<StageRunner> r(new StageRunner());
  r->train_ = train;
  r->topology_ = topology;
  r->options_ = options;
  r->rank_ = rank;
  r->stages_ = topology.pp();
  r->span_ = partition.stage(coord.stage);
  r->replica_ = coord.dp;
  r->replicas_ = topology.dp();
  r->slice_ = slice;
  r->slices_ = slices;
  r->shard_ = coord.tp;
  r->tp_spec_ = options.compress_tp;
  r->mb_batch_ = train.batch / (slices * options.microbatches);
  r->row_offset_ = int64_t(train.batch / slices) * slice;
  if (!options.dp_rows.empty()) {
    r->row_offset_ = 0;
    for (int d = 0; d < coord.dp; ++d) r->row_offset_ += options.dp_rows[size_t(d)];
    const int rows = options.dp_rows[size_t(coord.dp)];
    r->mb_batch_ = rows / options.microbatches;
    r->loss_weight_ = float(double(rows) * topology.dp() / train.batch);
  }
  r->plane_ = &plane;
  r->codecs_ = &codecs;
  r->boundary_ = PipelineBoundary(r->topology_, rank, coord.stage, plane, codecs, options.receive_timeout);
  if (r->stages_ > 1 || topology.tp() > 1)
    r->grad_norm_ = std::make_unique<AllPairsGradNorm>(r->topology_, rank, plane, options.receive_timeout);
  if (r->replicas_ > 1 || options.sync.diloco() || options.sync.delayed()) {
    LH_ASSIGN_OR_RETURN(r->reducer_,
                        DpReducer::create(plane, r->topology_, rank, options.compress_grad, options.receive_timeout));
    if (options.sync.delayed()) LH_RETURN_IF_ERROR(r->reducer_->start_delayed(options.sync));
  }
  if (is_async(options.schedule) && (topology.tp() > 1 || topology.dp() > 1 || options.sync.diloco() ||
                                     options.sync.delayed() || train.model.subspace_k > 0))
    return invalid_argument(
        "stage runner: the async schedule runs one pipeline of a plain model (no tp, dp, --sync "
        "or subspace yet)");
  r->async_ = is_async(options.schedule);
  if (options.schedule == ScheduleKind::kEager && topology.tp() > 1)
    return invalid_argument(
        "stage runner: the eager schedule lets each tp shard choose its order; use 1f1b or gpipe "
        "with tp > 1");
  LH_ASSIGN_OR_RETURN(r->schedule_, PipelineSchedule::build(options.schedule, r->stages_, options.microbatches));
  GptParts parts;
  parts.embedding = r->span_.has_embedding;
  parts.first_block = r->span_.first_block;
  parts.last_block = r->span_.end_block();
  parts.head = r->span_.has_head;
  parts.tp = tp_shard(heads, coord.tp);
  LH_ASSIGN_OR_RETURN(r->model_, Gpt::create(train.model, train.device, train.seed, parts));
  if (topology.tp() > 1) {
    LH_ASSIGN_OR_RETURN(r->tp_group_, ProcessGroup::create(plane, topology.tp_group(rank),
                                                           "tp group of stage " + std::to_string(coord.stage) +
                                                               " replica " + std::to_string(coord.dp),
                                                           options.receive_timeout));
    StageRunner* self = r.get();
    r->model_.set_tp_all_reduce(
        [self](Tensor& partial, int block, TpSite site) { return self->tp_all_reduce(partial, block, site); });
  }
  LH_RETURN_IF_ERROR(r->opt_.init(r->model_.param_groups(), train.device));
  LH_ASSIGN_OR_RETURN(r->trace_, StepTrace::open(StepTrace::dir_from_env(), rank));
  if (options.sync.diloco()) LH_RETURN_IF_ERROR(r->reducer_->start_diloco(r->model_.param_groups(), options.sync));
  if (train.model.subspace_k > 0 && r->stages_ > 1) {
    LH_ASSIGN_OR_RETURN(r->subspace_, SubspaceBoundary::create(r->model_));
  }
  const int M = options.microbatches;
  // The async schedule has two steps in flight: one slot set per step parity.
  const int slots = r->async_ ? 2 * M : M;
  r->caches_.resize(slots);
  r->inputs_.resize(slots);
  r->outputs_.resize(slots);
  r->grads_.resize(slots);
  r->tokens_dev_.resize(slots);
  return r;
}

int StageRunner::link_width() const {
  return subspace_ ? subspace_->k() : train_.model.d_model;
}

Status StageRunner::run_schedule(int64_t step) {
  executed_.clear();
  if (schedule_.kind() == ScheduleKind::kEager) return run_eager(step);
  for (const Action& a : schedule_.actions(span_.stage)) {
    TraceScope traced(trace_, a.to_string(), step);
    executed_.push_back(a);
    Status s = run_action(a, step);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ", " + a.to_string());
  }
  return Status::Ok();
}

Status StageRunner::run_eager(int64_t step) {
  // The policy of simulate_eager (pipeline_sim.h) on what has actually arrived: the backward of the oldest forwarded
  // microbatch when its gradient is here, else the next forward when its input is here, else wait for either.
  const int M = options_.microbatches;
  const bool first = !boundary_.prev(), last = !boundary_.next();
  auto run = [&](const Action& a) -> Status {
    TraceScope traced(trace_, a.to_string(), step);
    executed_.push_back(a);
    Status s = run_action(a, step);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ", " + a.to_string());
    return Status::Ok();
  };
  int next_f = 0, next_b = 0;
  while (next_b < M) {
    const bool b_possible = next_b < next_f, f_possible = next_f < M;
    const Transfer grad = b_possible && !last ? boundary_.pending_activation_grad(step, next_b) : Transfer();
    const Transfer act = f_possible && !first ? boundary_.pending_activation(step, next_f) : Transfer();
    if (b_possible && (last || grad.done())) {
      if (!last) LH_RETURN_IF_ERROR(run(recv_grad(next_b)));
      LH_RETURN_IF_ERROR(run(lh::backward(next_b)));
      if (!first) LH_RETURN_IF_ERROR(run(send_grad(next_b)));
      ++next_b;
    } else if (f_possible && (first || act.done())) {
      if (!first) LH_RETURN_IF_ERROR(run(recv_act(next_f)));
      LH_RETURN_IF_ERROR(run(lh::forward(next_f)));
      if (!last) LH_RETURN_IF_ERROR(run(send_act(next_f)));
      ++next_f;
    } else {
      TraceScope traced(trace_, "wait", step);
      if (Transfer::wait_any({grad, act}, options_.receive_timeout) < 0) {
        std::string what;
        if (grad.valid())
          what = "the gradient of microbatch " + std::to_string(next_b) + " from rank " +
                 std::to_string(*boundary_.next());
        if (act.valid())
          what += (what.empty() ? "" : " or ") + std::string("the activation of microbatch ") + std::to_string(next_f) +
                  " from rank " + std::to_string(*boundary_.prev());
        return unavailable("step " + std::to_string(step) + ": stage " + std::to_string(span_.stage) + " waited " +
                           std::to_string(options_.receive_timeout.count()) + " ms for " + what);
      }
    }
  }
  executed_.push_back(optimizer_step());
  return Status::Ok();
}

Status StageRunner::run_async(int64_t step, StageStepResult* r) {
  // Eager's policy over two steps: the backwards of the oldest step with some left (b_step_, which may be this step
  // once the one before is done), this step's forwards, and the updates of steps whose backwards are done, each once
  // its whole-model norm is in. A step's forwards and backwards run on the weights of update step − 2; an update goes
  // onto the newest weights. The call returns when this step's forwards are done and the step before is updated (at
  // the last step: when this one is too).
  const int M = options_.microbatches;
  const bool first = !boundary_.prev(), last = !boundary_.next();
  const bool final_step = step >= train_.steps;
  if (b_step_ == 0) b_step_ = step;
  int next_f = 0;
  auto run = [&](int64_t at, const Action& a) -> Status {
    TraceScope traced(trace_, a.to_string(), at);
    executed_.push_back(a);
    Status s = run_action(a, at);
    if (!s.ok()) return s.prepend("step " + std::to_string(at) + ", " + a.to_string());
    return Status::Ok();
  };
  while (true) {
    Transfer norm;
    if (!held_.empty() && (held_.begin()->first < step || final_step)) {
      const int64_t u = held_.begin()->first;
      norm = grad_norm_ ? grad_norm_->pending(u) : Transfer();
      if (!norm.valid()) {
        TraceScope traced(trace_, "update", u);
        LH_RETURN_IF_ERROR(async_update(u, r));
        continue;
      }
    }
    if (next_f == M && newest_version_ >= step - 1 && (!final_step || newest_version_ == step)) break;
    const int b_end = b_step_ < step ? M : b_step_ == step ? next_f : 0;
    const bool b_possible = next_b_ < b_end;
    const Transfer grad = b_possible && !last ? boundary_.pending_activation_grad(b_step_, next_b_) : Transfer();
    const bool f_possible = next_f < M;
    const Transfer act = f_possible && !first ? boundary_.pending_activation(step, next_f) : Transfer();
    if (b_possible && (last || grad.done())) {
      const int64_t at = b_step_;
      const int mb = next_b_;
      LH_RETURN_IF_ERROR(use_step_weights(at));
      if (!last) LH_RETURN_IF_ERROR(run(at, recv_grad(mb)));
      LH_RETURN_IF_ERROR(run(at, lh::backward(mb)));
      if (!first) LH_RETURN_IF_ERROR(run(at, send_grad(mb)));
      if (++next_b_ == M) {
        LH_RETURN_IF_ERROR(finish_backwards(at));
        ++b_step_;
        next_b_ = 0;
      }
    } else if (f_possible && (first || act.done())) {
      LH_RETURN_IF_ERROR(use_step_weights(step));
      if (!first) LH_RETURN_IF_ERROR(run(step, recv_act(next_f)));
      LH_RETURN_IF_ERROR(run(step, lh::forward(next_f)));
      if (!last) LH_RETURN_IF_ERROR(run(step, send_act(next_f)));
      ++next_f;
    } else {
      if (!grad.valid() && !act.valid() && !norm.valid())
        return internal_error("async schedule: step " + std::to_string(step) + " has nothing left to wait for");
      TraceScope traced(trace_, "wait", step);
      if (Transfer::wait_any({grad, act, norm}, options_.receive_timeout) < 0) {
        std::string what;
        if (grad.valid())
          what = "the gradient of microbatch " + std::to_string(next_b_) + " of step " + std::to_string(b_step_) +
                 " from rank " + std::to_string(*boundary_.next());
        if (act.valid())
          what += (what.empty() ? "" : " or ") + std::string("the activation of microbatch ") + std::to_string(next_f) +
                  " from rank " + std::to_string(*boundary_.prev());
        if (norm.valid())
          what +=
              (what.empty() ? "" : " or ") + std::string("the gradient norm of rank ") + std::to_string(norm.peer());
        return unavailable("step " + std::to_string(step) + ": stage " + std::to_string(span_.stage) + " waited " +
                           std::to_string(options_.receive_timeout.count()) + " ms for " + what);
      }
    }
  }
  executed_.push_back(optimizer_step());
  return Status::Ok();
}

Status StageRunner::run_action(const Action& a, int64_t step) {
  if (a.kind != ActionKind::kForward && a.kind != ActionKind::kBackward) return run_compute_action(a, step);
  // Compute is timed (step metrics: compute_s, the pace adaptive compression plans with). With --slowdown, as on a
  // slower machine: the compute, then (slowdown − 1) times its duration more. Device work is finished first, so
  // the time is the compute's own.
  const auto t0 = std::chrono::steady_clock::now();
  Status s = run_compute_action(a, step);
  if (s.ok() && options_.slowdown > 1) s = device_synchronize(model_.device() == Device::cuda);
  if (!s.ok()) return s;
  const double took = seconds_since(t0);
  if (options_.slowdown > 1) std::this_thread::sleep_for(std::chrono::duration<double>((options_.slowdown - 1) * took));
  compute_s_ += took * std::max(1.0, options_.slowdown);
  return Status::Ok();
}

Status StageRunner::run_compute_action(const Action& a, int64_t step) {
  const int mb = a.microbatch;
  const int i = slot(step, mb);  // the microbatch's buffers
  const int B = mb_batch_, T = train_.model.seq;
  switch (a.kind) {
    case ActionKind::kRecvAct: {
      LH_ASSIGN_OR_RETURN(inputs_[i], boundary_.take_activation(step, mb, wire_shape(B), model_.device()));
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(inputs_[i], subspace_->from_coords(inputs_[i], tokens_dev_[i]));
      }
      return Status::Ok();
    }
    case ActionKind::kForward: {
      ActivationCache& c = caches_[i];
      Tensor x = inputs_[i];
      if (span_.has_embedding) {
        LH_ASSIGN_OR_RETURN(x, model_.embed_forward(c, tokens_ + size_t(mb) * B * T, Device::cpu, B, T));
      }
      if (!polls_reducer()) {
        LH_ASSIGN_OR_RETURN(outputs_[i], model_.blocks_forward(span_.first_block, span_.end_block(), c, x));
      } else {  // block by block, letting the gradient averages in flight move on between blocks
        for (int l = span_.first_block; l < span_.end_block(); ++l) {
          LH_ASSIGN_OR_RETURN(x, model_.blocks_forward(l, l + 1, c, x));
          LH_RETURN_IF_ERROR(reducer_->poll());
        }
        outputs_[i] = x;
      }
      if (span_.has_head) {
        LH_ASSIGN_OR_RETURN(float loss,
                            model_.head_forward(c, outputs_[i], targets_ + size_t(mb) * B * T, Device::cpu));
        if (!std::isfinite(loss))
          return out_of_range("loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                              "; the run diverged (try a lower --lr)");
        loss_sum_ += loss;
      }
      return Status::Ok();
    }
    case ActionKind::kSendAct: {
      Tensor payload = outputs_[i];
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(payload, subspace_->to_coords(outputs_[i], tokens_dev_[i]));
      }
      return boundary_.send_activation(step, mb, payload, uint64_t(compress::CodecChain::raw_bytes(outputs_[i])));
    }
    case ActionKind::kRecvGrad: {
      LH_ASSIGN_OR_RETURN(grads_[i], boundary_.take_activation_grad(step, mb, wire_shape(B), model_.device()));
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(grads_[i], subspace_->grad_from_coords(grads_[i]));
      }
      return Status::Ok();
    }
    case ActionKind::kBackward:
      return backward(step, mb);
    case ActionKind::kSendGrad: {
      Tensor payload = grads_[i];
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(payload, subspace_->grad_to_coords(grads_[i]));
      }
      return boundary_.send_activation_grad(step, mb, payload, uint64_t(compress::CodecChain::raw_bytes(grads_[i])));
    }
    case ActionKind::kOptimizerStep:
      return Status::Ok();  // taken by step() after the list, with the whole model's gradient norm
  }
  return internal_error("unknown pipeline action");
}

Status StageRunner::backward(int64_t step, int mb) {
  const int B = mb_batch_, T = train_.model.seq;
  ActivationCache& c = caches_[slot(step, mb)];
  Tensor& d = grads_[slot(step, mb)];
  // The step's last backward finishes each parameter group in turn (head, blocks from the last, embedding):
  // each is handed to the dp reducer as soon as it is final, so its exchange overlaps the rest.
  const bool hand_over = reducer_ && !options_.sync.diloco() && ++backwards_ == options_.microbatches;
  if (span_.has_head) {
    if (!d.defined() || d.shape() != Shape{B, T, train_.model.d_model}) {
      LH_ASSIGN_OR_RETURN(d, Tensor::create({B, T, train_.model.d_model}, DType::f32, model_.device()));
    }
    LH_RETURN_IF_ERROR(model_.head_backward(c, loss_weight_ / float(options_.microbatches), d));
    if (hand_over) LH_RETURN_IF_ERROR(reducer_->bucket_ready(model_.head(), bucket_of(model_.head())));
  }
  if (!hand_over && !polls_reducer()) {
    LH_RETURN_IF_ERROR(model_.blocks_backward(span_.first_block, span_.end_block(), c, d));
  } else {
    for (int l = span_.end_block() - 1; l >= span_.first_block; --l) {
      LH_RETURN_IF_ERROR(model_.blocks_backward(l, l + 1, c, d));
      if (hand_over) {
        LH_RETURN_IF_ERROR(reducer_->bucket_ready(model_.block(l), bucket_of(model_.block(l))));
      } else {
        LH_RETURN_IF_ERROR(reducer_->poll());
      }
    }
  }
  if (span_.has_embedding) {
    LH_RETURN_IF_ERROR(model_.embed_backward(c, d));
    if (hand_over) LH_RETURN_IF_ERROR(reducer_->bucket_ready(model_.embedding(), bucket_of(model_.embedding())));
  }
  return Status::Ok();
}

int StageRunner::bucket_of(const ParamGroup& group) {
  if (&group == &model_.embedding()) return 0;
  if (&group == &model_.head()) return 1 + train_.model.layers;
  for (int l = span_.first_block; l < span_.end_block(); ++l)
    if (&group == &model_.block(l)) return 1 + l;
  LH_ASSERT(false, "parameter group " + group.name + " is not this stage's");
  return -1;
}

Status StageRunner::tp_all_reduce(Tensor& partial, int block, TpSite site) {
  CollectiveOptions o;
  o.role = Role::kTpPartial;
  o.algo = CollectiveAlgo::kDirect;  // one hop: a tp sum sits on the critical path of every block
  o.spec = tp_spec_;
  // One codec stream per block and site; evaluation has its own, so it leaves training's error feedback alone.
  o.stream = (evaluating_ ? train_.model.layers : 0) * kTpSitesPerBlock + block * kTpSitesPerBlock + int(site);
  LH_ASSIGN_OR_RETURN(int id, tp_group_->start_all_reduce(partial, o));
  Status s = tp_group_->wait(id);
  if (!s.ok()) return s.prepend("block " + std::to_string(block) + ", tp all-reduce");
  return Status::Ok();
}

Status StageRunner::schedule_tp_codec(const std::string& spec, int64_t from_step) {
  if (!tp_group_) return invalid_argument("set-codec --role tp: this worker has no tensor shards to sum with");
  if (from_step <= last_.step)
    return invalid_argument("set-codec --role tp: step " + std::to_string(from_step) + " has already begun");
  {
    Status s = check_codec_spec(spec);
    if (!s.ok()) return s.prepend("set-codec --role tp '" + spec + "'");
  }
  tp_changes_[from_step] = spec;
  return Status::Ok();
}

Status StageRunner::schedule_grad_codec(const std::string& spec, int64_t from_step) {
  if (!reducer_)
    return invalid_argument("set-codec --role grad: this worker has no replicas to exchange gradients with");
  if (from_step <= last_.step)
    return invalid_argument("set-codec --role grad: step " + std::to_string(from_step) + " has already begun");
  {
    Status s = check_grad_codec_spec(spec, options_.sync);
    if (!s.ok()) return s.prepend("set-codec --role grad '" + spec + "'");
  }
  grad_changes_[from_step] = spec;
  return Status::Ok();
}

Result<double> StageRunner::replica_mean(double value) {
  if (!reducer_) return value;
  LH_ASSIGN_OR_RETURN(std::vector<double> sum, reducer_->group().all_reduce_f64({value}));
  return sum[0] / replicas_;
}

Result<StageStepResult> StageRunner::step(int64_t step, const int32_t* tokens, const int32_t* targets) {
  const auto t0 = std::chrono::steady_clock::now();
  if (step < 1 || step >= (int64_t(1) << Tag::kStepBits))
    return invalid_argument("stage runner: step " + std::to_string(step) + " is outside 1.." +
                            std::to_string((int64_t(1) << Tag::kStepBits) - 1));
  LH_RETURN_IF_ERROR(codecs_->begin_step(step));
  // This replica's slice of the global batch.
  const size_t slice = size_t(row_offset_) * train_.model.seq;
  tokens_ = tokens + slice;
  targets_ = targets + slice;
  loss_sum_ = 0;
  backwards_ = 0;
  if (reducer_) LH_RETURN_IF_ERROR(reducer_->begin_step(step));
  while (!grad_changes_.empty() && grad_changes_.begin()->first <= step) {
    LH_RETURN_IF_ERROR(reducer_->set_spec(grad_changes_.begin()->second));
    grad_changes_.erase(grad_changes_.begin());
  }
  if (tp_group_) LH_RETURN_IF_ERROR(tp_group_->begin_step(step));
  while (!tp_changes_.empty() && tp_changes_.begin()->first <= step) {
    tp_spec_ = tp_changes_.begin()->second;
    tp_changes_.erase(tp_changes_.begin());
  }
  if (!async_) LH_RETURN_IF_ERROR(model_.zero_grad());  // async: the step before may still be adding its gradients
  LH_RETURN_IF_ERROR(predict_weights());
  const int M = options_.microbatches;
  const uint64_t raw = uint64_t(mb_batch_) * train_.model.seq * train_.model.d_model * 4;
  if (subspace_) {
    const size_t per_mb = size_t(mb_batch_) * train_.model.seq;
    for (int mb = 0; mb < M; ++mb) {
      Tensor& t = tokens_dev_[slot(step, mb)];
      if (!t.defined()) {
        LH_ASSIGN_OR_RETURN(t, Tensor::create({int64_t(per_mb)}, DType::i32, model_.device()));
      }
      LH_RETURN_IF_ERROR(copy_bytes(t.raw_data(), model_.device(), tokens_ + mb * per_mb, Device::cpu, per_mb * 4));
    }
  }
  // Every receive is posted up front so packets land while this stage computes.
  boundary_.post_receives(step, M, int64_t(mb_batch_) * train_.model.seq, raw);
  StageStepResult r;
  r.step = step;
  if (async_) {
    executed_.clear();
    LH_RETURN_IF_ERROR(run_async(step, &r));
    // The sends still in flight go on under the next step; the last step waits for them.
    Status sent = step >= train_.steps ? boundary_.wait_sends(step) : boundary_.reap_sends();
    if (!sent.ok()) return sent.prepend("step " + std::to_string(step));
  } else {
    LH_RETURN_IF_ERROR(run_schedule(step));
    // The step's sends land before the norm goes out: the norm's small messages then find their links idle, so
    // their time is the links' latency, which auto compression takes out of the busy time (sent right behind the
    // last gradient, they measured its transfer too, and a slow link looked fast).
    TraceScope traced(trace_, "wait_sends", step);
    LH_RETURN_IF_ERROR(boundary_.wait_sends(step));
  }
  if (async_) {
    // run_async applies the updates itself, each step's once its backwards and norm are done.
  } else if (options_.sync.delayed()) {
    LH_RETURN_IF_ERROR(apply_delayed_updates(step, &r));
  } else {
    TraceScope traced(trace_, "update", step);
    if (reducer_) {
      Status s = reducer_->finish();
      if (!s.ok()) return s.prepend("step " + std::to_string(step) + ", averaging gradients over the replicas");
    }
    LH_ASSIGN_OR_RETURN(r.grad_norm, apply_update(step));
    r.lr = lr_at(train_, step);
  }
  if (options_.sync.diloco() && step % options_.sync.H == 0) {
    std::vector<int> buckets;
    for (const ParamGroup* g : model_.param_groups()) buckets.push_back(bucket_of(*g));
    Status s = reducer_->outer_step(model_.param_groups(), buckets);
    if (!s.ok()) return s.prepend("step " + std::to_string(step));
  }

  // Each replica reports the loss on its own slice; the job's loss is their mean (the metrics summary takes it), so
  // no round trip between replicas is spent on a number only people read.
  // With --dp-split the loss is weighted like the gradients (share × dp / batch), so that the replicas' mean is still
  // the whole batch's loss.
  if (span_.has_head) r.loss = static_cast<float>(loss_sum_ / M * loss_weight_);
  r.tokens = options_.dp_rows.empty() ? int64_t(train_.batch / slices_) * replicas_ * train_.model.seq
                                      : int64_t(train_.batch) * train_.model.seq;
  r.seconds = seconds_since(t0);
  last_ = r;
  trace_.flush();
  return r;
}

WorkerStepMetrics StageRunner::take_step_metrics() {
  WorkerStepMetrics m;
  m.step = last_.step;
  m.worker = rank_;
  m.stage = span_.stage;
  if (last_.loss && shard_ == 0) m.loss = double(*last_.loss);  // tp shards compute the same loss
  if (last_val_loss_) m.val_loss = double(*last_val_loss_);
  last_val_loss_.reset();
  m.lr = last_.lr;
  if (last_.seconds > 0) m.tokens_per_s = double(last_.tokens) / last_.seconds;
  m.compute_s = compute_s_;
  compute_s_ = 0;
  if (const auto& meter = plane_->meter()) {
    nlohmann::json j = meter->to_json();
    auto links = link_traffic_from_json(j.value("links", nlohmann::json::array()), "link meter");
    if (links.ok()) {
      m.links = std::move(links).value();
      for (LinkTraffic& t : m.links) {
        t.codec = boundary_.spec_of(t, last_.step);
        if (reducer_ && t.role == role_name(Role::kWeightGrad)) t.codec = reducer_->spec();
        if (tp_group_ && t.role == role_name(Role::kTpPartial)) t.codec = tp_spec_;
        if (t.src != t.dst && t.src < topology_.workers() && t.dst < topology_.workers())
          t.link = link_name(topology_, t.src, t.dst);
      }
    } else {
      LH_LOG_WARN("step metrics without link traffic: {}", links.status().to_string());
    }
    meter->reset_counters();
  }
  return m;
}

}  // namespace lh
