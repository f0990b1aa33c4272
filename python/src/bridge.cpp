// The PyTorch bridge's plane and groups (bridge.h).
#include "python/src/bridge.h"

#include <sodium.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/hd.h"
#include "core/log.h"
#include "metrics/step_metrics.h"
#include "transport/job_secret.h"

namespace lh::py {

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::f64:
    case Elem::i64:
      return 8;
    case Elem::f32:
    case Elem::i32:
      return 4;
    case Elem::f16:
    case Elem::bf16:
    case Elem::i16:
      return 2;
    case Elem::i8:
    case Elem::u8:
    case Elem::boolean:
      return 1;
  }
  return 1;
}

const char* elem_name(Elem e) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int64",
                                "int32",   "int16",   "int8",    "uint8",    "bool"};
  return names[static_cast<int>(e)];
}

const char* reduce_name(ReduceKind k) {
  static const char* names[] = {"SUM", "AVG", "MIN", "MAX", "PRODUCT"};
  return names[static_cast<int>(k)];
}

namespace {

std::mutex g_plane_mu;
std::weak_ptr<Plane> g_plane;

std::string seconds_text(std::chrono::milliseconds t) {
  return fmt::format("{:.1f} s", t.count() / 1000.0);
}

// The job secret from the environment (Plane::create says where it looks).
Result<JobSecret> secret_from_env() {
  if (const char* text = std::getenv("LH_JOB_KEY"); text && *text) {
    auto s = JobSecret::parse(text);
    if (!s.ok()) return invalid_argument("LH_JOB_KEY: " + s.status().message());
    return s;
  }
  if (const char* path = std::getenv("LH_JOB_KEY_FILE"); path && *path) return JobSecret::load(path, "LH_JOB_KEY_FILE");
  return invalid_argument(
      "no job secret: set LH_JOB_KEY_FILE to a key file made by `longhaul keygen FILE` (or LH_JOB_KEY to its 64 hex "
      "digits), the same on every rank; the secret authenticates the ranks' entries in the store and every packet");
}

// What a rank publishes in the store: version, rank, world, epoch, its ciphers, its data-plane public key, its UCX
// address envelope, then a MAC over all of it (crypto_auth, keyed by the secret's store key).
constexpr uint8_t kEntryVersion = 1;
constexpr size_t kEntryFixed = 1 + 4 * 4 + DataKeyPair::kBytes;

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xFF));
}
uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(s[at + i])) << (8 * i);
  return v;
}

std::string seal(const std::string& body, const std::string& key) {
  std::string out = body;
  out.resize(body.size() + crypto_auth_BYTES);
  crypto_auth(reinterpret_cast<uint8_t*>(out.data() + body.size()), reinterpret_cast<const uint8_t*>(body.data()),
              body.size(), reinterpret_cast<const uint8_t*>(key.data()));
  return out;
}

// The body of a sealed store value, or why it does not verify.
Result<std::string> unseal(const std::string& value, const std::string& key, const std::string& what) {
  if (value.size() < crypto_auth_BYTES)
    return corrupt(what + " in the store is " + std::to_string(value.size()) + " bytes, too short to be sealed");
  const size_t n = value.size() - crypto_auth_BYTES;
  if (crypto_auth_verify(reinterpret_cast<const uint8_t*>(value.data() + n),
                         reinterpret_cast<const uint8_t*>(value.data()), n,
                         reinterpret_cast<const uint8_t*>(key.data())) != 0)
    return invalid_argument(what +
                            " in the store does not verify with this job's secret: that rank has another "
                            "LH_JOB_KEY, or someone without the secret wrote it");
  return value.substr(0, n);
}

template <class Fn>
Status store_call(const std::string& what, Fn&& fn) {
  try {
    fn();
    return Status::Ok();
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (size_t nl = why.find('\n'); nl != std::string::npos) why.resize(nl);  // torch's errors carry a backtrace
    return unavailable("the torch.distributed store: " + what + ": " + why);
  }
}

// Joining, step by step; a step that fails leaves its reason in the store ("longhaul/failed/RANK"), so the ranks
// waiting for this one say why rather than time out.
class Join {
 public:
  Join(const StoreOps& store, int rank, int world, std::chrono::milliseconds timeout)
      : store_(store), rank_(rank), world_(world), timeout_(timeout), deadline_(Clock::now() + timeout) {}

  // Records why this rank could not join, for the others, and returns it.
  Status fail(Status s) {
    const std::string key = "longhaul/failed/" + std::to_string(rank_);
    (void)store_call("set " + key, [&] { store_.set(key, s.message()); });
    return s;
  }

  // The value of `key`, written by rank `from`, once it is there.
  Result<std::string> wait_for(const std::string& key, int from, const std::string& what) {
    const std::string failed = "longhaul/failed/" + std::to_string(from);
    for (;;) {
      bool have = false, gone = false;
      LH_RETURN_IF_ERROR(store_call("check " + key, [&] { have = store_.check(key); }));
      if (have) {
        std::string v;
        LH_RETURN_IF_ERROR(store_call("get " + key, [&] { v = store_.get(key); }));
        return v;
      }
      LH_RETURN_IF_ERROR(store_call("check " + failed, [&] { gone = store_.check(failed); }));
      if (gone) {
        std::string why;
        LH_RETURN_IF_ERROR(store_call("get " + failed, [&] { why = store_.get(failed); }));
        return unavailable("rank " + std::to_string(from) + " could not join: " + why);
      }
      if (Clock::now() > deadline_)
        return unavailable(fmt::format("rank {} published no {} within {} (not started, or another job's store?)", from,
                                       what, seconds_text(timeout_)));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  Status wait_count(const std::string& key, const std::string& what) {
    for (int64_t n = 0;;) {
      LH_RETURN_IF_ERROR(store_call("add " + key, [&] { n = store_.add(key, 0); }));
      if (n >= world_) return Status::Ok();
      if (Clock::now() > deadline_)
        return unavailable(fmt::format("{} of {} ranks {} within {}", n, world_, what, seconds_text(timeout_)));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

 private:
  const StoreOps& store_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;
};

// $LH_DATA_PROTECTION: mac (the default), aead (payloads encrypted too) or none (trusted networks only).
Result<PacketProtection> protection_from_env() {
  const char* text = std::getenv("LH_DATA_PROTECTION");
  if (!text || !*text) return PacketProtection::kMac;
  auto p = parse_packet_protection(text);
  if (!p.ok()) return invalid_argument("LH_DATA_PROTECTION='" + std::string(text) + "': " + p.status().message());
  return *p;
}

// The epoch: rank 0's random number, sealed; a packet of an earlier job (same secret) is refused as another epoch's.
// Rank 0's packet protection goes with it: every rank must use the same.
Result<uint32_t> agree_epoch(const StoreOps& store, Join& join, int rank, int world, const std::string& key,
                             PacketProtection protection) {
  if (rank == 0) {
    const uint32_t epoch = randombytes_random();
    std::string body;
    put_u32(body, epoch);
    put_u32(body, uint32_t(world));
    put_u32(body, uint32_t(protection));
    LH_RETURN_IF_ERROR(store_call("set longhaul/epoch", [&] { store.set("longhaul/epoch", seal(body, key)); }));
    return epoch;
  }
  LH_ASSIGN_OR_RETURN(std::string value, join.wait_for("longhaul/epoch", 0, "epoch"));
  auto body = unseal(value, key, "rank 0's epoch");
  if (!body.ok()) return join.fail(body.status());
  if (body->size() != 12)
    return join.fail(corrupt("rank 0's epoch in the store is " + std::to_string(body->size()) + " bytes"));
  if (PacketProtection(get_u32(*body, 8)) != protection)
    return join.fail(invalid_argument(std::string("rank 0 protects packets with '") +
                                      packet_protection_name(PacketProtection(get_u32(*body, 8))) + "', this rank (" +
                                      std::to_string(rank) + ") with '" + packet_protection_name(protection) +
                                      "': set the same LH_DATA_PROTECTION everywhere"));
  if (int(get_u32(*body, 4)) != world)
    return join.fail(invalid_argument("rank 0 was started with a world of " + std::to_string(get_u32(*body, 4)) +
                                      " ranks, this rank (" + std::to_string(rank) + ") with " +
                                      std::to_string(world)));
  return get_u32(*body, 0);
}

// Rank r's entry, checked: its address goes in *peers, its key in *security.
Status read_entry(Join& join, int r, int world, uint32_t epoch, const std::string& key, std::map<int, Bytes>* peers,
                  DataPlaneSecurity* security) {
  const std::string what = "rank " + std::to_string(r) + "'s entry";
  LH_ASSIGN_OR_RETURN(std::string value, join.wait_for("longhaul/rank/" + std::to_string(r), r, "entry"));
  auto sealed = unseal(value, key, what);
  if (!sealed.ok()) return join.fail(sealed.status());
  const std::string& e = *sealed;
  if (e.size() < kEntryFixed || uint8_t(e[0]) != kEntryVersion)
    return join.fail(corrupt(what + " is not a longhaul entry of version " + std::to_string(kEntryVersion)));
  if (int(get_u32(e, 1)) != r)
    return join.fail(invalid_argument(what + " names rank " + std::to_string(get_u32(e, 1))));
  if (int(get_u32(e, 5)) != world)
    return join.fail(invalid_argument("rank " + std::to_string(r) + " was started with a world of " +
                                      std::to_string(get_u32(e, 5)) + " ranks, this rank with " +
                                      std::to_string(world)));
  if (get_u32(e, 9) != epoch)
    return join.fail(invalid_argument(what + " was made for another job (epoch " + std::to_string(get_u32(e, 9)) +
                                      ", this job's is " + std::to_string(epoch) + "): a stale store?"));
  auto& k = security->peers[r];
  k.ciphers = get_u32(e, 13);
  std::memcpy(k.public_key.data(), e.data() + 17, DataKeyPair::kBytes);
  (*peers)[r] = Bytes(e.begin() + kEntryFixed, e.end());
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<Plane>> Plane::create(const StoreOps& store, int rank, int world,
                                             std::chrono::milliseconds timeout) {
  if (world < 1 || rank < 0 || rank >= world)
    return invalid_argument("rank " + std::to_string(rank) + " of a world of " + std::to_string(world));
  if (world - 1 > UcxOptions::kMaxRank)
    return invalid_argument("a world of " + std::to_string(world) + " ranks; longhaul's tags hold at most " +
                            std::to_string(UcxOptions::kMaxRank + 1));
  Join join(store, rank, world, timeout);
  auto secret = secret_from_env();
  if (!secret.ok()) return join.fail(secret.status());
  const std::string key = secret->store_entry_key();

  std::shared_ptr<Plane> p(new Plane());
  p->rank_ = rank;
  p->world_ = world;
  auto ucx = UcxDataPlane::create(UcxOptions{});
  if (!ucx.ok()) return join.fail(ucx.status());
  p->ucx_ = std::move(ucx).value();
  p->meter_ = std::make_shared<LinkMeter>(rank);
  p->ucx_->set_meter(p->meter_);
  if (const char* link = std::getenv("LH_LINK"); link && *link) {
    auto shape = parse_link_shape(link);
    if (!shape.ok())
      return join.fail(invalid_argument("LH_LINK='" + std::string(link) + "': " + shape.status().message()));
    p->shape_ = *shape;
    p->shaper_ = std::make_unique<LinkShaper>(*p->ucx_, p->shape_);
  }
  auto protection = protection_from_env();
  if (!protection.ok()) return join.fail(protection.status());
  LH_ASSIGN_OR_RETURN(const uint32_t epoch, agree_epoch(store, join, rank, world, key, *protection));

  std::string body(1, char(kEntryVersion));
  put_u32(body, uint32_t(rank));
  put_u32(body, uint32_t(world));
  put_u32(body, epoch);
  put_u32(body, local_ciphers());
  body.append(reinterpret_cast<const char*>(p->ucx_->data_public_key().data()), DataKeyPair::kBytes);
  body.append(reinterpret_cast<const char*>(p->ucx_->address().data()), p->ucx_->address().size());
  const std::string my_key = "longhaul/rank/" + std::to_string(rank);
  LH_RETURN_IF_ERROR(store_call("set " + my_key, [&] { store.set(my_key, seal(body, key)); }));

  std::map<int, Bytes> peers;
  DataPlaneSecurity security;
  security.protection = *protection;
  security.epoch = epoch;
  for (int r = 0; r < world; ++r)
    if (r != rank) LH_RETURN_IF_ERROR(read_entry(join, r, world, epoch, key, &peers, &security));
  if (Status s = p->ucx_->connect(rank, peers, security); !s.ok()) return join.fail(s);
  p->epoch_ = epoch;

  // Every plane connected before any packet flows (a plane drops packets from ranks it has not connected to yet).
  LH_RETURN_IF_ERROR(store_call("add longhaul/connected", [&] { store.add("longhaul/connected", 1); }));
  LH_RETURN_IF_ERROR(join.wait_count("longhaul/connected", "connected their data planes"));
  std::lock_guard<std::mutex> lock(g_plane_mu);
  g_plane = p;
  return p;
}

Plane::~Plane() {
  shaper_.reset();
}

std::shared_ptr<Plane> Plane::current() {
  std::lock_guard<std::mutex> lock(g_plane_mu);
  return g_plane.lock();
}

Status Plane::send_forged_for_tests(int peer, Tag tag, size_t bytes) {
  WireHeader h;
  h.packet.epoch = epoch_;
  h.packet.sender = rank_;
  h.packet.receiver = peer;
  h.packet.tag_bits = tag.pack();
  h.packet.seq = uint64_t(1) << 40;
  h.length = bytes + kPacketTrailerBytes;
  std::array<uint8_t, kWireHeaderBytes> header{};
  write_wire_header(h, nullptr, header.data());
  return ucx_->send_raw_for_tests(peer, header, Bytes(h.length, 0x5A)).wait(std::chrono::seconds(30));
}

Status Plane::claim_tag_group(int id, const std::string& group_name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = tag_groups_.emplace(id, group_name);
  if (!fresh)
    return invalid_argument("group '" + group_name + "' would share tag group " + std::to_string(id) + " with group '" +
                            it->second + "': at most 256 longhaul groups live at once");
  return Status::Ok();
}

void Plane::release_tag_group(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  tag_groups_.erase(id);
}

// --- Group ---------------------------------------------------------------------------------------------------------

Result<std::shared_ptr<Group>> Group::create(std::shared_ptr<Plane> plane, std::vector<int> members, int tag_group,
                                             std::string name, std::chrono::milliseconds timeout) {
  std::shared_ptr<Group> g(new Group());
  LH_ASSIGN_OR_RETURN(g->collectives_, ProcessGroup::create(plane->net(), members, name, timeout));
  LH_RETURN_IF_ERROR(g->collectives_->set_tag_group(tag_group));
  LH_RETURN_IF_ERROR(plane->claim_tag_group(tag_group, name));
  g->plane_ = std::move(plane);
  g->members_ = std::move(members);
  g->index_ = g->collectives_->index();
  g->tag_group_ = tag_group;
  g->name_ = std::move(name);
  g->timeout_ = timeout;
  g->ops_thread_ = std::thread([raw = g.get()] { raw->run_ops(); });
  g->transfer_thread_ = std::thread([raw = g.get()] { raw->run_transfers(); });
  return g;
}

Group::~Group() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (ops_thread_.joinable()) ops_thread_.join();
  if (transfer_thread_.joinable()) transfer_thread_.join();
  if (plane_) plane_->release_tag_group(tag_group_);
}

void Group::submit(std::function<Status()> op, std::function<void(const Status&)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.emplace_back(std::move(op), std::move(done));
      cv_.notify_all();
      return;
    }
  }
  done(aborted(name_ + " is shut down"));
}

void Group::run_ops() {
  for (;;) {
    std::pair<std::function<Status()>, std::function<void(const Status&)>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        lock.unlock();
        item.second(aborted(name_ + " was shut down before this op ran"));
        continue;
      }
    }
    Status s;
    try {
      s = item.first();
    } catch (const std::exception& e) {
      s = internal_error(name_ + ": " + e.what());
    }
    item.second(s);
  }
}

void Group::run_transfers() {
  struct Pending {
    Transfer t;
    std::function<void(const Status&)> done;
    Clock::time_point started;
  };
  std::vector<Pending> pending;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (pending.empty()) cv_.wait(lock, [&] { return stopping_ || !transfers_.empty(); });
      while (!transfers_.empty()) {
        pending.push_back({std::move(transfers_.front().first), std::move(transfers_.front().second), Clock::now()});
        transfers_.pop_front();
      }
      if (stopping_) {
        lock.unlock();
        for (Pending& p : pending)
          p.done(p.t.done() ? p.t.status() : aborted(name_ + " was shut down with this transfer pending"));
        return;
      }
    }
    if (pending.empty()) continue;
    std::vector<Transfer> ts;
    for (const Pending& p : pending) ts.push_back(p.t);
    Transfer::wait_any(ts, std::chrono::milliseconds(20));
    const auto now = Clock::now();
    for (size_t k = 0; k < pending.size();) {
      Pending& p = pending[k];
      if (p.t.done()) {
        Status s = p.t.status();
        p.done(s);
      } else if (now - p.started > timeout_) {
        const bool send = p.t.direction() == Direction::kSend;
        p.done(unavailable(fmt::format("{}: {} rank {} did not complete within {} ({})", name_,
                                       send ? "a send to" : "a receive from", p.t.peer(), seconds_text(timeout_),
                                       p.t.tag().to_string())));
      } else {
        ++k;
        continue;
      }
      pending.erase(pending.begin() + k);
    }
  }
}

uint32_t Group::next_step() {
  return ++ops_;
}

Tag Group::tag(uint32_t step, Role role) const {
  return make_tag((uint32_t(tag_group_) << 16) | (step & 0xFFFF), 0, role);
}

std::string Group::op_name(const char* what, uint32_t step) const {
  return fmt::format("{}: {} #{}", name_, what, step);
}

Status Group::transfer_all(const std::string& what, Tag tag, const std::vector<Part>& sends,
                           const std::vector<Part>& recvs) {
  DataPlane& plane = plane_->net();
  std::vector<Transfer> ts;
  std::vector<const Part*> parts;
  for (const Part& p : recvs) {
    ts.push_back(plane.recv_into(members_[p.member], tag, p.data, p.bytes));
    parts.push_back(&p);
  }
  for (const Part& p : sends) {
    ts.push_back(plane.send_view(members_[p.member], tag, p.data, p.bytes));
    parts.push_back(&p);
  }
  const auto deadline = Clock::now() + timeout_;
  Status first;
  for (size_t i = 0; i < ts.size(); ++i) {
    const bool recv = i < recvs.size();
    const int rank = members_[parts[i]->member];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Status s = ts[i].wait(std::max(left, std::chrono::milliseconds(0)));
    if (!s.ok() && !ts[i].done())
      s = unavailable(fmt::format("{}: {} rank {} within {}", what,
                                  recv ? "no data from" : "rank did not take data:", rank, seconds_text(timeout_)));
    else if (!s.ok())
      s = Status(s.code(), fmt::format("{}: {} rank {} failed: {}", what, recv ? "the receive from" : "the send to",
                                       rank, s.message()));
    else if (recv && ts[i].wire_bytes() != parts[i]->bytes)
      s =
          invalid_argument(fmt::format("{}: rank {} sent {} bytes, this rank expects {} (the ranks disagree on the "
                                       "tensor's size or dtype)",
                                       what, rank, ts[i].wire_bytes(), parts[i]->bytes));
    if (!s.ok() && first.ok()) first = s;
  }
  // A transfer still pending holds the caller's tensor, which is free once the op fails: fail its peer (UCX lets go
  // of the buffer, and the group is broken for that peer anyway).
  if (!first.ok())
    for (size_t i = 0; i < ts.size(); ++i)
      if (!ts[i].done()) plane.fail_peer(members_[parts[i]->member], first.message());
  return first;
}

namespace {

template <class T>
struct Plain {
  using Acc = T;
  static Acc load(const void* p, int64_t i) { return static_cast<const T*>(p)[i]; }
  static void store(void* p, int64_t i, Acc v) { static_cast<T*>(p)[i] = v; }
};
struct Half {
  using Acc = float;
  static Acc load(const void* p, int64_t i) { return fp16_to_float(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, Acc v) { static_cast<uint16_t*>(p)[i] = float_to_fp16(v); }
};
struct BHalf {
  using Acc = float;
  static Acc load(const void* p, int64_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, Acc v) { static_cast<uint16_t*>(p)[i] = float_to_bf16(v); }
};
struct Bool {
  using Acc = uint8_t;
  static Acc load(const void* p, int64_t i) { return static_cast<const uint8_t*>(p)[i] != 0; }
  static void store(void* p, int64_t i, Acc v) { static_cast<uint8_t*>(p)[i] = v != 0; }
};

// out[i] = srcs[0][i] ∘ srcs[1][i] ∘ … in member order (each element read before it is written: out may be a src).
template <class E>
void reduce_elems(const std::vector<const void*>& srcs, void* out, int64_t n, ReduceKind kind) {
  using A = typename E::Acc;
  const size_t m = srcs.size();
  for (int64_t i = 0; i < n; ++i) {
    A acc = E::load(srcs[0], i);
    for (size_t k = 1; k < m; ++k) {
      const A v = E::load(srcs[k], i);
      switch (kind) {
        case ReduceKind::sum:
        case ReduceKind::avg:
          if constexpr (std::is_same_v<E, Bool>)
            acc = acc || v;
          else
            acc = A(acc + v);
          break;
        case ReduceKind::product:
          if constexpr (std::is_same_v<E, Bool>)
            acc = acc && v;
          else
            acc = A(acc * v);
          break;
        case ReduceKind::min:
          acc = v < acc ? v : acc;
          break;
        case ReduceKind::max:
          acc = v > acc ? v : acc;
          break;
      }
    }
    if constexpr (std::is_floating_point_v<A>)
      if (kind == ReduceKind::avg) acc = acc / A(m);
    E::store(out, i, acc);
  }
}

void reduce_any(Elem e, const std::vector<const void*>& srcs, void* out, int64_t n, ReduceKind kind) {
  switch (e) {
    case Elem::f32:
      return reduce_elems<Plain<float>>(srcs, out, n, kind);
    case Elem::f64:
      return reduce_elems<Plain<double>>(srcs, out, n, kind);
    case Elem::f16:
      return reduce_elems<Half>(srcs, out, n, kind);
    case Elem::bf16:
      return reduce_elems<BHalf>(srcs, out, n, kind);
    case Elem::i64:
      return reduce_elems<Plain<int64_t>>(srcs, out, n, kind);
    case Elem::i32:
      return reduce_elems<Plain<int32_t>>(srcs, out, n, kind);
    case Elem::i16:
      return reduce_elems<Plain<int16_t>>(srcs, out, n, kind);
    case Elem::i8:
      return reduce_elems<Plain<int8_t>>(srcs, out, n, kind);
    case Elem::u8:
      return reduce_elems<Plain<uint8_t>>(srcs, out, n, kind);
    case Elem::boolean:
      return reduce_elems<Bool>(srcs, out, n, kind);
  }
}

bool is_float(Elem e) {
  return e == Elem::f32 || e == Elem::f64 || e == Elem::f16 || e == Elem::bf16;
}

}  // namespace

Status Group::exchange_reduce(const std::string& what, Tag tag, const std::vector<const void*>& mine, const Buffer& out,
                              ReduceKind kind) {
  if (kind == ReduceKind::avg && !is_float(out.elem))
    return invalid_argument(what + ": AVG of " + elem_name(out.elem) +
                            " tensors is not defined (integers do not divide exactly); use SUM and divide");
  const int n = size();
  std::vector<std::vector<uint8_t>> theirs(n);
  std::vector<Part> sends, recvs;
  for (int j = 0; j < n; ++j) {
    if (j == index_) continue;
    theirs[j].resize(out.bytes());
    sends.push_back({j, const_cast<void*>(mine[j]), out.bytes()});
    recvs.push_back({j, theirs[j].data(), out.bytes()});
  }
  LH_RETURN_IF_ERROR(transfer_all(what, tag, sends, recvs));
  std::vector<const void*> srcs(n);
  for (int j = 0; j < n; ++j) srcs[j] = j == index_ ? mine[j] : theirs[j].data();
  reduce_any(out.elem, srcs, out.data, out.numel, kind);
  return Status::Ok();
}

int Group::stream_of(const Buffer& b) {
  // DDP reduces each gradient bucket from the same buffer step after step: its error-feedback residuals follow it.
  // A caller that reduces fresh tensors every time would grow this map: past 4096 buffers it starts afresh.
  constexpr size_t kMaxStreams = 4096;
  const auto key = std::make_pair(reinterpret_cast<uintptr_t>(b.data), b.numel);
  auto it = streams_.find(key);
  if (it != streams_.end()) return it->second;
  if (streams_.size() >= kMaxStreams) {
    streams_.clear();
    collectives_->set_stream_states({});
  }
  const int id = int(streams_.size());  // < kMaxStreams < kExplicitStreams
  streams_.emplace(key, id);
  return id;
}

Status Group::compressed_all_reduce(const Buffer& inout, ReduceKind kind, const std::string& spec, int stream,
                                    double raw_scale) {
  const uint32_t step = next_step();
  LH_RETURN_IF_ERROR(collectives_->begin_step(step));
  CollectiveOptions o;
  o.role = Role::kWeightGrad;
  o.average = kind == ReduceKind::avg;
  o.spec = spec;
  o.stream = stream >= 0 ? kExplicitStreams + stream : stream_of(inout);
  o.raw_scale = raw_scale;
  Tensor t = Tensor::borrow(inout.data, {inout.numel}, DType::f32);
  LH_ASSIGN_OR_RETURN(int id, collectives_->start_all_reduce(t, o));
  return collectives_->wait(id);
}

Status Group::all_reduce(const Buffer& inout, ReduceKind kind) {
  return all_reduce_with(inout, kind, codec(), -1);
}

Status Group::all_reduce_with(const Buffer& inout, ReduceKind kind, const std::string& spec, int stream) {
  if (stream >= kMaxUserStream)
    return invalid_argument(name_ + ": codec stream " + std::to_string(stream) + " is not below 2^19");
  if (inout.elem == Elem::f32 && (kind == ReduceKind::sum || kind == ReduceKind::avg) && inout.numel > 0 && size() > 1)
    return compressed_all_reduce(inout, kind, spec, stream);
  const uint32_t step = next_step();
  const std::string what = op_name("all-reduce", step) + " (" + reduce_name(kind) + ", " + elem_name(inout.elem) + ")";
  if (spec != "none" && inout.elem == Elem::f32 && size() > 1)
    return invalid_argument(what + ": the codec '" + spec +
                            "' compresses SUM and AVG only; set the codec to none for " + reduce_name(kind));
  return exchange_reduce(what, tag(step, Role::kWeightGrad), std::vector<const void*>(size(), inout.data), inout, kind);
}

Status Group::broadcast(const Buffer& inout, int root) {
  const uint32_t step = next_step();
  const std::string what = op_name("broadcast", step) + " from rank " + std::to_string(members_[root]);
  std::vector<Part> sends, recvs;
  if (index_ == root) {
    for (int j = 0; j < size(); ++j)
      if (j != index_) sends.push_back({j, inout.data, inout.bytes()});
  } else {
    recvs.push_back({root, inout.data, inout.bytes()});
  }
  return transfer_all(what, tag(step, Role::kOther), sends, recvs);
}

Status Group::all_gather(const Buffer& in, const std::vector<Buffer>& outs) {
  const uint32_t step = next_step();
  const std::string what = op_name("all-gather", step);
  if (int(outs.size()) != size())
    return invalid_argument(what + ": " + std::to_string(outs.size()) + " outputs for a group of " +
                            std::to_string(size()));
  std::vector<Part> sends, recvs;
  for (int j = 0; j < size(); ++j) {
    if (outs[j].bytes() != in.bytes())
      return invalid_argument(what + ": output " + std::to_string(j) + " holds " + std::to_string(outs[j].bytes()) +
                              " bytes, the input " + std::to_string(in.bytes()));
    if (j == index_) continue;
    sends.push_back({j, in.data, in.bytes()});
    recvs.push_back({j, outs[j].data, outs[j].bytes()});
  }
  LH_RETURN_IF_ERROR(transfer_all(what, tag(step, Role::kOther), sends, recvs));
  if (outs[index_].data != in.data && in.bytes() > 0) std::memmove(outs[index_].data, in.data, in.bytes());
  return Status::Ok();
}

Status Group::reduce_scatter(const std::vector<Buffer>& ins, const Buffer& out, ReduceKind kind) {
  const uint32_t step = next_step();
  const std::string what =
      op_name("reduce-scatter", step) + " (" + reduce_name(kind) + ", " + elem_name(out.elem) + ")";
  if (int(ins.size()) != size())
    return invalid_argument(what + ": " + std::to_string(ins.size()) + " inputs for a group of " +
                            std::to_string(size()));
  std::vector<const void*> mine(size());
  for (int j = 0; j < size(); ++j) {
    if (ins[j].bytes() != out.bytes() || ins[j].elem != out.elem)
      return invalid_argument(what + ": input " + std::to_string(j) + " is " + std::to_string(ins[j].numel) + " " +
                              elem_name(ins[j].elem) + ", the output " + std::to_string(out.numel) + " " +
                              elem_name(out.elem));
    mine[j] = ins[j].data;
  }
  return exchange_reduce(what, tag(step, Role::kWeightGrad), mine, out, kind);
}

Status Group::barrier() {
  const uint32_t step = next_step();
  uint8_t token = 1;
  Buffer b{&token, 1, Elem::u8};
  return exchange_reduce(op_name("barrier", step), tag(step, Role::kOther), std::vector<const void*>(size(), &token), b,
                         ReduceKind::max);
}

namespace {
Tag p2p_tag(int tag_group, int64_t tag) {
  return make_tag((uint32_t(tag_group) << 16) | uint32_t(tag & 0xFFFF), uint16_t((tag >> 16) & 0xFFF),
                  Role::kActivation);
}
}  // namespace

void Group::queue_transfer(Transfer t, std::function<void(const Status&)> done) {
  std::lock_guard<std::mutex> lock(mu_);
  transfers_.emplace_back(std::move(t), std::move(done));
  cv_.notify_all();
}

namespace {
Result<DType> codec_dtype(Elem e, const std::string& what) {
  switch (e) {
    case Elem::f32:
      return DType::f32;
    case Elem::f16:
      return DType::f16;
    case Elem::bf16:
      return DType::bf16;
    default:
      return invalid_argument(what + ": a p2p codec encodes float32, float16 or bfloat16 tensors, not " + elem_name(e) +
                              " (set the p2p codec to none for them)");
  }
}
}  // namespace

void Group::send(const Buffer& data, int dst, int64_t tag, std::function<void(const Status&)> done) {
  const std::string what = fmt::format("{}: send to group rank {} with tag {}", name_, dst, tag);
  if (tag < 0 || tag >= (int64_t(1) << 28) || dst < 0 || dst >= size() || dst == index_)
    return done(invalid_argument(what + ": the peer must be another member and 0 <= tag < 2^28"));
  std::unique_lock<std::mutex> lock(mu_);
  if (p2p_spec_ == "none") {
    lock.unlock();
    return queue_transfer(plane_->net().send_view(members_[dst], p2p_tag(tag_group_, tag), data.data, data.bytes()),
                          std::move(done));
  }
  // Encoded on the caller's thread, in the order of the sends (the stream state sees them in order).
  auto dtype = codec_dtype(data.elem, what);
  if (!dtype.ok()) return lock.unlock(), done(dtype.status());
  compress::StreamState& st =
      p2p_states_.try_emplace({dst, tag, 0}, compress::StreamState(Role::kActivation)).first->second;
  compress::Packet packet;
  Status s = p2p_chain_.encode(Tensor::borrow(data.data, {data.numel}, *dtype), st, &packet);
  lock.unlock();
  if (!s.ok()) return done(Status(s.code(), what + ": " + s.message()));
  queue_transfer(
      plane_->net().send(members_[dst], p2p_tag(tag_group_, tag), std::move(packet.bytes), uint64_t(data.numel) * 4),
      std::move(done));
}

void Group::recv(const Buffer& data, int src, int64_t tag, std::function<void(const Status&)> done) {
  const std::string what = fmt::format("{}: receive from group rank {} with tag {}", name_, src, tag);
  if (tag < 0 || tag >= (int64_t(1) << 28) || src < 0 || src >= size() || src == index_)
    return done(invalid_argument(what + ": the peer must be another member and 0 <= tag < 2^28"));
  const int rank = members_[src];
  const uint64_t want = data.bytes();
  if (p2p_codec() == "none") {
    Transfer t = plane_->net().recv_into(rank, p2p_tag(tag_group_, tag), data.data, want);
    auto checked = [t, want, what, rank, done = std::move(done)](const Status& s) {
      if (s.ok() && t.wire_bytes() != want)
        return done(invalid_argument(
            fmt::format("{}: rank {} sent {} bytes, this receive holds {}", what, rank, t.wire_bytes(), want)));
      done(s);
    };
    return queue_transfer(t, std::move(checked));
  }
  auto dtype = codec_dtype(data.elem, what);
  if (!dtype.ok()) return done(dtype.status());
  // Decoded on the transfer thread when it lands, with this (peer, tag)'s receive state.
  Transfer t = plane_->net().recv(rank, p2p_tag(tag_group_, tag), want / elem_size(data.elem) * 4);
  auto decode = [this, t, data, dt = *dtype, src, tag, what, done = std::move(done)](const Status& s) mutable {
    if (!s.ok()) return done(s);
    Bytes packet = t.take();
    Tensor out = Tensor::borrow(data.data, {data.numel}, dt);
    const Shape shape{data.numel};
    compress::DecodeOptions o;
    o.expect_shape = &shape;
    std::lock_guard<std::mutex> lock(mu_);
    compress::StreamState& st =
        p2p_states_.try_emplace({src, tag, 1}, compress::StreamState(Role::kActivation)).first->second;
    Status d = compress::decode_packet(packet.data(), packet.size(), st, &out, o);
    done(d.ok() ? d : Status(d.code(), what + ": " + d.message()));
  };
  queue_transfer(t, std::move(decode));
}

Status Group::forge_for_tests(int dst, int64_t tag) {
  if (dst < 0 || dst >= size() || dst == index_) return invalid_argument("forge_for_tests: another member, please");
  return plane_->send_forged_for_tests(members_[dst], p2p_tag(tag_group_, tag), 4096);
}

Status Group::set_p2p_codec(const std::string& spec) {
  LH_ASSIGN_OR_RETURN(compress::CodecChain chain, compress::parse_codec_spec(spec));
  if (chain.needs_sample_ids())
    return invalid_argument("p2p codec '" + spec + "': delta needs sample ids, which send/recv do not carry");
  std::lock_guard<std::mutex> lock(mu_);
  p2p_spec_ = spec;
  p2p_chain_ = std::move(chain);
  return Status::Ok();
}

std::string Group::p2p_codec() const {
  std::lock_guard<std::mutex> lock(mu_);
  return p2p_spec_;
}

Status Group::powersgd(const Buffer& grads, int bucket, const std::vector<Shape>& shapes, int rank,
                       const std::string& wire) {
  const std::string what = fmt::format("{}: PowerSGD of bucket {}", name_, bucket);
  if (grads.elem != Elem::f32) return invalid_argument(what + ": float32 gradients only, got " + elem_name(grads.elem));
  if (rank < 1 || rank > 1024) return invalid_argument(what + ": rank " + std::to_string(rank) + " is outside 1..1024");
  LH_RETURN_IF_ERROR(compress::parse_codec_spec(wire).status());
  PowerSgdState& ps = powersgd_[bucket];
  if (!ps.bucket || ps.shapes != shapes || ps.rank != rank) {  // DDP rebuilds its buckets after the first step
    ParamGroup layout;
    int64_t offset = 0;
    for (const Shape& sh : shapes) {
      ParamSlice slice;
      slice.offset = offset;
      const int64_t n = shape_numel(sh);
      slice.shape = sh.size() >= 2 ? Shape{sh[0], sh[0] ? n / sh[0] : 0} : Shape{n};
      offset += n;
      layout.slices.push_back(slice);
    }
    if (offset != grads.numel)
      return invalid_argument(
          fmt::format("{}: the parameters' shapes hold {} values, the bucket {}", what, offset, grads.numel));
    ps.bucket = std::make_unique<PowerSgdBucket>(layout, rank, 0x5057534744ull + uint64_t(bucket));
    ps.shapes = shapes;
    ps.rank = rank;
  }
  if (size() == 1) return Status::Ok();
  // Each factor has a codec stream of its own per bucket: 3 per bucket, after the explicit ones.
  // The meter counts P and Q as the matrices they stand for (raw bytes), as the C++ jobs' reducer does.
  const PowerSgdBucket& b = *ps.bucket;
  const double factor_scale =
      b.p_values() + b.q_values() > 0 ? double(b.matrix_values()) / double(b.p_values() + b.q_values()) : 1.0;
  auto reduce = [&](std::vector<float>& v, int k) -> Status {
    if (v.empty()) return Status::Ok();
    return compressed_all_reduce(Buffer{v.data(), int64_t(v.size()), Elem::f32}, ReduceKind::avg, wire,
                                 kMaxUserStream + 3 * bucket + k, k == 1 ? 1.0 : factor_scale);
  };
  std::vector<float> p, rest, q;
  ps.bucket->round1(static_cast<const float*>(grads.data), &p, &rest);
  LH_RETURN_IF_ERROR(reduce(p, 0));
  LH_RETURN_IF_ERROR(reduce(rest, 1));
  ps.bucket->round2(p, &q);
  LH_RETURN_IF_ERROR(reduce(q, 2));
  ps.bucket->finish(static_cast<float*>(grads.data), q, rest);
  return Status::Ok();
}

Status Group::set_codec(const std::string& spec) {
  LH_RETURN_IF_ERROR(compress::parse_codec_spec(spec).status());
  std::lock_guard<std::mutex> lock(mu_);
  codec_ = spec;
  return Status::Ok();
}

std::string Group::codec() const {
  std::lock_guard<std::mutex> lock(mu_);
  return codec_;
}

std::string metrics_line(Plane& plane, int64_t step, const double* loss, const std::string& codec) {
  WorkerStepMetrics m;
  m.step = step;
  m.worker = plane.rank();
  m.stage = 0;
  if (loss) m.loss = *loss;
  m.auth_failures = plane.data().auth_failures();
  auto links = link_traffic_from_json(plane.meter()->to_json()["links"], "the plane's meter");
  if (links.ok()) {
    m.links = std::move(links).value();
    for (LinkTraffic& l : m.links)
      if (l.role == "grad") l.codec = codec;
  }
  plane.meter()->reset_counters();
  return step_metrics_to_line(m);
}

}  // namespace lh::py
