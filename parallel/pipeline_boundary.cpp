// A stage's pipeline links: codecs, stream states, posted receives and non-blocking sends of activations
// and their gradients. Used by parallel/stage_runner.cpp.
#include "parallel/pipeline_boundary.h"

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
      receive_timeout_(receive_timeout) {}

void PipelineBoundary::post_receives(int64_t step, int microbatches, uint64_t raw_bytes) {
  sends_.clear();
  act_rx_.assign(size_t(microbatches), Transfer());
  grad_rx_.assign(size_t(microbatches), Transfer());
  for (int mb = 0; mb < microbatches; ++mb) {
    if (prev_) act_rx_[mb] = plane_->recv(*prev_, make_tag(uint32_t(step), uint16_t(mb), Role::kActivation), raw_bytes);
    if (next_)
      grad_rx_[mb] = plane_->recv(*next_, make_tag(uint32_t(step), uint16_t(mb), Role::kActivationGrad), raw_bytes);
  }
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

Result<Tensor> PipelineBoundary::take_activation(int mb, const Shape& wire_shape, Device device) {
  LH_ASSERT(prev_ && size_t(mb) < act_rx_.size(), "take_activation without a posted receive");
  return take(act_rx_[mb], "activation", mb, *prev_, fwd_rx_, wire_shape, device);
}

Result<Tensor> PipelineBoundary::take_activation_grad(int mb, const Shape& wire_shape, Device device) {
  LH_ASSERT(next_ && size_t(mb) < grad_rx_.size(), "take_activation_grad without a posted receive");
  return take(grad_rx_[mb], "activation gradient", mb, *next_, bwd_rx_, wire_shape, device);
}

Status PipelineBoundary::send_activation(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes) {
  LH_ASSERT(next_.has_value(), "the last stage sends no activations");
  compress::Packet p;
  LH_RETURN_IF_ERROR(chain_for(LinkDir::kFwd, step).encode(payload, fwd_tx_, &p));
  sends_.push_back(
      plane_->send(*next_, make_tag(uint32_t(step), uint16_t(mb), Role::kActivation), std::move(p.bytes), raw_bytes));
  return Status::Ok();
}

Status PipelineBoundary::send_activation_grad(int64_t step, int mb, const Tensor& payload, uint64_t raw_bytes) {
  LH_ASSERT(prev_.has_value(), "the first stage sends no activation gradients");
  compress::Packet p;
  LH_RETURN_IF_ERROR(chain_for(LinkDir::kBwd, step).encode(payload, bwd_tx_, &p));
  sends_.push_back(plane_->send(*prev_, make_tag(uint32_t(step), uint16_t(mb), Role::kActivationGrad),
                                std::move(p.bytes), raw_bytes));
  return Status::Ok();
}

Status PipelineBoundary::wait_sends(int64_t step) {
  for (Transfer& t : sends_) {
    Status s = t.wait(receive_timeout_);
    if (!s.ok()) return s.prepend("step " + std::to_string(step) + ": a send to rank " + std::to_string(t.peer()));
  }
  sends_.clear();
  return Status::Ok();
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
  if (!link) return "";
  return codecs_->spec_at(*link, act ? LinkDir::kFwd : LinkDir::kBwd, step);
}

}  // namespace lh
