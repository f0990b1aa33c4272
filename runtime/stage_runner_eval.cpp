// StageRunner::evaluate: the pipeline's validation loss, forward only, with its own codec stream states and
// traffic of role other. Used by `longhaul worker` and the stage-runner tests.
#include "runtime/stage_runner.h"

namespace lh {

Result<std::optional<float>> StageRunner::evaluate(int64_t step, const int32_t* tokens, const int32_t* targets,
                                                   int batches) {
  TraceScope traced(trace_, "eval", step);
  if (async_) LH_RETURN_IF_ERROR(use_version(newest_version_));  // the newest weights, the same update on every stage
  if (batches < 1 || batches >= AllPairsGradNorm::kSlot)
    return invalid_argument("evaluate: batches must be in 1.." + std::to_string(AllPairsGradNorm::kSlot - 1));
  // Each replica evaluates its part of every batch; the replicas' means are averaged at the end. (An --elastic job
  // that lost replicas splits the whole batch among the ones left when it can, else each evaluates its slice.)
  const bool even = train_.batch % replicas_ == 0;
  const int B = even ? train_.batch / replicas_ : train_.batch / slices_, T = train_.model.seq;
  const size_t per_batch = size_t(train_.batch) * T;
  tokens += size_t(B) * T * (even ? replica_ : slice_);
  targets += size_t(B) * T * (even ? replica_ : slice_);
  const Shape eval_shape = wire_shape(B);
  // Fresh stream states: evaluation must not advance the training streams' codec state. Its tp sums continue the
  // step's op sequence (every shard evaluates at the same point) on evaluation's own codec streams.
  evaluating_ = true;
  struct Reset {
    bool* flag;
    ~Reset() { *flag = false; }
  } reset{&evaluating_};
  compress::StreamState tx(Role::kActivation), rx(Role::kActivation);
  std::vector<Transfer> sends;
  double loss_sum = 0;
  for (int i = 0; i < batches; ++i) {
    const Tag tag = make_tag(uint32_t(step), uint16_t(i), Role::kOther, /*shard=*/1);
    Tensor tok_dev;
    if (subspace_) {
      const size_t local = size_t(B) * T;
      LH_ASSIGN_OR_RETURN(tok_dev, Tensor::create({int64_t(local)}, DType::i32, model_.device()));
      LH_RETURN_IF_ERROR(
          copy_bytes(tok_dev.raw_data(), model_.device(), tokens + i * per_batch, Device::cpu, local * 4));
    }
    Tensor x;
    if (span_.has_embedding) {
      LH_ASSIGN_OR_RETURN(x, model_.embed_forward(eval_cache_, tokens + i * per_batch, Device::cpu, B, T));
    } else {
      const int prev = *boundary_.prev();
      Transfer t = plane_->recv(prev, tag);
      Status w = t.wait(options_.receive_timeout);
      if (!w.ok())
        return w.prepend("evaluate: waiting for batch " + std::to_string(i) + " from rank " + std::to_string(prev));
      Bytes packet = t.take();
      compress::DecodeOptions opts;
      opts.device = model_.device();
      opts.expect_shape = &eval_shape;
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
      LH_RETURN_IF_ERROR(boundary_.chain_for(LinkDir::kFwd, step).encode(payload, tx, &p));
      sends.push_back(
          plane_->send(*boundary_.next(), tag, std::move(p.bytes), uint64_t(compress::CodecChain::raw_bytes(out))));
    }
  }
  for (Transfer& t : sends) {
    Status s = t.wait(options_.receive_timeout);
    if (!s.ok()) return s.prepend("evaluate: a send to rank " + std::to_string(t.peer()));
  }
  if (!span_.has_head) return std::optional<float>();
  LH_ASSIGN_OR_RETURN(double loss, replica_mean(loss_sum / batches));
  last_val_loss_ = static_cast<float>(loss);
  return last_val_loss_;
}

}  // namespace lh
