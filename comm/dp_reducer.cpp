// Data-parallel gradient averaging per bucket over the collectives layer. Used by runtime/stage_runner.cpp.
#include "comm/dp_reducer.h"

#include <algorithm>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <sstream>

#include "compress/codec_chain.h"
#include "core/checkpoint.h"

namespace lh {

Result<std::unique_ptr<DpReducer>> DpReducer::create(DataPlane& plane, const Topology& topology, int rank,
                                                     std::string spec, std::chrono::milliseconds timeout) {
  {
    Status s = check_grad_codec_spec(spec);
    if (!s.ok()) return s.prepend("--compress-grad");
  }
  LH_ASSIGN_OR_RETURN(WorkerCoord c, topology.checked_coord_of(rank));
  std::unique_ptr<DpReducer> r(new DpReducer());
  const std::string name =
      "dp group of stage " + std::to_string(c.stage) + (topology.tp() > 1 ? " shard " + std::to_string(c.tp) : "");
  LH_ASSIGN_OR_RETURN(r->group_, ProcessGroup::create(plane, topology.dp_group(rank), name, timeout));
  if (is_powersgd_spec(spec)) {
    LH_ASSIGN_OR_RETURN(PowerSgdConfig c, parse_powersgd(spec));
    r->powersgd_ = c;
  }
  r->spec_ = std::move(spec);
  return r;
}

Status DpReducer::set_spec(const std::string& spec) {
  {
    Status s = check_grad_codec_spec(spec, sync_);
    if (!s.ok()) return s.prepend("--compress-grad");
  }
  if (!powersgd_step_.empty()) return invalid_argument("the gradient codec changes between steps only");
  std::optional<PowerSgdConfig> p;
  if (is_powersgd_spec(spec)) {
    LH_ASSIGN_OR_RETURN(p, parse_powersgd(spec));
  }
  powersgd_ = p;
  spec_ = spec;
  return Status::Ok();
}

namespace {

// --sync delayed: one step's averaged gradients, drained at the save and applied after the load.
struct DelayedBucketState {
  int32_t bucket = 0;
  std::string group;  // its parameter group's name, checked on load
  std::vector<float> averaged;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bucket, group, averaged);
  }
};
struct DelayedStepState {
  int64_t step = 0;
  std::vector<DelayedBucketState> buckets;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, buckets);
  }
};

// What a checkpoint keeps of one replica's reducer.
struct ReducerState {
  std::string spec;
  std::map<ProcessGroup::StreamKey, compress::StreamState> streams;
  std::map<int, std::pair<std::vector<float>, std::vector<float>>> powersgd;  // bucket → (Q, error)
  std::vector<std::vector<float>> anchor, momentum;
  std::vector<DelayedStepState> in_flight;  // oldest first
  template <class Archive>
  void serialize(Archive& ar) {
    ar(spec, streams, powersgd, anchor, momentum, in_flight);
  }
};

}  // namespace

Result<std::string> DpReducer::save_state() {
  if (!powersgd_step_.empty()) return invalid_argument("dp reducer state: save it between steps");
  ReducerState st;
  // Drain first (see the header): the stream states below then hold every step in flight's encodes.
  for (InFlight& f : in_flight_) {
    DelayedStepState saved;
    saved.step = f.step;
    for (InFlight::Bucket& b : f.buckets) {
      if (b.op >= 0) {
        Status s = group_->wait(b.op);
        if (!s.ok())
          return s.prepend("dp reducer state: averaging the gradients of " + b.group->name + " from step " +
                           std::to_string(f.step));
        b.op = -1;
      }
      saved.buckets.push_back({b.bucket, b.group->name, b.grads.to_vector()});
    }
    st.in_flight.push_back(std::move(saved));
  }
  st.spec = spec_;
  st.streams = group_->stream_states();
  for (const auto& [bucket, b] : powersgd_state_) st.powersgd[bucket] = {b->q(), b->error()};
  for (const auto& [bucket, saved] : powersgd_restore_) st.powersgd.emplace(bucket, saved);
  st.anchor = anchor_;
  st.momentum = momentum_;
  return to_portable_bytes(st);
}

Status DpReducer::load_state(const std::string& bytes, const std::map<int, ParamGroup*>& buckets, int64_t last_step,
                             bool keep_streams) {
  ReducerState st;
  LH_RETURN_IF_ERROR(from_portable_bytes(bytes, &st, "dp reducer state"));
  if (st.anchor.size() != anchor_.size() || st.momentum.size() != anchor_.size())
    return corrupt("dp reducer state: DiLoCo state for " + std::to_string(st.anchor.size()) + " groups, this job has " +
                   std::to_string(anchor_.size()));
  for (size_t i = 0; i < st.anchor.size(); ++i)
    if (st.anchor[i].size() != anchor_[i].size() || st.momentum[i].size() != anchor_[i].size())
      return corrupt("dp reducer state: DiLoCo group " + std::to_string(i) + " has " +
                     std::to_string(st.anchor[i].size()) + " values, this job's has " +
                     std::to_string(anchor_[i].size()));
  // --sync delayed: the steps in flight are the last ones up to `last_step`, each with every bucket's average.
  const size_t steps = st.in_flight.size();
  if (steps > 0 && !sync_.delayed())
    return invalid_argument("dp reducer state: " + std::to_string(steps) +
                            " steps' averages in flight (--sync delayed), this job runs --sync " + sync_.to_string());
  if (steps > size_t(sync_.D))
    return invalid_argument("dp reducer state: " + std::to_string(steps) + " steps' averages in flight, --sync " +
                            sync_.to_string() + " has at most " + std::to_string(sync_.D));
  std::vector<InFlight> in_flight;
  for (size_t i = 0; i < steps; ++i) {
    DelayedStepState& saved = st.in_flight[i];
    const int64_t expected = last_step - int64_t(steps - 1 - i);
    if (saved.step != expected)
      return corrupt("dp reducer state: step in flight " + std::to_string(saved.step) + " where step " +
                     std::to_string(expected) + " was expected (the last " + std::to_string(steps) +
                     " steps up to step " + std::to_string(last_step) + ")");
    const std::string where = "dp reducer state: the average of step " + std::to_string(saved.step);
    if (saved.buckets.size() != buckets.size())
      return corrupt(where + " has " + std::to_string(saved.buckets.size()) + " buckets, this stage has " +
                     std::to_string(buckets.size()));
    InFlight f;
    f.step = saved.step;
    for (DelayedBucketState& b : saved.buckets) {
      auto it = buckets.find(b.bucket);
      if (it == buckets.end())
        return corrupt(where + ": bucket " + std::to_string(b.bucket) + " ('" + b.group + "') is not this stage's");
      ParamGroup* g = it->second;
      if (b.group != g->name || int64_t(b.averaged.size()) != g->numel)
        return corrupt(where + ": bucket " + std::to_string(b.bucket) + " holds '" + b.group + "' (" +
                       std::to_string(b.averaged.size()) + " values), this stage's is '" + g->name + "' (" +
                       std::to_string(g->numel) + " values)");
      for (const InFlight::Bucket& seen : f.buckets)
        if (seen.bucket == b.bucket)
          return corrupt(where + ": bucket " + std::to_string(b.bucket) + " ('" + b.group + "') appears twice");
      f.buckets.push_back({g, b.bucket, Tensor::from_vector(b.averaged, {g->numel}), -1});
    }
    in_flight.push_back(std::move(f));
  }
  {
    Status s = set_spec(st.spec);
    if (!s.ok()) return s.prepend("dp reducer state");
  }
  in_flight_ = std::move(in_flight);
  group_->set_stream_states(keep_streams ? std::move(st.streams) : decltype(st.streams)());
  powersgd_state_.clear();
  powersgd_restore_ = std::move(st.powersgd);
  anchor_ = std::move(st.anchor);
  momentum_ = std::move(st.momentum);
  return Status::Ok();
}

Status DpReducer::begin_step(int64_t step) {
  LH_RETURN_IF_ERROR(group_->begin_step(step, sync_.delayed()));
  if (sync_.delayed()) {
    if (static_cast<int>(in_flight_.size()) > sync_.D)
      return invalid_argument("dp reducer: " + std::to_string(in_flight_.size()) + " steps in flight at step " +
                              std::to_string(step) + "; --sync " + sync_.to_string() + " allows " +
                              std::to_string(sync_.D));
    in_flight_.push_back(InFlight{step, {}});
  }
  return Status::Ok();
}

Status DpReducer::start_delayed(const SyncConfig& sync) {
  if (!sync.delayed()) return invalid_argument("dp reducer: start_delayed needs --sync delayed");
  {
    Status s = check_grad_codec_spec(spec_, sync);
    if (!s.ok()) return s.prepend("--compress-grad");
  }
  sync_ = sync;
  return Status::Ok();
}

std::vector<int64_t> DpReducer::steps_in_flight() const {
  std::vector<int64_t> out;
  for (const InFlight& f : in_flight_) out.push_back(f.step);
  return out;
}

Status DpReducer::finish_step(int64_t step) {
  if (in_flight_.empty() || in_flight_.front().step != step)
    return invalid_argument("dp reducer: step " + std::to_string(step) + " is not the oldest step in flight");
  for (InFlight::Bucket& b : in_flight_.front().buckets) {
    Status s = b.op >= 0 ? group_->wait(b.op) : Status::Ok();
    if (!s.ok()) return s.prepend("averaging the gradients of " + b.group->name + " from step " + std::to_string(step));
    LH_RETURN_IF_ERROR(b.group->grads.copy_from(b.grads.view(b.group->grads.shape())));
  }
  in_flight_.erase(in_flight_.begin());
  return Status::Ok();
}

Status DpReducer::bucket_ready(ParamGroup& group, int bucket) {
  if (powersgd_) return powersgd_ready(group, bucket);
  CollectiveOptions o;
  o.role = Role::kWeightGrad;
  o.average = true;
  o.stream = bucket;
  o.spec = spec_;
  if (sync_.delayed()) {
    // The group's gradients are zeroed and refilled by the next step while this average runs: average a copy.
    LH_ASSIGN_OR_RETURN(Tensor copy, group.grads.to(Device::cpu));
    o.algo = CollectiveAlgo::kMesh;
    auto id = group_->start_all_reduce(copy, o);
    if (!id.ok()) return Status(id.status()).prepend("averaging the gradients of " + group.name);
    in_flight_.back().buckets.push_back({&group, bucket, copy, *id});
    return group_->poll();
  }
  auto id = group_->start_all_reduce(group.grads, o);
  if (!id.ok()) return Status(id.status()).prepend("averaging the gradients of " + group.name);
  return group_->poll();
}

Status DpReducer::finish() {
  if (powersgd_) LH_RETURN_IF_ERROR(powersgd_finish());
  return group_->wait_all();
}

CollectiveOptions DpReducer::powersgd_options(const PowerSgdBucket& state, int bucket, int part) const {
  CollectiveOptions o;
  o.role = Role::kWeightGrad;
  o.average = true;
  o.stream = 3 * bucket + part;
  if (part == 2) {
    o.spec = "none";  // vectors and small matrices travel uncompressed, as in PowerSGD
  } else {
    o.spec = powersgd_->wire;
    // P and Q together stand for the matrices' values on the meter.
    o.raw_scale = double(state.matrix_values()) / double(std::max<int64_t>(1, state.p_values() + state.q_values()));
  }
  return o;
}

// Round 1 starts as soon as backward has finished the bucket: P of every matrix and the uncompressed rest.
Status DpReducer::powersgd_ready(ParamGroup& group, int bucket) {
  auto& state = powersgd_state_[bucket];
  if (!state) {
    state = std::make_unique<PowerSgdBucket>(group, powersgd_->rank, 0x9000u + uint64_t(bucket));
    auto saved = powersgd_restore_.find(bucket);
    if (saved != powersgd_restore_.end()) {
      Status s = state->restore(std::move(saved->second.first), std::move(saved->second.second));
      powersgd_restore_.erase(saved);
      if (!s.ok()) return s.prepend("resuming " + group.name);
    }
  }
  PowerSgdStep st;
  st.group = &group;
  st.bucket = bucket;
  st.grads = group.grads.to_vector();
  std::vector<float> p, rest;
  state->round1(st.grads.data(), &p, &rest);
  if (!p.empty()) {
    st.p = Tensor::from_vector(p, {int64_t(p.size())});
    auto id = group_->start_all_reduce(st.p, powersgd_options(*state, bucket, 0));
    if (!id.ok()) return Status(id.status()).prepend("PowerSGD: P of " + group.name);
    st.p_op = *id;
  }
  if (!rest.empty()) {
    st.rest = Tensor::from_vector(rest, {int64_t(rest.size())});
    auto id = group_->start_all_reduce(st.rest, powersgd_options(*state, bucket, 2));
    if (!id.ok()) return Status(id.status()).prepend("PowerSGD: vectors of " + group.name);
  }
  powersgd_step_.push_back(std::move(st));
  return group_->poll();
}

// Round 2 (Q) for every bucket once its P is in, then M̂ = P̂·Q̂ᵀ into the gradients.
Status DpReducer::powersgd_finish() {
  for (PowerSgdStep& st : powersgd_step_) {
    if (st.p_op < 0) continue;
    LH_RETURN_IF_ERROR(group_->wait(st.p_op));
    PowerSgdBucket& state = *powersgd_state_.at(st.bucket);
    std::vector<float> q;
    state.round2(st.p.to_vector(), &q);
    st.q = Tensor::from_vector(q, {int64_t(q.size())});
    auto id = group_->start_all_reduce(st.q, powersgd_options(state, st.bucket, 1));
    if (!id.ok()) return Status(id.status()).prepend("PowerSGD: Q of " + st.group->name);
  }
  LH_RETURN_IF_ERROR(group_->wait_all());
  for (PowerSgdStep& st : powersgd_step_) {
    PowerSgdBucket& state = *powersgd_state_.at(st.bucket);
    state.finish(st.grads.data(), st.q.defined() ? st.q.to_vector() : std::vector<float>(),
                 st.rest.defined() ? st.rest.to_vector() : std::vector<float>());
    LH_RETURN_IF_ERROR(st.group->grads.copy_from(Tensor::from_vector(st.grads, st.group->grads.shape())));
  }
  powersgd_step_.clear();
  return Status::Ok();
}

void diloco_outer_update(float* sync, float* momentum, const float* avg_delta, int64_t n, double lr, double mu) {
  const float lr_f = float(lr), mu_f = float(mu);
  for (int64_t k = 0; k < n; ++k) {
    momentum[k] = mu_f * momentum[k] + avg_delta[k];
    sync[k] -= lr_f * (avg_delta[k] + mu_f * momentum[k]);  // Nesterov
  }
}

Status DpReducer::start_diloco(const std::vector<ParamGroup*>& groups, const SyncConfig& sync) {
  {
    Status s = check_grad_codec_spec(spec_, sync);
    if (!s.ok()) return s.prepend("--compress-grad");
  }
  sync_ = sync;
  anchor_.clear();
  momentum_.clear();
  for (ParamGroup* g : groups) {
    anchor_.push_back(g->params.to_vector());
    momentum_.emplace_back(anchor_.back().size(), 0.0f);
  }
  return Status::Ok();
}

Status DpReducer::outer_step(const std::vector<ParamGroup*>& groups, const std::vector<int>& buckets) {
  if (groups.size() != anchor_.size() || buckets.size() != groups.size())
    return invalid_argument("DiLoCo outer step: " + std::to_string(groups.size()) + " groups, " +
                            std::to_string(anchor_.size()) + " anchored (call start_diloco first)");
  std::vector<Tensor> deltas;
  deltas.reserve(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<float> now = groups[i]->params.to_vector();
    if (now.size() != anchor_[i].size()) return internal_error("DiLoCo: group " + groups[i]->name + " changed size");
    for (size_t k = 0; k < now.size(); ++k) now[k] = anchor_[i][k] - now[k];
    deltas.push_back(Tensor::from_vector(now, {int64_t(now.size())}));
    CollectiveOptions o;
    o.role = Role::kWeightGrad;
    o.average = true;
    o.stream = buckets[i];
    o.spec = spec_;
    auto id = group_->start_all_reduce(deltas.back(), o);
    if (!id.ok()) return Status(id.status()).prepend("DiLoCo: averaging the pseudo-gradient of " + groups[i]->name);
    LH_RETURN_IF_ERROR(group_->poll());
  }
  {
    Status s = group_->wait_all();
    if (!s.ok()) return s.prepend("DiLoCo outer step");
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<float>& a = anchor_[i];
    diloco_outer_update(a.data(), momentum_[i].data(), deltas[i].data<float>(), int64_t(a.size()), sync_.outer_lr,
                        sync_.outer_momentum);
    LH_RETURN_IF_ERROR(groups[i]->params.copy_from(Tensor::from_vector(a, groups[i]->params.shape())));
  }
  return Status::Ok();
}

}  // namespace lh
