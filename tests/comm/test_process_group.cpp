// Tests for ProcessGroup, the collectives layer: ring and direct all-reduce sum and average the members'
// tensors (exactly with `none`, within the codec's error otherwise) and leave the same bits on every member;
// error feedback keeps the running sum on track; several ops and f64 reductions share a step; a dead or
// silent peer fails the op naming it; bad groups and tensors are refused. Members run on threads joined by
// LocalDataPlane. Label `comm`.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <thread>

#include "comm/process_group.h"
#include "core/rng.h"
#include "tests/common/local_data_plane.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

// Member r's input of `step`: values of both signs with a per-member offset, so sums are not trivial.
std::vector<float> input_of(int r, int step, int64_t n) {
  Rng rng(1000 * r + step);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.normal() + 0.25f * float(r);
  return v;
}

// Runs `body(group, rank)` on every member's thread; returns each member's status.
// `sent`, when given, gets each member's wire bytes sent per destination rank.
std::vector<Status> run_members(int n, const std::function<Status(ProcessGroup&, int)>& body,
                                std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                std::vector<std::map<int, uint64_t>>* sent = nullptr) {
  if (sent) sent->assign(n, {});
  auto fabric = std::make_shared<LocalFabric>();
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      LocalDataPlane plane(fabric, r, n);
      plane.set_meter(std::make_shared<LinkMeter>(r));
      std::vector<int> members;
      for (int i = 0; i < n; ++i) members.push_back(i);
      auto g = ProcessGroup::create(plane, members, "test group", timeout);
      out[r] = g.ok() ? body(**g, r) : g.status();
      const nlohmann::json metered = plane.meter()->to_json();
      if (sent)
        for (const auto& l : metered["links"])
          if (l["dir"] == "send") (*sent)[r][l["dst"].get<int>()] += l["wire_bytes"].get<uint64_t>();
    });
  for (auto& t : threads) t.join();
  return out;
}

struct Case {
  int n;
  int64_t numel;
  CollectiveAlgo algo;
};

TEST(ProcessGroupTest, AllReduceWithoutACodecIsTheSumOnEveryMember) {
  for (Case c : {Case{2, 1001, CollectiveAlgo::kRing}, Case{3, 1001, CollectiveAlgo::kRing},
                 Case{4, 4096, CollectiveAlgo::kRing}, Case{4, 3, CollectiveAlgo::kRing},  // fewer values than members
                 Case{3, 777, CollectiveAlgo::kDirect}, Case{1, 10, CollectiveAlgo::kAuto},
                 Case{3, 1001, CollectiveAlgo::kMesh}, Case{4, 4099, CollectiveAlgo::kMesh},
                 Case{2, 500, CollectiveAlgo::kMesh}, Case{4, 3, CollectiveAlgo::kMesh},  // these two go direct
                 Case{4, 100000, CollectiveAlgo::kAuto}}) {
    for (bool average : {false, true}) {
      std::vector<std::vector<float>> results(c.n);
      auto st = run_members(c.n, [&](ProcessGroup& g, int r) -> Status {
        LH_RETURN_IF_ERROR(g.begin_step(1));
        Tensor t = Tensor::from_vector(input_of(r, 1, c.numel), {c.numel});
        CollectiveOptions o;
        o.algo = c.algo;
        o.average = average;
        LH_ASSIGN_OR_RETURN(int id, g.start_all_reduce(t, o));
        LH_RETURN_IF_ERROR(g.wait(id));
        LH_RETURN_IF_ERROR(g.wait_all());
        results[r] = t.to_vector();
        return Status::Ok();
      });
      const std::string what = "n=" + std::to_string(c.n) + " numel=" + std::to_string(c.numel) + " " +
                               collective_algo_name(c.algo) + (average ? " mean" : " sum");
      for (const Status& s : st) ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
      std::vector<std::vector<float>> in;
      for (int r = 0; r < c.n; ++r) in.push_back(input_of(r, 1, c.numel));
      for (int64_t k = 0; k < c.numel; ++k) {
        double want = 0;
        for (int r = 0; r < c.n; ++r) want += in[r][k];
        if (average) want /= c.n;
        ASSERT_NEAR(results[0][k], want, 1e-5 * (1 + std::fabs(want))) << what << " value " << k;
      }
      for (int r = 1; r < c.n; ++r) EXPECT_EQ(results[r], results[0]) << what << " member " << r;
    }
  }
}

TEST(ProcessGroupTest, CompressedHopsStayCloseAndIdenticalOnEveryMember) {
  const int64_t numel = 50000;
  for (const std::string spec : {"int8", "bf16", "ef+int4", "ef+topk:ratio=0.1+int8"})
    for (CollectiveAlgo algo : {CollectiveAlgo::kRing, CollectiveAlgo::kDirect, CollectiveAlgo::kMesh}) {
      const int n = 4;
      std::vector<std::vector<float>> results(n);
      std::vector<uint64_t> wire(n), raw(n);
      auto st = run_members(n, [&](ProcessGroup& g, int r) -> Status {
        LH_RETURN_IF_ERROR(g.begin_step(1));
        Tensor t = Tensor::from_vector(input_of(r, 1, numel), {numel});
        CollectiveOptions o;
        o.algo = algo;
        o.average = true;
        o.spec = spec;
        LH_RETURN_IF_ERROR(g.start_all_reduce(t, o).status());
        LH_RETURN_IF_ERROR(g.wait_all());
        results[r] = t.to_vector();
        return Status::Ok();
      });
      const std::string what = spec + " " + collective_algo_name(algo);
      for (const Status& s : st) ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
      for (int r = 1; r < n; ++r) ASSERT_EQ(results[r], results[0]) << what << " member " << r;
      if (spec.find("topk") != std::string::npos) continue;  // one step of top-k is far from the mean by design
      double err = 0, norm = 0;
      std::vector<std::vector<float>> in;
      for (int r = 0; r < n; ++r) in.push_back(input_of(r, 1, numel));
      for (int64_t k = 0; k < numel; ++k) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += in[r][k];
        want /= n;
        err += (results[0][k] - want) * (results[0][k] - want);
        norm += want * want;
      }
      // relative L2 error after 3 encodes (ring), 2 (mesh) or 1 (direct)
      const double bound = spec == "ef+int4" ? 0.25 : 0.03;
      EXPECT_LT(std::sqrt(err / norm), bound) << what;
    }
}

TEST(ProcessGroupTest, ErrorFeedbackKeepsTheRunningSumOnTrack) {
  // With ef the residual each hop leaves behind is sent later, so the sum over steps of the decoded results
  // tracks the true sum over steps; without ef the per-step errors of top-k add up.
  const int n = 3, steps = 30;
  const int64_t numel = 3000;
  auto drift = [&](const std::string& spec) {
    std::vector<double> got(numel, 0.0), want(numel, 0.0);
    auto st = run_members(n, [&](ProcessGroup& g, int r) -> Status {
      for (int step = 1; step <= steps; ++step) {
        LH_RETURN_IF_ERROR(g.begin_step(step));
        std::vector<float> in = input_of(r, step, numel);
        Tensor t = Tensor::from_vector(in, {numel});
        CollectiveOptions o;
        o.algo = CollectiveAlgo::kRing;
        o.spec = spec;
        LH_RETURN_IF_ERROR(g.start_all_reduce(t, o).status());
        LH_RETURN_IF_ERROR(g.wait_all());
        if (r == 0) {
          std::vector<std::vector<float>> all;
          for (int q = 0; q < n; ++q) all.push_back(input_of(q, step, numel));
          for (int64_t k = 0; k < numel; ++k) {
            got[k] += t.at(k);
            for (int q = 0; q < n; ++q) want[k] += all[q][k];
          }
        }
      }
      return Status::Ok();
    });
    for (const Status& s : st) EXPECT_TRUE(s.ok()) << spec << ": " << s.to_string();
    double err = 0, norm = 0;
    for (int64_t k = 0; k < numel; ++k) {
      err += (got[k] - want[k]) * (got[k] - want[k]);
      norm += want[k] * want[k];
    }
    return std::sqrt(err / norm);
  };
  const double with_ef = drift("ef+topk:ratio=0.1"), without = drift("topk:ratio=0.1");
  EXPECT_LT(with_ef, 0.5 * without) << "ef " << with_ef << " vs plain " << without;
  EXPECT_LT(with_ef, 0.35);
}

TEST(ProcessGroupTest, SeveralOpsAndF64ReductionsShareAStep) {
  const int n = 3;
  std::vector<std::vector<float>> a(n), b(n);
  std::vector<double> f(n);
  auto st = run_members(n, [&](ProcessGroup& g, int r) -> Status {
    for (int step = 1; step <= 3; ++step) {
      LH_RETURN_IF_ERROR(g.begin_step(step));
      Tensor x = Tensor::from_vector(input_of(r, step, 2000), {2000});
      Tensor y = Tensor::from_vector(input_of(r + 7, step, 50), {5, 10});
      CollectiveOptions o;
      o.algo = CollectiveAlgo::kRing;
      o.stream = 0;
      LH_ASSIGN_OR_RETURN(int ix, g.start_all_reduce(x, o));
      o.algo = CollectiveAlgo::kDirect;
      o.stream = 1;
      LH_ASSIGN_OR_RETURN(int iy, g.start_all_reduce(y, o));
      LH_ASSIGN_OR_RETURN(std::vector<double> s, g.all_reduce_f64({double(r) + 0.5, 1.0}));
      LH_RETURN_IF_ERROR(g.wait(iy));
      LH_RETURN_IF_ERROR(g.wait(ix));
      LH_RETURN_IF_ERROR(g.wait_all());
      a[r] = x.to_vector();
      b[r] = y.to_vector();
      if (s[1] != n) return internal_error("count " + std::to_string(s[1]));
      f[r] = s[0];
    }
    return Status::Ok();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(f[r], 0.5 + 1.5 + 2.5);
    EXPECT_EQ(a[r], a[0]);
    EXPECT_EQ(b[r], b[0]);
  }
  double want = 0;
  for (int r = 0; r < n; ++r) want += input_of(r + 7, 3, 50)[13];
  EXPECT_NEAR(b[0][13], want, 1e-5);
}

TEST(ProcessGroupTest, MeshSendsTwoNthsOfTheTensorOnEachPairLink) {
  // Per ordered pair, a mesh all-reduce carries one chunk each way per phase: 2/n of the tensor, where direct
  // carries all of it and a ring carries 2(n−1)/n of it on the one link to the next member.
  const int n = 4;
  const int64_t numel = 40000;
  const double tensor = double(numel) * 4;  // `none`: fp32 plus a small header per packet
  for (CollectiveAlgo algo : {CollectiveAlgo::kMesh, CollectiveAlgo::kDirect, CollectiveAlgo::kRing}) {
    std::vector<std::map<int, uint64_t>> sent;
    auto st = run_members(
        n,
        [&](ProcessGroup& g, int r) -> Status {
          LH_RETURN_IF_ERROR(g.begin_step(1));
          Tensor t = Tensor::from_vector(input_of(r, 1, numel), {numel});
          CollectiveOptions o;
          o.algo = algo;
          LH_RETURN_IF_ERROR(g.start_all_reduce(t, o).status());
          return g.wait_all();
        },
        std::chrono::seconds(30), &sent);
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
    const std::string what = collective_algo_name(algo);
    for (int r = 0; r < n; ++r) {
      double total = 0, busiest = 0;
      for (const auto& [dst, bytes] : sent[r]) {
        total += double(bytes);
        busiest = std::max(busiest, double(bytes));
      }
      const double want_total = algo == CollectiveAlgo::kDirect ? n - 1 : 2.0 * (n - 1) / n;
      const double want_busiest = algo == CollectiveAlgo::kMesh ? 2.0 / n : algo == CollectiveAlgo::kDirect ? 1 : 1.5;
      EXPECT_NEAR(total / tensor, want_total, 0.01) << what << " member " << r;
      EXPECT_NEAR(busiest / tensor, want_busiest, 0.01) << what << " member " << r;
      EXPECT_EQ(sent[r].size(), algo == CollectiveAlgo::kRing ? 1u : size_t(n - 1)) << what << " member " << r;
    }
  }
}

TEST(ProcessGroupTest, OpsOfOneStepRunOnBesideTheNextStepsOps) {
  // --sync delayed: step 1's all-reduce is started, step 2 begins and starts its own on the same stream, and both
  // finish with the right sums; ops on one stream are advanced in the order they started.
  const int n = 4;
  const int64_t numel = 3001;
  for (const std::string spec : {"none", "ef+int4"}) {
    std::vector<std::vector<float>> first(n), second(n);
    auto st = run_members(n, [&](ProcessGroup& g, int r) -> Status {
      LH_RETURN_IF_ERROR(g.begin_step(1));
      Tensor a = Tensor::from_vector(input_of(r, 1, numel), {numel});
      CollectiveOptions o;
      o.algo = CollectiveAlgo::kMesh;
      o.spec = spec;
      LH_ASSIGN_OR_RETURN(int ia, g.start_all_reduce(a, o));
      // Without keep_running the new step is refused while step 1's op runs (unless it already finished).
      LH_RETURN_IF_ERROR(g.begin_step(2, /*keep_running=*/true));
      Tensor b = Tensor::from_vector(input_of(r, 2, numel), {numel});
      LH_ASSIGN_OR_RETURN(int ib, g.start_all_reduce(b, o));
      LH_RETURN_IF_ERROR(g.wait(ib));  // waits behind step 1's op on the same stream
      LH_RETURN_IF_ERROR(g.wait(ia));
      LH_RETURN_IF_ERROR(g.wait_all());
      first[r] = a.to_vector();
      second[r] = b.to_vector();
      return Status::Ok();
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << spec << ": " << s.to_string();
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(first[r], first[0]) << spec;
      EXPECT_EQ(second[r], second[0]) << spec;
    }
    // `none`: the exact sums; ef+int4: within its error (relative L2; the second carries the first's residual).
    for (int step : {1, 2}) {
      const std::vector<float>& got = step == 1 ? first[0] : second[0];
      double err = 0, norm = 0;
      for (int64_t k = 0; k < numel; ++k) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += input_of(r, step, numel)[k];
        if (spec == "none") {
          ASSERT_NEAR(got[k], want, 1e-5 * (1 + std::fabs(want))) << "step " << step << " value " << k;
        }
        err += (got[k] - want) * (got[k] - want);
        norm += want * want;
      }
      EXPECT_LT(std::sqrt(err / norm), spec == "none" ? 1e-6 : 0.3) << spec << " step " << step;
    }
  }
}

TEST(ProcessGroupTest, ADeadPeerFailsTheOpNamingIt) {
  auto fabric = std::make_shared<LocalFabric>();
  LocalDataPlane plane(fabric, 0, 3);
  auto g = value_of(ProcessGroup::create(plane, {0, 1, 2}, "dp group of stage 0", std::chrono::seconds(30)));
  ASSERT_TRUE(g->begin_step(1).ok());
  Tensor t = Tensor::from_vector(std::vector<float>(300, 1.0f), {300});
  CollectiveOptions o;
  o.algo = CollectiveAlgo::kRing;
  int id = value_of(g->start_all_reduce(t, o));
  std::thread reporter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    plane.fail_peer(2, "heartbeat timeout");
  });
  Status s = g->wait(id);
  reporter.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("dp group of stage 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("from rank 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("heartbeat timeout"), std::string::npos) << s.message();
  // A new step cannot start over a failed op's leftovers silently: the error stays the op's.
  EXPECT_FALSE(g->poll().ok());
}

TEST(ProcessGroupTest, ASilentPeerTimesOutNamingIt) {
  auto fabric = std::make_shared<LocalFabric>();
  LocalDataPlane plane(fabric, 1, 2);
  auto g = value_of(ProcessGroup::create(plane, {0, 1}, "dp group of stage 3", std::chrono::milliseconds(200)));
  ASSERT_TRUE(g->begin_step(5).ok());
  Tensor t = Tensor::from_vector(std::vector<float>(10, 1.0f), {10});
  int id = value_of(g->start_all_reduce(t, CollectiveOptions{}));
  Status s = g->wait(id);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no packet from rank 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("of step 5"), std::string::npos) << s.message();
}

TEST(ProcessGroupTest, RefusesBadGroupsAndTensors) {
  auto fabric = std::make_shared<LocalFabric>();
  LocalDataPlane plane(fabric, 0, 3);
  auto expect = [](const Status& s, const std::string& says) {
    ASSERT_FALSE(s.ok()) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  const auto t = std::chrono::seconds(1);
  expect(ProcessGroup::create(plane, {}, "g", t).status(), "at least one member");
  expect(ProcessGroup::create(plane, {1, 2}, "g", t).status(), "this rank (0) is not a member");
  expect(ProcessGroup::create(plane, {0, 1, 1}, "g", t).status(), "rank 1 is listed twice");
  auto g = value_of(ProcessGroup::create(plane, {0, 1}, "g", t));
  ASSERT_TRUE(g->begin_step(1).ok());
  Tensor ints = value_of(Tensor::create({4}, DType::i32));
  expect(g->start_all_reduce(ints, CollectiveOptions{}).status(), "contiguous f32 tensor");
  CollectiveOptions bad;
  bad.spec = "int9";
  expect(g->start_all_reduce(Tensor::zeros({4}), bad).status(), "int9");
  EXPECT_FALSE(g->wait(42).ok());
  // An op still running blocks the next step.
  Tensor x = Tensor::zeros({4});
  ASSERT_TRUE(g->start_all_reduce(x, CollectiveOptions{}).ok());
  expect(g->begin_step(2), "still running");
  // Steps only go forward: packets are told apart by the step they were started in.
  expect(g->begin_step(1, /*keep_running=*/true), "steps only go forward");
}

}  // namespace
}  // namespace lh
