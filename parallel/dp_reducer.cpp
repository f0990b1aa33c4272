// Data-parallel gradient averaging per bucket over the collectives layer. Used by parallel/stage_runner.cpp.
#include "parallel/dp_reducer.h"

#include "compress/codec_chain.h"

namespace lh {

Status check_grad_codec_spec(const std::string& spec) {
  auto chain = compress::parse_codec_spec(spec);
  if (!chain.ok()) return chain.status();
  for (const compress::StageSpec& s : chain->stages()) {
    if (s.id == compress::CodecId::delta || s.id == compress::CodecId::subspace || s.id == compress::CodecId::lowrank)
      return invalid_argument("'" + std::string(compress::codec_name(s.id)) +
                              "' cannot compress weight gradients (buckets are flat vectors that every replica must "
                              "decode alike); use fp16, bf16, int8/int4, topk/randk, with ef");
  }
  return Status::Ok();
}

Result<std::unique_ptr<DpReducer>> DpReducer::create(DataPlane& plane, const Topology& topology, int rank,
                                                     std::string spec, std::chrono::milliseconds timeout) {
  LH_RETURN_IF_ERROR(check_grad_codec_spec(spec).prepend("--compress-grad"));
  LH_ASSIGN_OR_RETURN(WorkerCoord c, topology.checked_coord_of(rank));
  std::unique_ptr<DpReducer> r(new DpReducer());
  const std::string name =
      "dp group of stage " + std::to_string(c.stage) + (topology.tp() > 1 ? " shard " + std::to_string(c.tp) : "");
  LH_ASSIGN_OR_RETURN(r->group_, ProcessGroup::create(plane, topology.dp_group(rank), name, timeout));
  r->spec_ = std::move(spec);
  return r;
}

Status DpReducer::begin_step(int64_t step) {
  return group_->begin_step(step);
}

Status DpReducer::bucket_ready(ParamGroup& group, int bucket) {
  CollectiveOptions o;
  o.role = Role::kWeightGrad;
  o.average = true;
  o.stream = bucket;
  o.spec = spec_;
  auto id = group_->start_all_reduce(group.grads, o);
  if (!id.ok()) return Status(id.status()).prepend("averaging the gradients of " + group.name);
  return group_->poll();
}

Status DpReducer::finish() {
  return group_->wait_all();
}

}  // namespace lh
