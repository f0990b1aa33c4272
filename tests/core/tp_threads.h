// defines: ThreadSum, a tp group's all-reduce for tensor shards run on threads of one test process (sums
// partial tensors in shard order, on any device). Used by the GPT tests (CPU and CUDA).
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lh {

// Sums partial tensors across n threads in shard order, as a tp group's all-reduce does.
class ThreadSum {
 public:
  explicit ThreadSum(int n) : parts_(n) {}
  Status operator()(int t, Tensor& x) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !reading_; });  // the previous sum is read by everyone
    parts_[t] = x.to_vector();
    if (++arrived_ == static_cast<int>(parts_.size())) {
      reading_ = true;
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return reading_; });
    std::vector<float> sum(parts_[0].size(), 0.f);
    for (const auto& p : parts_)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
    Status s = x.copy_from(Tensor::from_vector(sum, x.shape()));
    if (--arrived_ == 0) {
      reading_ = false;
      cv_.notify_all();
    }
    return s;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<float>> parts_;
  int arrived_ = 0;
  bool reading_ = false;
};

}  // namespace lh
