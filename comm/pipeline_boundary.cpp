// A stage's pipeline links: codecs, stream states, posted receives and non-blocking sends of activations
// and their gradients. Used by runtime/stage_runner.cpp.
#include "comm/pipeline_boundary.h"

#include "core/status.h"

namespace lh {

PipelineBoundary::PipelineBoundary(const Topology& topology, int rank, int stage, DataPlane& plane,
                                   CodecSchedule& codecs, std::chrono::milliseconds receive_timeout)
    : topology_(&topology),
      stage_(stage),
      prev_(topology.prev_stage_rank(rank)),
      next_(topology.next_stage_rank(rank)),
      plane_(&plane),
      codecs_(&codecs),
      receive_timeout_(receive_timeout) {
  tp_peers_ = topology.tp_group(rank);
  shard_ = topology.coord_of(rank).tp;
  fwd_rx_.assign(tp_peers_.size(), compress::StreamState(Role::kActivation));
  bwd_rx_.assign(tp_peers_.size(), compress::StreamState(Role::kActivationGrad));
}

void PipelineBoundary::post_receives(int64_t step, int microbatches, int64_t rows, uint64_t raw_bytes) {
  rx_.erase(rx_.begin(), rx_.lower_bound(step - 1));
  rows_ = rows;
  raw_ = raw_bytes;
  const int n = static_cast<int>(tp_peers_.size());
  StepReceives& r = rx_[step];
  r.act.assign(size_t(microbatches), Transfer());
  r.grad.assign(size_t(microbatches), Transfer());
  r.act_relay.assign(size_t(microbatches), std::vector<Transfer>(size_t(n)));
  r.grad_relay.assign(size_t(microbatches), std::vector<Transfer>(size_t(n)));
  const bool mine = !sliced() || bound(shard_ + 1) > bound(shard_);
  for (int mb = 0; mb < microbatches; ++mb) {
    const Tag act = make_tag(uint32_t(step), uint16_t(mb), Role::kActivation);
    const Tag grad = make_tag(uint32_t(step), uint16_t(mb), Role::kActivationGrad);
    if (prev_ && mine) r.act[mb] = plane_->recv(*prev_, act, slice_raw(raw_bytes, shard_));
    if (next_ && mine) r.grad[mb] = plane_->recv(*next_, grad, slice_raw(raw_bytes, shard_));
    if (!sliced()) continue;
    for (int u = 0; u < n; ++u) {
      if (u == shard_ || bound(u + 1) == bound(u)) continue;
      if (prev_) r.act_relay[mb][u] = plane_->recv(tp_peers_[u], act, slice_raw(raw_bytes, u));
      if (next_) r.grad_relay[mb][u] = plane_->recv(tp_peers_[u], grad, slice_raw(raw_bytes, u));
    }
  }
}

PipelineBoundary::StepReceives& PipelineBoundary::receives(int64_t step, int mb) {
  auto it = rx_.find(step);
  LH_ASSERT(it != rx_.end() && size_t(mb) < it->second.act.size(),
            "no posted receives for microbatch " + std::to_string(mb) + " of step " + std::to_string(step));
  return it->second;
}

Transfer PipelineBoundary::pending_activation(int64_t step, int mb) const {
  auto it = rx_.find(step);
  return it != rx_.end() && size_t(mb) < it->second.act.size() ? it->second.act[size_t(mb)] : Transfer();
}

Transfer PipelineBoundary::pending_activation_grad(int64_t step, int mb) const {
  auto it = rx_.find(step);
  return it != rx_.end() && size_t(mb) < it->second.grad.size() ? it->second.grad[size_t(mb)] : Transfer();
}

Result<Tensor> PipelineBoundary::take(Transfer& t, const char* what, int mb, int peer, compress::StreamState& st,
                                      const Shape& wire_shape, Device device) {
  const std::string where =
      std::string(what) + " of microbatch " + std::to_string(mb) + " from rank " + std::to_string(peer);
  Status s = t.wait(receive_timeout_);
  if (!s.ok()) return s.prepend("stage " + std::to_string(stage_) + ": waiting for the " + where);
  Bytes packet = t.take();
  compress::DecodeOptions opts;
  opts.device = device;
  opts.expect_shape = &wire_shape;
  Tensor out;
  Status d = compress::decode_packet(packet.data(), packet.size(), st, &out, opts);
  if (!d.ok()) return d.prepend("stage " + std::to_string(stage_) + ": the " + where + " does not decode");
  return out;
}

Result<Tensor> PipelineBoundary::take_slices(int64_t step, Transfer& own, std::vector<Transfer>& relayed, Role role,
                                             const char* what, int mb, int peer,
                                             std::vector<compress::StreamState>& states, const Shape& wire_shape,
                                             Device device) {
  const std::string where = std::string(what) + " of microbatch " + std::to_string(mb);
  const int n = static_cast<int>(tp_peers_.size());
  const int64_t rows = shape_numel(wire_shape) / wire_shape.back();
  if (rows != rows_)
    return internal_error("stage " + std::to_string(stage_) + ": the " + where + " has " + std::to_string(rows) +
                          " tokens, the posted receives " + std::to_string(rows_));
  Bytes mine;
  if (bound(shard_ + 1) > bound(shard_)) {
    Status s = own.wait(receive_timeout_);
    if (!s.ok())
      return s.prepend("stage " + std::to_string(stage_) + ": waiting for the " + where + " from rank " +
                       std::to_string(peer));
    mine = own.take();
    // The other shards need this slice too: relay the bytes as they came (no decode, no re-encode).
    for (int u = 0; u < n; ++u)
      if (u != shard_)
        sends_.push_back(
            plane_->send(tp_peers_[u], make_tag(uint32_t(step), uint16_t(mb), role), mine, slice_raw(raw_, shard_)));
  }
  LH_ASSIGN_OR_RETURN(Tensor out, Tensor::create(wire_shape, DType::f32, device));
  Tensor flat = out.view({rows, wire_shape.back()});
  for (int u = 0; u < n; ++u) {
    if (bound(u + 1) == bound(u)) continue;
    Bytes packet;
    if (u == shard_) {
      packet = std::move(mine);
    } else {
      Status s = relayed[u].wait(receive_timeout_);
      if (!s.ok())
        return s.prepend("stage " + std::to_string(stage_) + ": waiting for slice " + std::to_string(u) + " of the " +
                         where + " from rank " + std::to_string(tp_peers_[u]));
      packet = relayed[u].take();
    }
    const Shape slice_shape{bound(u + 1) - bound(u), wire_shape.back()};
    Tensor slice = flat.slice(bound(u), bound(u + 1));
    compress::DecodeOptions opts;
    opts.device = device;
    opts.expect_shape = &slice_shape;
    Status d = compress::decode_packet(packet.data(), packet.size(), states[u], &slice, opts);
    if (!d.ok())
      return d.prepend("stage " + std::to_string(stage_) + ": slice " + std::to_string(u) + " of the " + where +
                       " does not decode");
  }
  return out;
}

Result<Tensor> PipelineBoundary::take_activation(int64_t step, int mb, const Shape& wire_shape, Device device) {
  LH_ASSERT(prev_.has_value(), "take_activation on the first stage");
  StepReceives& r = receives(step, mb);
  if (sliced())
    return take_slices(step, r.act[mb], r.act_relay[mb], Role::kActivation, "activation", mb, *prev_, fwd_rx_,
                       wire_shape, device);
  return take(r.act[mb], "activation", mb, *prev_, fwd_rx_[0], wire_shape, device);
}

Result<Tensor> PipelineBoundary::take_activation_grad(int64_t step, int mb, const Shape& wire_shape, Device device) {
  LH_ASSERT(next_.has_value(), "take_activation_grad on the last stage");
  StepReceives& r = receives(step, mb);
  if (sliced())
    return take_slices(step, r.grad[mb], r.grad_relay[mb], Role::kActivationGrad, "activation gradient", mb, *next_,
                       bwd_rx_, wire_shape, device);
  return take(r.grad[mb], "activation gradient", mb, *next_, bwd_rx_[0], wire_shape, device);
}

Status PipelineBoundary::send_slice(int peer, Role role, int64_t step, int mb, LinkDir dir, const Tensor& payload,
                                    uint64_t raw_bytes, compress::StreamState& st) {
  Tensor send = payload;
  if (sliced()) {
    const int64_t rows = payload.numel() / payload.dim(payload.ndim() - 1);
    LH_ASSERT(rows == rows_, "a pipeline send of another size than the posted receives");
    if (bound(shard_ + 1) == bound(shard_)) return Status::Ok();  // no tokens in this shard's slice
    send = payload.view({rows, payload.dim(payload.ndim() - 1)}).slice(bound(shard_), bound(shard_ + 1));
    raw_bytes = slice_raw(raw_bytes, shard_);
  }
  compress::Packet p;
  LH_RETURN_IF_ERROR(chain_for(dir, step).encode(send, st, &p));
  sends_.push_back(plane_->send(peer, make_tag(uint32_t(step), uint16_t(mb), role), std::move(p.bytes), raw_bytes));
  return Status::Ok();
}

Status PipelineBoundary::send_activation(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes) {
  LH_ASSERT(next_.has_value(), "the last stage sends no activations");
  return send_slice(*next_, Role::kActivation, step, mb, LinkDir::kFwd, payload, raw_bytes, fwd_tx_);
}

Status PipelineBoundary::send_activation_grad(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes) {
  LH_ASSERT(prev_.has_value(), "the first stage sends no activation gradients");
  return send_slice(*prev_, Role::kActivationGrad, step, mb, LinkDir::kBwd, payload, raw_bytes, bwd_tx_);
}

Status PipelineBoundary::wait_sends(int64_t step) {
  for (Transfer& t : sends_) {
    Status s = t.wait(receive_timeout_);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ": a send to rank " + std::to_string(t.peer()));
  }
  sends_.clear();
  return Status::Ok();
}

Status PipelineBoundary::reap_sends() {
  Status first = Status::Ok();
  std::vector<Transfer> left;
  for (Transfer& t : sends_) {
    if (!t.done()) {
      left.push_back(t);
      continue;
    }
    Status s = t.status();
    if (!s.ok() && first.ok()) first = s.prepend("a send to rank " + std::to_string(t.peer()));
  }
  sends_ = std::move(left);
  return first;
}

const compress::CodecChain& PipelineBoundary::chain_for(LinkDir dir, int64_t step) {
  // The link this stage sends on in `dir`: forward to the next stage, backward to the previous one.
  const int from = dir == LinkDir::kFwd ? stage_ : stage_ - 1;
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

std::string PipelineBoundary::spec_of(const LinkTraffic& t, int64_t step) const {
  const bool act = t.role == "act", grad = t.role == "act_grad";
  if (!act && !grad) return "";
  auto link = topology_->link_between(t.src, t.dst);
  if (!link && sliced() && t.src >= 0 && t.dst >= 0 && t.src < topology_->workers() && t.dst < topology_->workers() &&
      topology_->coord_of(t.src).stage == stage_ && topology_->coord_of(t.dst).stage == stage_) {
    // A relayed slice between this stage's shards: the codec of the pipeline link it arrived on.
    if (act && stage_ > 0) return codecs_->spec_at(PipelineLink{stage_ - 1, stage_}, LinkDir::kFwd, step);
    if (grad && stage_ + 1 < topology_->pp())
      return codecs_->spec_at(PipelineLink{stage_, stage_ + 1}, LinkDir::kBwd, step);
    return "";
  }
  if (!link) return "";
  return codecs_->spec_at(*link, act ? LinkDir::kFwd : LinkDir::kBwd, step);
}

Status PipelineBoundary::check_streams(const BoundaryStreams& saved) const {
  if (saved.fwd_rx.size() != fwd_rx_.size() || saved.bwd_rx.size() != bwd_rx_.size())
    return invalid_argument("the saved link streams have " + std::to_string(saved.fwd_rx.size()) +
                            " receive slices, this boundary " + std::to_string(fwd_rx_.size()));
  return Status::Ok();
}

void PipelineBoundary::set_streams(BoundaryStreams saved) {
  fwd_tx_ = std::move(saved.fwd_tx);
  bwd_tx_ = std::move(saved.bwd_tx);
  fwd_rx_ = std::move(saved.fwd_rx);
  bwd_rx_ = std::move(saved.bwd_rx);
}

}  // namespace lh
