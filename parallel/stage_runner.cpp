// One pipeline stage's training step: the schedule's actions on a model part, with codecs on every
// link, non-blocking sends and receives, and a whole-model gradient norm. Used by `longhaul worker`.
#include "parallel/stage_runner.h"

#include <cmath>
#include <cstring>

#include "core/log.h"
#include "core/ops.h"

namespace lh {
namespace {

// Tag microbatch slot for the per-step gradient-norm exchange (microbatches are < 4095).
constexpr uint16_t kNormSlot = 4095;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<StageRunner>> StageRunner::create(const TrainConfig& train, const Topology& topology,
                                                         const Partition& partition, int rank,
                                                         const StageRunnerOptions& options, DataPlane& plane,
                                                         CodecSchedule& codecs) {
  LH_RETURN_IF_ERROR(train.model.validate());
  if (topology.tp() != 1 || topology.dp() != 1)
    return invalid_argument("stage runner: only pipeline parallelism is implemented (got " + topology.describe() + ")");
  LH_ASSIGN_OR_RETURN(WorkerCoord coord, topology.checked_coord_of(rank));
  if (partition.stages() != topology.pp())
    return invalid_argument("stage runner: partition " + partition.to_string() + " has " +
                            std::to_string(partition.stages()) + " stages but the job has " + std::to_string(topology.pp()));
  if (partition.layers() != train.model.layers)
    return invalid_argument("stage runner: partition " + partition.to_string() + " covers " +
                            std::to_string(partition.layers()) + " blocks but the model has " +
                            std::to_string(train.model.layers));
  if (options.microbatches < 1 || options.microbatches >= kNormSlot)
    return invalid_argument("stage runner: --microbatches must be in 1.." + std::to_string(kNormSlot - 1) + ", got " +
                            std::to_string(options.microbatches));
  if (train.batch % options.microbatches != 0)
    return invalid_argument("stage runner: the batch of " + std::to_string(train.batch) + " sequences does not split into " +
                            std::to_string(options.microbatches) + " equal microbatches");

  std::unique_ptr<StageRunner> r(new StageRunner());
  r->train_ = train;
  r->topology_ = topology;
  r->options_ = options;
  r->rank_ = rank;
  r->stages_ = topology.pp();
  r->span_ = partition.stage(coord.stage);
  r->prev_ = topology.prev_stage_rank(rank);
  r->next_ = topology.next_stage_rank(rank);
  r->mb_batch_ = train.batch / options.microbatches;
  r->plane_ = &plane;
  r->codecs_ = &codecs;
  LH_ASSIGN_OR_RETURN(r->schedule_, PipelineSchedule::build(options.schedule, r->stages_, options.microbatches));
  GptParts parts;
  parts.embedding = r->span_.has_embedding;
  parts.first_block = r->span_.first_block;
  parts.last_block = r->span_.end_block();
  parts.head = r->span_.has_head;
  LH_ASSIGN_OR_RETURN(r->model_, Gpt::create(train.model, train.device, train.seed, parts));
  LH_RETURN_IF_ERROR(r->opt_.init(r->model_.param_groups(), train.device));
  if (train.model.subspace_k > 0 && r->stages_ > 1) {
    LH_ASSIGN_OR_RETURN(r->subspace_, SubspaceBoundary::create(r->model_));
  }
  const int M = options.microbatches;
  r->caches_.resize(M);
  r->inputs_.resize(M);
  r->outputs_.resize(M);
  r->grads_.resize(M);
  r->act_rx_.resize(M);
  r->tokens_dev_.resize(M);
  r->grad_rx_.resize(M);
  return r;
}

const compress::CodecChain& StageRunner::chain_for(LinkDir dir, int64_t step) {
  // The link this stage sends on in `dir`: forward to the next stage, backward to the previous one.
  const int from = dir == LinkDir::kFwd ? span_.stage : span_.stage - 1;
  const std::string& spec = codecs_->spec_at(PipelineLink{from, from + 1}, dir, step);
  auto it = chains_.find(spec);
  if (it == chains_.end()) {
    auto chain = compress::parse_codec_spec(spec);
    // The schedule only holds specs that passed parse_codec_spec.
    LH_ASSERT(chain.ok(), "codec schedule holds an unparsable spec: " + chain.status().to_string());
    it = chains_.emplace(spec, std::move(chain).value()).first;
  }
  return it->second;
}

Result<Tensor> StageRunner::receive(Transfer& t, const char* what, int mb, int peer, compress::StreamState& st) {
  const std::string where = std::string(what) + " of microbatch " + std::to_string(mb) + " from rank " +
                            std::to_string(peer);
  Status s = t.wait(options_.receive_timeout);
  if (!s.ok()) return s.prepend("stage " + std::to_string(span_.stage) + ": waiting for the " + where);
  Bytes packet = t.take();
  const Shape shape{mb_batch_, train_.model.seq, link_width()};
  compress::DecodeOptions opts;
  opts.device = model_.device();
  opts.expect_shape = &shape;
  Tensor out;
  Status d = compress::decode_packet(packet.data(), packet.size(), st, &out, opts);
  if (!d.ok()) return d.prepend("stage " + std::to_string(span_.stage) + ": the " + where + " does not decode");
  return out;
}

int StageRunner::link_width() const { return subspace_ ? subspace_->k() : train_.model.d_model; }

Status StageRunner::run_action(const Action& a, int64_t step) {
  const int mb = a.microbatch;
  const int B = mb_batch_, T = train_.model.seq;
  const Tag act_tag = make_tag(uint32_t(step), uint16_t(mb), Role::kActivation);
  const Tag grad_tag = make_tag(uint32_t(step), uint16_t(mb), Role::kActivationGrad);
  switch (a.kind) {
    case ActionKind::kRecvAct: {
      LH_ASSIGN_OR_RETURN(inputs_[mb], receive(act_rx_[mb], "activation", mb, *prev_, fwd_rx_));
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(inputs_[mb], subspace_->from_coords(inputs_[mb], tokens_dev_[mb]));
      }
      return Status::Ok();
    }
    case ActionKind::kForward: {
      ActivationCache& c = caches_[mb];
      Tensor x = inputs_[mb];
      if (span_.has_embedding) {
        LH_ASSIGN_OR_RETURN(x, model_.embed_forward(c, tokens_ + size_t(mb) * B * T, Device::cpu, B, T));
      }
      LH_ASSIGN_OR_RETURN(outputs_[mb], model_.blocks_forward(span_.first_block, span_.end_block(), c, x));
      if (span_.has_head) {
        LH_ASSIGN_OR_RETURN(float loss,
                            model_.head_forward(c, outputs_[mb], targets_ + size_t(mb) * B * T, Device::cpu));
        if (!std::isfinite(loss))
          return out_of_range("loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                              "; the run diverged (try a lower --lr)");
        loss_sum_ += loss;
      }
      return Status::Ok();
    }
    case ActionKind::kSendAct: {
      Tensor payload = outputs_[mb];
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(payload, subspace_->to_coords(outputs_[mb], tokens_dev_[mb]));
      }
      compress::Packet p;
      LH_RETURN_IF_ERROR(chain_for(LinkDir::kFwd, step).encode(payload, fwd_tx_, &p));
      sends_.push_back(plane_->send(*next_, act_tag, std::move(p.bytes),
                                    uint64_t(compress::CodecChain::raw_bytes(outputs_[mb]))));
      return Status::Ok();
    }
    case ActionKind::kRecvGrad: {
      LH_ASSIGN_OR_RETURN(grads_[mb], receive(grad_rx_[mb], "activation gradient", mb, *next_, bwd_rx_));
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(grads_[mb], subspace_->grad_from_coords(grads_[mb]));
      }
      return Status::Ok();
    }
    case ActionKind::kBackward: {
      ActivationCache& c = caches_[mb];
      Tensor& d = grads_[mb];
      if (span_.has_head) {
        if (!d.defined() || d.shape() != Shape{B, T, train_.model.d_model}) {
          LH_ASSIGN_OR_RETURN(d, Tensor::create({B, T, train_.model.d_model}, DType::f32, model_.device()));
        }
        LH_RETURN_IF_ERROR(model_.head_backward(c, 1.0f / float(options_.microbatches), d));
      }
      LH_RETURN_IF_ERROR(model_.blocks_backward(span_.first_block, span_.end_block(), c, d));
      if (span_.has_embedding) LH_RETURN_IF_ERROR(model_.embed_backward(c, d));
      return Status::Ok();
    }
    case ActionKind::kSendGrad: {
      Tensor payload = grads_[mb];
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(payload, subspace_->grad_to_coords(grads_[mb]));
      }
      compress::Packet p;
      LH_RETURN_IF_ERROR(chain_for(LinkDir::kBwd, step).encode(payload, bwd_tx_, &p));
      sends_.push_back(plane_->send(*prev_, grad_tag, std::move(p.bytes),
                                    uint64_t(compress::CodecChain::raw_bytes(grads_[mb]))));
      return Status::Ok();
    }
    case ActionKind::kOptimizerStep:
      return Status::Ok();  // taken by step() after the list, with the whole model's gradient norm
  }
  return internal_error("unknown pipeline action");
}

Status StageRunner::exchange_grad_norm(int64_t step, double local_sq, double* total_sq) {
  const Tag tag = make_tag(uint32_t(step), kNormSlot, Role::kOther);
  Bytes mine(sizeof(double));
  std::memcpy(mine.data(), &local_sq, sizeof(double));
  std::vector<Transfer> out, in;
  std::vector<int> peers;
  for (int s = 0; s < stages_; ++s) {
    const int peer = topology_.rank_of({s, 0, 0});
    if (peer == rank_) continue;
    peers.push_back(peer);
    out.push_back(plane_->send(peer, tag, mine));
    in.push_back(plane_->recv(peer, tag));
  }
  double total = local_sq;
  for (size_t i = 0; i < in.size(); ++i) {
    Status s = in[i].wait(options_.receive_timeout);
    if (!s.ok()) return s.prepend("waiting for the gradient norm of rank " + std::to_string(peers[i]));
    Bytes b = in[i].take();
    if (b.size() != sizeof(double))
      return corrupt("gradient norm from rank " + std::to_string(peers[i]) + " has " + std::to_string(b.size()) +
                     " bytes, expected 8");
    double v = 0;
    std::memcpy(&v, b.data(), sizeof(double));
    total += v;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    Status s = out[i].wait(options_.receive_timeout);
    if (!s.ok()) return s.prepend("sending the gradient norm to rank " + std::to_string(peers[i]));
  }
  *total_sq = total;
  return Status::Ok();
}

Result<StageStepResult> StageRunner::step(int64_t step, const int32_t* tokens, const int32_t* targets) {
  const auto t0 = std::chrono::steady_clock::now();
  if (step < 1 || step >= (int64_t(1) << Tag::kStepBits))
    return invalid_argument("stage runner: step " + std::to_string(step) + " is outside 1.." +
                            std::to_string((int64_t(1) << Tag::kStepBits) - 1));
  LH_RETURN_IF_ERROR(codecs_->begin_step(step));
  tokens_ = tokens;
  targets_ = targets;
  loss_sum_ = 0;
  sends_.clear();
  LH_RETURN_IF_ERROR(model_.zero_grad());
  const int M = options_.microbatches;
  const uint64_t raw = uint64_t(mb_batch_) * train_.model.seq * train_.model.d_model * 4;
  if (subspace_) {
    const size_t per_mb = size_t(mb_batch_) * train_.model.seq;
    for (int mb = 0; mb < M; ++mb) {
      Tensor& t = tokens_dev_[mb];
      if (!t.defined()) {
        LH_ASSIGN_OR_RETURN(t, Tensor::create({int64_t(per_mb)}, DType::i32, model_.device()));
      }
      LH_RETURN_IF_ERROR(copy_bytes(t.raw_data(), model_.device(), tokens + mb * per_mb, Device::cpu, per_mb * 4));
    }
  }
  // Every receive is posted up front so packets land while this stage computes.
  for (int mb = 0; mb < M; ++mb) {
    if (prev_) act_rx_[mb] = plane_->recv(*prev_, make_tag(uint32_t(step), uint16_t(mb), Role::kActivation), raw);
    if (next_) grad_rx_[mb] = plane_->recv(*next_, make_tag(uint32_t(step), uint16_t(mb), Role::kActivationGrad), raw);
  }
  for (const Action& a : schedule_.actions(span_.stage)) {
    Status s = run_action(a, step);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ", " + a.to_string());
  }
  for (Transfer& t : sends_) {
    Status s = t.wait(options_.receive_timeout);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ": a send to rank " + std::to_string(t.peer()));
  }

  // Clip by the norm of the whole model's gradient, as the single-process trainer does.
  std::vector<ParamGroup*> groups = model_.param_groups();
  double local_sq = 0;
  for (ParamGroup* g : groups) local_sq += sum_squares(model_.exec(), g->grads.data<float>(), g->numel);
  double total_sq = local_sq;
  if (stages_ > 1) LH_RETURN_IF_ERROR(exchange_grad_norm(step, local_sq, &total_sq));
  const float norm = static_cast<float>(std::sqrt(total_sq));
  if (!std::isfinite(norm))
    return out_of_range("gradient norm is " + std::to_string(norm) + " at step " + std::to_string(step) +
                        "; the run diverged (try a lower --lr)");
  if (train_.grad_clip > 0 && norm > train_.grad_clip)
    for (ParamGroup* g : groups) scale_inplace(model_.exec(), g->grads.data<float>(), train_.grad_clip / norm, g->numel);
  AdamWConfig acfg;
  acfg.lr = lr_at(train_, step);
  acfg.weight_decay = train_.weight_decay;
  LH_RETURN_IF_ERROR(opt_.step(model_.exec(), groups, acfg, /*clip=*/0.f, step).status());

  StageStepResult r;
  r.step = step;
  if (span_.has_head) r.loss = static_cast<float>(loss_sum_ / M);
  r.grad_norm = norm;
  r.lr = acfg.lr;
  r.tokens = int64_t(train_.batch) * train_.model.seq;
  r.seconds = seconds_since(t0);
  last_ = r;
  return r;
}

Result<std::optional<float>> StageRunner::evaluate(int64_t step, const int32_t* tokens, const int32_t* targets,
                                                   int batches) {
  if (batches < 1 || batches >= kNormSlot)
    return invalid_argument("evaluate: batches must be in 1.." + std::to_string(kNormSlot - 1));
  const int B = train_.batch, T = train_.model.seq;
  const size_t per_batch = size_t(B) * T;
  const Shape wire_shape{B, T, link_width()};
  // Fresh stream states: evaluation must not advance the training streams' codec state.
  compress::StreamState tx(compress::Role::activation), rx(compress::Role::activation);
  std::vector<Transfer> sends;
  double loss_sum = 0;
  for (int i = 0; i < batches; ++i) {
    const Tag tag = make_tag(uint32_t(step), uint16_t(i), Role::kOther, /*shard=*/1);
    Tensor tok_dev;
    if (subspace_) {
      LH_ASSIGN_OR_RETURN(tok_dev, Tensor::create({int64_t(per_batch)}, DType::i32, model_.device()));
      LH_RETURN_IF_ERROR(copy_bytes(tok_dev.raw_data(), model_.device(), tokens + i * per_batch, Device::cpu, per_batch * 4));
    }
    Tensor x;
    if (span_.has_embedding) {
      LH_ASSIGN_OR_RETURN(x, model_.embed_forward(eval_cache_, tokens + i * per_batch, Device::cpu, B, T));
    } else {
      Transfer t = plane_->recv(*prev_, tag);
      Status w = t.wait(options_.receive_timeout);
      if (!w.ok()) return w.prepend("evaluate: waiting for batch " + std::to_string(i) + " from rank " + std::to_string(*prev_));
      Bytes packet = t.take();
      compress::DecodeOptions opts;
      opts.device = model_.device();
      opts.expect_shape = &wire_shape;
      LH_RETURN_IF_ERROR(compress::decode_packet(packet.data(), packet.size(), rx, &x, opts));
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(x, subspace_->from_coords(x, tok_dev));
      }
    }
    LH_ASSIGN_OR_RETURN(Tensor out, model_.blocks_forward(span_.first_block, span_.end_block(), eval_cache_, x));
    if (span_.has_head) {
      LH_ASSIGN_OR_RETURN(float loss, model_.head_forward(eval_cache_, out, targets + i * per_batch, Device::cpu));
      loss_sum += loss;
    } else {
      Tensor payload = out;
      if (subspace_) {
        LH_ASSIGN_OR_RETURN(payload, subspace_->to_coords(out, tok_dev));
      }
      compress::Packet p;
      LH_RETURN_IF_ERROR(chain_for(LinkDir::kFwd, step).encode(payload, tx, &p));
      sends.push_back(plane_->send(*next_, tag, std::move(p.bytes), uint64_t(compress::CodecChain::raw_bytes(out))));
    }
  }
  for (Transfer& t : sends) {
    Status s = t.wait(options_.receive_timeout);
    if (!s.ok()) return s.prepend("evaluate: a send to rank " + std::to_string(t.peer()));
  }
  if (!span_.has_head) return std::optional<float>();
  last_val_loss_ = static_cast<float>(loss_sum / batches);
  return last_val_loss_;
}

std::string StageRunner::spec_of(const LinkTraffic& t, int64_t step) const {
  const bool act = t.role == "act", grad = t.role == "act_grad";
  if (!act && !grad) return "";
  auto link = topology_.link_between(t.src, t.dst);
  if (!link) return "";
  return codecs_->spec_at(*link, act ? LinkDir::kFwd : LinkDir::kBwd, step);
}

WorkerStepMetrics StageRunner::take_step_metrics() {
  WorkerStepMetrics m;
  m.step = last_.step;
  m.worker = rank_;
  m.stage = span_.stage;
  if (last_.loss) m.loss = double(*last_.loss);
  if (last_val_loss_) m.val_loss = double(*last_val_loss_);
  last_val_loss_.reset();
  m.lr = last_.lr;
  if (last_.seconds > 0) m.tokens_per_s = double(last_.tokens) / last_.seconds;
  if (const auto& meter = plane_->meter()) {
    nlohmann::json j = meter->to_json();
    auto links = link_traffic_from_json(j.value("links", nlohmann::json::array()), "link meter");
    if (links.ok()) {
      m.links = std::move(links).value();
      for (LinkTraffic& t : m.links) t.codec = spec_of(t, last_.step);
    } else {
      LH_LOG_WARN("step metrics without link traffic: {}", links.status().to_string());
    }
    meter->reset_counters();
  }
  return m;
}

}  // namespace lh
