// The collectives layer: ring and direct all-reduce over the DataPlane with a codec on every hop, progressed on
// the caller's thread. Used by comm/dp_reducer.cpp and the stage runner's loss and norm reductions.
#include "comm/process_group.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace lh {
namespace {

constexpr int kPhaseReduceScatter = 0, kPhaseAllGather = 1, kPhaseDirect = 2, kPhaseMeshScatter = 3,
              kPhaseMeshGather = 4;
constexpr int kEndTx = 0, kEndRx = 1;
// Tag fields the collectives use: the op's sequence number goes in the microbatch slot, the packet's index
// within the op (between one ordered pair of members) in the shard slot.
constexpr int kMaxSequence = (1 << Tag::kMicrobatchBits) - 2;  // 4095 stays free for the norm slot
constexpr int kMaxPackets = 1 << Tag::kShardBits;

int wrap(int v, int n) {
  return ((v % n) + n) % n;
}

// The codec stream role of a collective's packets: its own role, or activation for kOther (a codec stream
// carries one of the four codec roles).
Role codec_role(Role r) {
  return r == Role::kOther ? Role::kActivation : r;
}

}  // namespace

const char* collective_algo_name(CollectiveAlgo a) {
  switch (a) {
    case CollectiveAlgo::kAuto:
      return "auto";
    case CollectiveAlgo::kRing:
      return "ring";
    case CollectiveAlgo::kDirect:
      return "direct";
    case CollectiveAlgo::kMesh:
      return "mesh";
  }
  return "?";
}

struct ProcessGroup::Op {
  int id = 0;
  int64_t step = 0;  // the step it was started in: its packets' tags carry it
  int seq = 0;
  CollectiveOptions opt;
  const compress::CodecChain* chain = nullptr;  // opt.spec parsed, owned by the group
  bool ring = false;
  bool mesh = false;
  Tensor user;  // the caller's tensor
  Tensor host;  // f32 [numel] on the CPU: a view of `user`, or a copy of it
  int64_t numel = 0;
  bool copy_back = false;
  std::vector<int64_t> bounds;    // ring: chunk c is [bounds[c], bounds[c + 1])
  int hop = 0;                    // ring: the packet index the pending receive waits for
  Transfer rx;                    // ring: the pending receive
  std::vector<Transfer> rxs;      // direct: one per member (none for this rank); mesh: their parts of our chunk
  std::vector<Transfer> gathers;  // mesh: each owner's reduced chunk (none for this rank)
  bool scattered = false;         // mesh: our chunk is reduced and sent
  int gathered = 0;               // mesh: other owners' chunks decoded
  Bytes own;                      // direct: this rank's packet
  std::vector<Transfer> tx;
  bool finished = false;
  Status status;

  Tensor chunk(int c) const { return host.slice(bounds[c], bounds[c + 1]); }
  uint64_t chunk_raw(int c) const { return uint64_t(double(bounds[c + 1] - bounds[c]) * 4 * opt.raw_scale); }
  uint64_t total_raw() const { return uint64_t(double(host.numel()) * 4 * opt.raw_scale); }
};

ProcessGroup::~ProcessGroup() = default;

Result<std::unique_ptr<ProcessGroup>> ProcessGroup::create(DataPlane& plane, std::vector<int> members, std::string name,
                                                           std::chrono::milliseconds timeout) {
  if (members.empty()) return invalid_argument(name + ": a group needs at least one member");
  if (members.size() > size_t(kMaxPackets / 2))
    return invalid_argument(name + ": " + std::to_string(members.size()) + " members; at most " +
                            std::to_string(kMaxPackets / 2) + " fit the tag's packet field");
  std::set<int> seen;
  int index = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!seen.insert(members[i]).second)
      return invalid_argument(name + ": rank " + std::to_string(members[i]) + " is listed twice");
    if (members[i] == plane.rank()) index = static_cast<int>(i);
  }
  if (index < 0) return invalid_argument(name + ": this rank (" + std::to_string(plane.rank()) + ") is not a member");
  std::unique_ptr<ProcessGroup> g(new ProcessGroup());
  g->plane_ = &plane;
  g->members_ = std::move(members);
  g->index_ = index;
  g->name_ = std::move(name);
  g->timeout_ = timeout;
  return g;
}

Status ProcessGroup::begin_step(int64_t step, bool keep_running) {
  if (step <= step_)
    return invalid_argument(name_ + ": step " + std::to_string(step) + " follows step " + std::to_string(step_) +
                            "; steps only go forward");
  for (const auto& op : ops_) {
    if (op->finished && !op->status.ok()) return op->status;
    if (!op->finished && !keep_running)
      return invalid_argument(name_ + ": " + op_name(*op) + " is still running at a new step");
  }
  ops_.erase(std::remove_if(ops_.begin(), ops_.end(), [](const std::unique_ptr<Op>& op) { return op->finished; }),
             ops_.end());
  step_ = step;
  sequence_ = 0;
  return Status::Ok();
}

compress::StreamState& ProcessGroup::state(const CollectiveOptions& opt, int chunk, int phase, int end) {
  return states_.try_emplace({opt.stream, chunk, phase, end}, codec_role(opt.role)).first->second;
}

Result<const compress::CodecChain*> ProcessGroup::chain(const std::string& spec) {
  auto it = chains_.find(spec);
  if (it == chains_.end()) {
    LH_ASSIGN_OR_RETURN(compress::CodecChain c, compress::parse_codec_spec(spec));
    it = chains_.emplace(spec, std::move(c)).first;
  }
  return &it->second;
}

Status ProcessGroup::set_tag_group(int group) {
  if (group < 0 || group > kMaxTagGroup)
    return invalid_argument(name_ + ": tag group " + std::to_string(group) + " is outside 0.." +
                            std::to_string(kMaxTagGroup));
  tag_group_ = group;
  return Status::Ok();
}

Tag ProcessGroup::tag(const Op& op, int packet) const {
  const uint32_t step =
      tag_group_ < 0 ? uint32_t(op.step) : (uint32_t(tag_group_) << 16) | (uint32_t(op.step) & 0xFFFF);
  return make_tag(step, uint16_t(op.seq), op.opt.role, uint8_t(packet));
}

std::string ProcessGroup::op_name(const Op& op) const {
  return std::string(op.ring   ? "ring"
                     : op.mesh ? "mesh"
                               : "direct") +
         " all-reduce #" + std::to_string(op.seq) + " of step " + std::to_string(op.step) + " (" +
         std::to_string(op.numel) + " values, " + op.opt.spec + ")";
}

Result<int> ProcessGroup::start_all_reduce(Tensor inout, const CollectiveOptions& options) {
  if (!inout.defined() || inout.dtype() != DType::f32 || !inout.is_contiguous())
    return invalid_argument(name_ + ": all-reduce takes a contiguous f32 tensor, got " + inout.describe());
  if (options.stream < 0) return invalid_argument(name_ + ": stream ids are non-negative");
  if (sequence_ > kMaxSequence)
    return out_of_range(name_ + ": more than " + std::to_string(kMaxSequence + 1) + " collectives in one step");
  auto parsed = chain(options.spec);
  if (!parsed.ok()) return Status(parsed.status()).prepend(name_ + ": codec");
  const compress::CodecChain& ch = **parsed;
  auto op = std::make_unique<Op>();
  op->chain = &ch;
  op->id = next_id_++;
  op->step = step_;
  op->seq = sequence_++;
  op->opt = options;
  op->user = inout;
  const int64_t numel = inout.numel();
  op->numel = numel;
  if (inout.is_cpu()) {
    op->host = inout.view({numel});
  } else {
    LH_ASSIGN_OR_RETURN(Tensor h, inout.to(Device::cpu));
    op->host = h.view({numel});
    op->copy_back = true;
  }
  const int n = size(), i = index_;
  CollectiveAlgo algo = options.algo;
  if (algo == CollectiveAlgo::kAuto) {
    auto packet = ch.packet_bytes({numel});
    const int64_t bytes = packet.ok() ? int64_t(*packet) : numel * 4;
    algo = auto_picks_direct(n, double(bytes)) ? CollectiveAlgo::kDirect : CollectiveAlgo::kMesh;
  }
  op->ring = algo == CollectiveAlgo::kRing && numel >= n;
  op->mesh = algo == CollectiveAlgo::kMesh && n > 2 && numel >= n;
  Op& o = *op;
  ops_.push_back(std::move(op));
  if (n == 1) {
    LH_RETURN_IF_ERROR(finish(o));
    return o.id;
  }
  if (o.ring) {
    for (int c = 0; c <= n; ++c) o.bounds.push_back(numel * c / n);
    const int next = members_[wrap(i + 1, n)], prev = members_[wrap(i - 1, n)];
    compress::Packet p;
    LH_RETURN_IF_ERROR(ch.encode(o.chunk(i), state(options, i, kPhaseReduceScatter, kEndTx), &p));
    o.tx.push_back(plane_->send(next, tag(o, 0), std::move(p.bytes), o.chunk_raw(i)));
    o.hop = 0;
    o.rx = plane_->recv(prev, tag(o, 0), o.chunk_raw(wrap(i - 1, n)));
  } else if (o.mesh) {
    // Chunk j of our tensor goes to its owner j (packet 0); owner j's reduced chunk comes back (packet 1).
    for (int c = 0; c <= n; ++c) o.bounds.push_back(numel * c / n);
    o.rxs.resize(n);
    o.gathers.resize(n);
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      compress::Packet p;
      LH_RETURN_IF_ERROR(ch.encode(o.chunk(j), state(options, j, kPhaseMeshScatter, kEndTx), &p));
      o.tx.push_back(plane_->send(members_[j], tag(o, 0), std::move(p.bytes), o.chunk_raw(j)));
      o.rxs[j] = plane_->recv(members_[j], tag(o, 0), o.chunk_raw(i));
      o.gathers[j] = plane_->recv(members_[j], tag(o, 1), o.chunk_raw(j));
    }
  } else {
    // Direct packets keep the caller's shape, so matrix codecs (lowrank) see rows and columns.
    compress::Packet p;
    LH_RETURN_IF_ERROR(ch.encode(o.host.view(o.user.shape()), state(options, 0, kPhaseDirect, kEndTx), &p));
    o.own = std::move(p.bytes);
    o.rxs.resize(n);
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      o.tx.push_back(plane_->send(members_[j], tag(o, 0), o.own, o.total_raw()));
      o.rxs[j] = plane_->recv(members_[j], tag(o, 0), o.total_raw());
    }
  }
  return o.id;
}

Status ProcessGroup::on_packet(Op& o, Bytes packet) {
  const int n = size(), i = index_;
  const int next = members_[wrap(i + 1, n)], prev = members_[wrap(i - 1, n)];
  const compress::CodecChain& ch = *o.chain;
  const int h = o.hop;
  auto decode_into = [&](const Bytes& b, int c, int phase, Tensor* out) -> Status {
    return decode(o, b, Shape{o.bounds[c + 1] - o.bounds[c]}, c, phase, out,
                  "packet " + std::to_string(h) + " from rank " + std::to_string(prev));
  };
  if (h < n - 1) {  // reduce-scatter: add our contribution to the partial sum of chunk c
    const int c = wrap(i - h - 1, n);
    Tensor partial;
    LH_RETURN_IF_ERROR(decode_into(packet, c, kPhaseReduceScatter, &partial));
    Tensor mine = o.chunk(c);
    float* dst = mine.data<float>();
    const float* src = partial.data<float>();
    for (int64_t k = 0, m = mine.numel(); k < m; ++k) dst[k] = src[k] + dst[k];
    compress::Packet p;
    if (h < n - 2) {
      LH_RETURN_IF_ERROR(ch.encode(mine, state(o.opt, c, kPhaseReduceScatter, kEndTx), &p));
      o.tx.push_back(plane_->send(next, tag(o, h + 1), std::move(p.bytes), o.chunk_raw(c)));
    } else {  // chunk c is fully reduced here: encode it once, take its decoded value ourselves, pass it on
      if (o.opt.average) {
        const float inv = 1.0f / float(n);
        for (int64_t k = 0, m = mine.numel(); k < m; ++k) dst[k] *= inv;
      }
      LH_RETURN_IF_ERROR(ch.encode(mine, state(o.opt, c, kPhaseAllGather, kEndTx), &p));
      LH_RETURN_IF_ERROR(decode_into(p.bytes, c, kPhaseAllGather, &mine));
      o.tx.push_back(plane_->send(next, tag(o, h + 1), std::move(p.bytes), o.chunk_raw(c)));
    }
    o.hop = h + 1;
    o.rx = plane_->recv(prev, tag(o, h + 1), o.chunk_raw(wrap(i - h - 2, n)));
    return Status::Ok();
  }
  // all-gather: chunk c arrives reduced from its owner's side; keep it and pass the same bytes on
  const int j = h - (n - 1);
  const int c = wrap(i - j, n);
  Tensor mine = o.chunk(c);
  LH_RETURN_IF_ERROR(decode_into(packet, c, kPhaseAllGather, &mine));
  if (j < n - 2) {
    o.tx.push_back(plane_->send(next, tag(o, h + 1), std::move(packet), o.chunk_raw(c)));
    o.hop = h + 1;
    o.rx = plane_->recv(prev, tag(o, h + 1), o.chunk_raw(wrap(i - j - 1, n)));
    return Status::Ok();
  }
  o.rx = Transfer();
  return finish(o);
}

Status ProcessGroup::advance(Op& o) {
  if (o.finished) return o.status;
  if (o.ring) {
    while (!o.finished && o.rx.valid() && o.rx.done()) {
      Status s = o.rx.status();
      if (!s.ok())
        return s.prepend(name_ + ": " + op_name(o) + ", packet " + std::to_string(o.hop) + " from rank " +
                         std::to_string(o.rx.peer()));
      LH_RETURN_IF_ERROR(on_packet(o, o.rx.take()));
    }
    return Status::Ok();
  }
  if (o.mesh) {
    const int n = size();
    if (!o.scattered) {
      bool all = true;
      for (const Transfer& t : o.rxs) all = all && (!t.valid() || t.done());
      if (all) LH_RETURN_IF_ERROR(reduce_own_chunk(o));
    }
    for (int j = 0; j < n; ++j) {
      Transfer& t = o.gathers[j];
      if (!t.valid() || !t.done()) continue;
      const std::string what = "reduced chunk from rank " + std::to_string(members_[j]);
      Status s = t.status();
      if (!s.ok()) return s.prepend(name_ + ": " + op_name(o) + ", " + what);
      const Bytes b = t.take();
      t = Transfer();
      Tensor mine = o.chunk(j);
      LH_RETURN_IF_ERROR(decode(o, b, mine.shape(), j, kPhaseMeshGather, &mine, what));
      ++o.gathered;
    }
    return o.scattered && o.gathered == n - 1 ? finish(o) : Status::Ok();
  }
  for (const Transfer& t : o.rxs)
    if (t.valid() && !t.done()) return Status::Ok();
  const int n = size();
  const Shape shape = o.user.shape();
  Tensor sum = o.host.view(shape);  // overwritten in place below: the own contribution is already in the packet
  Tensor part;
  for (int j = 0; j < n; ++j) {
    Bytes b;
    if (j == index_) {
      b = std::move(o.own);
    } else {
      Status s = o.rxs[j].status();
      if (!s.ok()) return s.prepend(name_ + ": " + op_name(o) + ", from rank " + std::to_string(members_[j]));
      b = o.rxs[j].take();
    }
    LH_RETURN_IF_ERROR(
        decode(o, b, shape, j, kPhaseDirect, j == 0 ? &sum : &part, "from rank " + std::to_string(members_[j])));
    if (j > 0) {
      float* dst = sum.data<float>();
      const float* src = part.data<float>();
      for (int64_t k = 0, m = sum.numel(); k < m; ++k) dst[k] += src[k];
    }
  }
  if (o.opt.average) {
    const float inv = 1.0f / float(n);
    float* dst = sum.data<float>();
    for (int64_t k = 0, m = sum.numel(); k < m; ++k) dst[k] *= inv;
  }
  o.rxs.clear();
  return finish(o);
}

// The owner's half of a mesh all-reduce: the other members' parts of chunk `index_` are in; sum them with our own in
// member order, encode the result once, take its decoded value ourselves (so every member holds the same bits) and
// send the same bytes to everyone.
Status ProcessGroup::reduce_own_chunk(Op& o) {
  const int n = size(), i = index_;
  const Shape shape{o.bounds[i + 1] - o.bounds[i]};
  Tensor mine = o.chunk(i);
  const int64_t m = mine.numel();
  std::vector<float> sum(m, 0.0f);
  Tensor part;
  for (int j = 0; j < n; ++j) {
    const float* src = mine.data<float>();
    if (j != i) {
      const std::string what = "part from rank " + std::to_string(members_[j]);
      Status s = o.rxs[j].status();
      if (!s.ok()) return s.prepend(name_ + ": " + op_name(o) + ", " + what);
      LH_RETURN_IF_ERROR(decode(o, o.rxs[j].take(), shape, j, kPhaseMeshScatter, &part, what));
      src = part.data<float>();
    }
    for (int64_t k = 0; k < m; ++k) sum[k] += src[k];
  }
  const float scale = o.opt.average ? 1.0f / float(n) : 1.0f;
  float* dst = mine.data<float>();
  for (int64_t k = 0; k < m; ++k) dst[k] = sum[k] * scale;
  compress::Packet p;
  LH_RETURN_IF_ERROR(o.chain->encode(mine, state(o.opt, i, kPhaseMeshGather, kEndTx), &p));
  LH_RETURN_IF_ERROR(decode(o, p.bytes, shape, i, kPhaseMeshGather, &mine, "its own reduced chunk"));
  for (int j = 0; j < n; ++j)
    if (j != i) o.tx.push_back(plane_->send(members_[j], tag(o, 1), p.bytes, o.chunk_raw(i)));
  o.rxs.clear();
  o.scattered = true;
  return Status::Ok();
}

Status ProcessGroup::decode(Op& o, const Bytes& packet, const Shape& shape, int chunk, int phase, Tensor* out,
                            const std::string& what) {
  compress::DecodeOptions d;
  d.expect_shape = &shape;
  Status s = compress::decode_packet(packet.data(), packet.size(), state(o.opt, chunk, phase, kEndRx), out, d);
  return s.ok() ? s : s.prepend(name_ + ": " + op_name(o) + ", " + what);
}

// A finished op keeps only what wait_all and errors need: its buffers go at once, and its sends as they complete
// (a step may run hundreds of tp all-reduces; their packets must not pile up until the next step).
static void prune_sends(std::vector<Transfer>& tx) {
  tx.erase(std::remove_if(tx.begin(), tx.end(), [](const Transfer& t) { return t.done() && t.status().ok(); }),
           tx.end());
}

Status ProcessGroup::finish(Op& o) {
  if (o.copy_back) LH_RETURN_IF_ERROR(o.user.copy_from(o.host.view(o.user.shape())));
  o.finished = true;
  o.status = Status::Ok();
  o.user = Tensor();
  o.host = Tensor();
  o.bounds.clear();
  o.rx = Transfer();
  o.rxs.clear();
  o.gathers.clear();
  o.own = Bytes();
  prune_sends(o.tx);
  return Status::Ok();
}

Status ProcessGroup::poll() {
  std::set<int> busy;  // streams with an earlier op still running: later ops on them wait their turn
  for (auto& op : ops_) {
    if (op->finished) {
      if (!op->status.ok()) return op->status;
      prune_sends(op->tx);
      continue;
    }
    if (busy.count(op->opt.stream)) continue;
    Status s = advance(*op);
    if (!op->finished) busy.insert(op->opt.stream);
    if (!s.ok()) {
      op->finished = true;
      op->status = s;
      return s;
    }
  }
  return Status::Ok();
}

Status ProcessGroup::wait(int id) {
  Op* o = nullptr;
  for (auto& op : ops_)
    if (op->id == id) o = op.get();
  if (!o) {
    // Ops finished in an earlier step are dropped at the next begin_step, which refuses to drop a failed one.
    if (id >= 0 && id < next_id_) return Status::Ok();
    return invalid_argument(name_ + ": no collective #" + std::to_string(id));
  }
  while (true) {
    LH_RETURN_IF_ERROR(poll());
    if (o->finished) return o->status;
    Transfer pending = pending_transfer(*o);
    if (!pending.valid()) continue;
    Status s = pending.wait(timeout_);
    if (!pending.done()) {
      o->finished = true;
      o->status = unavailable(name_ + ": " + op_name(*o) + ": no packet from rank " + std::to_string(pending.peer()) +
                              " for " + std::to_string(timeout_.count() / 1000.0) + " s");
      return o->status;
    }
    (void)s;  // the transfer's own status is read by advance()
  }
}

Transfer ProcessGroup::pending_transfer(const Op& op) const {
  const Op* o = &op;
  for (const auto& earlier : ops_) {  // the first running op on this stream goes first
    if (earlier.get() == &op) break;
    if (!earlier->finished && earlier->opt.stream == op.opt.stream) {
      o = earlier.get();
      break;
    }
  }
  if (o->ring) return o->rx;
  for (const std::vector<Transfer>* list : {&o->rxs, &o->gathers})
    for (const Transfer& t : *list)
      if (t.valid() && !t.done()) return t;
  return Transfer();
}

Status ProcessGroup::wait_all() {
  for (auto& op : ops_) LH_RETURN_IF_ERROR(wait(op->id));
  for (auto& op : ops_) {
    for (Transfer& t : op->tx) {
      Status s = t.wait(timeout_);
      if (!s.ok()) return s.prepend(name_ + ": " + op_name(*op) + ", sending to rank " + std::to_string(t.peer()));
    }
    op->tx.clear();
  }
  return Status::Ok();
}

Result<std::vector<double>> ProcessGroup::all_reduce_f64(const std::vector<double>& values, Role role) {
  if (sequence_ > kMaxSequence)
    return out_of_range(name_ + ": more than " + std::to_string(kMaxSequence + 1) + " collectives in one step");
  const int seq = sequence_++;
  const Tag t = make_tag(uint32_t(step_), uint16_t(seq), role, 0);
  const int n = size();
  Bytes mine(values.size() * sizeof(double));
  if (!values.empty()) std::memcpy(mine.data(), values.data(), mine.size());
  std::vector<Transfer> out, in(n);
  for (int j = 0; j < n; ++j) {
    if (j == index_) continue;
    out.push_back(plane_->send(members_[j], t, mine));
    in[j] = plane_->recv(members_[j], t);
  }
  std::vector<double> sum(values.size(), 0.0);
  for (int j = 0; j < n; ++j) {
    const double* src = values.data();
    Bytes b;
    if (j != index_) {
      Status s = in[j].wait(timeout_);
      if (!s.ok())
        return s.prepend(name_ + ": f64 all-reduce #" + std::to_string(seq) + " of step " + std::to_string(step_) +
                         ", waiting for rank " + std::to_string(members_[j]));
      b = in[j].take();
      if (b.size() != mine.size())
        return corrupt(name_ + ": f64 all-reduce from rank " + std::to_string(members_[j]) + " has " +
                       std::to_string(b.size()) + " bytes, expected " + std::to_string(mine.size()));
      src = reinterpret_cast<const double*>(b.data());
    }
    for (size_t k = 0; k < sum.size(); ++k) {
      double v = 0;
      std::memcpy(&v, src + k, sizeof(double));
      sum[k] += v;
    }
  }
  for (Transfer& tr : out) {
    Status s = tr.wait(timeout_);
    if (!s.ok()) return s.prepend(name_ + ": f64 all-reduce, sending to rank " + std::to_string(tr.peer()));
  }
  return sum;
}

}  // namespace lh
