// Tests for DpReducer's state across a checkpoint: two replicas that save their reducers after three steps and
// resume in fresh reducers take the same fourth step, bit for bit, as the ones that kept going — with error
// feedback, PowerSGD (Q and error), DiLoCo (θ_sync, momentum) and --sync delayed (the averages in flight); without
// the saved state they would not; bad bytes are refused naming the problem. Replicas run on threads joined by
// LocalDataPlane. Label `comm`.
#include <gtest/gtest.h>

#include <functional>
#include <iterator>
#include <map>
#include <thread>

#include "comm/dp_reducer.h"
#include "core/rng.h"
#include "tests/comm/param_group_util.h"
#include "tests/common/local_data_plane.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

constexpr int64_t kRows = 96, kCols = 64;

std::vector<float> noise(uint64_t seed, int64_t n) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal();
  return v;
}

// A replica: its plane, reducer and bucket.
struct Replica {
  std::unique_ptr<LocalDataPlane> plane;
  std::unique_ptr<DpReducer> reducer;
  ParamGroup group = matrix_and_bias_group(kRows, kCols);  // one bucket, like a block's group
};

// Runs `body(replica, rank)` on two threads over a fresh fabric with fresh reducers for `spec`/`sync`.
std::vector<Status> with_replicas(const std::string& spec, const std::string& sync,
                                  const std::function<Status(Replica&, int)>& body) {
  auto fabric = std::make_shared<LocalFabric>();
  Topology topo = value_of(Topology::create(2, 1, 1, 2));
  std::vector<Status> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Replica rep;
      rep.plane = std::make_unique<LocalDataPlane>(fabric, r, 2);
      auto red = DpReducer::create(*rep.plane, topo, r, spec, std::chrono::seconds(30));
      if (!red.ok()) {
        out[r] = red.status();
        return;
      }
      rep.reducer = std::move(red).value();
      SyncConfig sc = value_of(parse_sync(sync));
      if (sc.diloco()) {
        out[r] = rep.reducer->start_diloco({&rep.group}, sc);
        if (!out[r].ok()) return;
      }
      if (sc.delayed()) {
        out[r] = rep.reducer->start_delayed(sc);
        if (!out[r].ok()) return;
      }
      out[r] = body(rep, r);
    });
  for (auto& t : threads) t.join();
  return out;
}

// Step `step` of replica `r`: every-step averages a fresh gradient; DiLoCo moves the weights, then syncs.
Status take_step(Replica& rep, int r, int step, bool diloco, std::vector<float>* result) {
  LH_RETURN_IF_ERROR(rep.reducer->begin_step(step));
  if (diloco) {
    std::vector<float> p = rep.group.params.to_vector();
    std::vector<float> d = noise(100 * r + step, rep.group.numel);
    for (size_t k = 0; k < p.size(); ++k) p[k] -= 0.01f * d[k];
    LH_RETURN_IF_ERROR(rep.group.params.copy_from(Tensor::from_vector(p, {rep.group.numel})));
    LH_RETURN_IF_ERROR(rep.reducer->outer_step({&rep.group}, {1}));
    *result = rep.group.params.to_vector();
    return Status::Ok();
  }
  LH_RETURN_IF_ERROR(
      rep.group.grads.copy_from(Tensor::from_vector(noise(100 * r + step, rep.group.numel), {rep.group.numel})));
  LH_RETURN_IF_ERROR(rep.reducer->bucket_ready(rep.group, 1));
  LH_RETURN_IF_ERROR(rep.reducer->finish());
  *result = rep.group.grads.to_vector();
  return Status::Ok();
}

struct Case {
  std::string spec, sync;
};

TEST(DpReducerState, ResumedReducersTakeTheSameNextStep) {
  for (const Case& c : {Case{"ef+int4", "every-step"}, Case{"powersgd:rank=2", "every-step"},
                        Case{"int4", "diloco:H=1,outer_lr=0.7,outer_momentum=0.9"}}) {
    const bool diloco = c.sync != "every-step";
    std::vector<std::string> saved(2);
    std::vector<std::vector<float>> kept(2), resumed(2), forgot(2), params(2);
    // Three steps, save, a fourth step.
    auto a = with_replicas(c.spec, c.sync, [&](Replica& rep, int r) -> Status {
      std::vector<float> out;
      for (int step = 1; step <= 3; ++step) LH_RETURN_IF_ERROR(take_step(rep, r, step, diloco, &out));
      LH_ASSIGN_OR_RETURN(saved[r], rep.reducer->save_state());
      params[r] = rep.group.params.to_vector();
      return take_step(rep, r, 4, diloco, &kept[r]);
    });
    for (const Status& s : a) ASSERT_TRUE(s.ok()) << c.spec << ": " << s.to_string();
    // Fresh reducers with the saved state (and the weights a checkpoint would hold) take the same fourth step.
    auto b = with_replicas(c.spec, c.sync, [&](Replica& rep, int r) -> Status {
      LH_RETURN_IF_ERROR(rep.group.params.copy_from(Tensor::from_vector(params[r], {rep.group.numel})));
      LH_RETURN_IF_ERROR(rep.reducer->load_state(saved[r]));
      return take_step(rep, r, 4, diloco, &resumed[r]);
    });
    for (const Status& s : b) ASSERT_TRUE(s.ok()) << c.spec << ": " << s.to_string();
    // Without the state the step differs: the test can tell.
    auto f = with_replicas(c.spec, c.sync, [&](Replica& rep, int r) -> Status {
      LH_RETURN_IF_ERROR(rep.group.params.copy_from(Tensor::from_vector(params[r], {rep.group.numel})));
      return take_step(rep, r, 4, diloco, &forgot[r]);
    });
    for (const Status& s : f) ASSERT_TRUE(s.ok()) << c.spec << ": " << s.to_string();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(resumed[r], kept[r]) << c.spec << " " << c.sync << " replica " << r;
      EXPECT_NE(forgot[r], kept[r]) << c.spec << " " << c.sync << " replica " << r;
    }
    EXPECT_EQ(kept[0], kept[1]) << c.spec;  // and the replicas agree
  }
}

TEST(DpReducerState, BadBytesAreRefusedNamingTheProblem) {
  auto st = with_replicas("ef+int4", "diloco:H=2", [&](Replica& rep, int r) -> Status {
    std::vector<float> out;
    LH_RETURN_IF_ERROR(take_step(rep, r, 1, true, &out));
    LH_ASSIGN_OR_RETURN(std::string good, rep.reducer->save_state());
    Status truncated = rep.reducer->load_state(good.substr(0, good.size() / 2));
    if (truncated.ok() || truncated.message().find("dp reducer state") == std::string::npos)
      return internal_error("truncated state accepted or unnamed: " + truncated.to_string());
    // Still usable after refusing, and the good bytes load.
    LH_RETURN_IF_ERROR(rep.reducer->load_state(good));
    return take_step(rep, r, 2, true, &out);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

// --sync delayed step `step` of replica `r`: a fresh gradient starts averaging, and every average due (from steps
// up to step − D) is finished; `applied` gets each one.
Status delayed_step(Replica& rep, int r, int step, int D, std::vector<std::vector<float>>* applied) {
  LH_RETURN_IF_ERROR(rep.reducer->begin_step(step));
  LH_RETURN_IF_ERROR(
      rep.group.grads.copy_from(Tensor::from_vector(noise(100 * r + step, rep.group.numel), {rep.group.numel})));
  LH_RETURN_IF_ERROR(rep.reducer->bucket_ready(rep.group, 1));
  for (int64_t from : rep.reducer->steps_in_flight()) {
    if (from > step - D) break;
    LH_RETURN_IF_ERROR(rep.reducer->finish_step(from));
    applied->push_back(rep.group.grads.to_vector());
  }
  return Status::Ok();
}

// Saved after step 3 with D steps in flight, the reducer goes on (a checkpoint) or a fresh one loads the bytes (a
// rollback): both apply the same averages at steps 4..6 as one that never saved. Bytes that do not fit the job are
// refused naming why, and the reducer still loads the good ones afterwards.
TEST(DpReducerState, DelayedAveragesInFlightAreSavedAndAppliedLater) {
  for (int D : {1, 2}) {
    const std::string sync = "delayed:D=" + std::to_string(D);
    std::vector<std::string> saved(2);
    std::vector<std::vector<std::vector<float>>> straight(2), kept(2), resumed(2);
    auto a = with_replicas("ef+int8", sync, [&](Replica& rep, int r) -> Status {
      std::vector<std::vector<float>> warm;
      for (int step = 1; step <= 3; ++step) LH_RETURN_IF_ERROR(delayed_step(rep, r, step, D, &warm));
      if (rep.reducer->steps_in_flight().size() != size_t(D))
        return internal_error("expected " + std::to_string(D) + " steps in flight at the save");
      LH_ASSIGN_OR_RETURN(saved[r], rep.reducer->save_state());
      for (int step = 4; step <= 6; ++step) LH_RETURN_IF_ERROR(delayed_step(rep, r, step, D, &kept[r]));
      return Status::Ok();
    });
    for (const Status& s : a) ASSERT_TRUE(s.ok()) << sync << ": " << s.to_string();
    auto b = with_replicas("ef+int8", sync, [&](Replica& rep, int r) -> Status {
      std::vector<std::vector<float>> warm;
      for (int step = 1; step <= 6; ++step)
        LH_RETURN_IF_ERROR(delayed_step(rep, r, step, D, step <= 3 ? &warm : &straight[r]));
      return Status::Ok();
    });
    for (const Status& s : b) ASSERT_TRUE(s.ok()) << sync << ": " << s.to_string();
    auto c = with_replicas("ef+int8", sync, [&](Replica& rep, int r) -> Status {
      ParamGroup other = matrix_and_bias_group(kRows, kCols + 1);
      const std::pair<std::map<int, ParamGroup*>, int64_t> bad[] = {
          {{}, 3}, {{{2, &rep.group}}, 3}, {{{1, &other}}, 3}, {{{1, &rep.group}}, 5}};
      const char* why[] = {"has 1 buckets, this stage has 0", "bucket 1 ('block.0') is not this stage's",
                           "this stage's is 'block.0' (6305 values)", "was expected (the last"};
      for (size_t i = 0; i < std::size(bad); ++i) {
        Status s = rep.reducer->load_state(saved[r], bad[i].first, bad[i].second);
        if (s.ok() || s.message().find(why[i]) == std::string::npos)
          return internal_error("case " + std::to_string(i) + " accepted or unnamed: " + s.to_string());
      }
      LH_RETURN_IF_ERROR(rep.reducer->load_state(saved[r], {{1, &rep.group}}, 3));
      for (int step = 4; step <= 6; ++step) LH_RETURN_IF_ERROR(delayed_step(rep, r, step, D, &resumed[r]));
      return Status::Ok();
    });
    for (const Status& s : c) ASSERT_TRUE(s.ok()) << sync << ": " << s.to_string();
    // Without --sync delayed the averages have nowhere to go.
    auto e = with_replicas("ef+int8", "every-step", [&](Replica& rep, int r) -> Status {
      Status s = rep.reducer->load_state(saved[r], {{1, &rep.group}}, 3);
      if (s.ok() || s.message().find("this job runs --sync every-step") == std::string::npos)
        return internal_error("accepted or unnamed: " + s.to_string());
      return Status::Ok();
    });
    for (const Status& s : e) ASSERT_TRUE(s.ok()) << sync << ": " << s.to_string();
    for (int r = 0; r < 2; ++r) {
      // Steps 4 and 5 apply the averages of steps 4 − D and 5 − D (in flight at the save); step 6, 6 − D.
      ASSERT_EQ(straight[r].size(), 3u) << sync;
      EXPECT_EQ(kept[r], straight[r]) << sync << " replica " << r;
      EXPECT_EQ(resumed[r], straight[r]) << sync << " replica " << r;
    }
    EXPECT_EQ(straight[0], straight[1]) << sync;
  }
}

}  // namespace
}  // namespace lh
