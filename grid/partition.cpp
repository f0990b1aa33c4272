// Contiguous splits of transformer blocks into pipeline stages: even, user-chosen, speed-proportional.
// Used by launch, the coordinator's plan and StageRunner.
#include "grid/partition.h"

#include <cmath>

#include "grid/parse_number.h"

namespace lh {
namespace {

Status check_shape(int layers, int stages) {
  if (stages < 1)
    return invalid_argument("partition: the number of stages must be at least 1, got " + std::to_string(stages));
  if (layers < 1)
    return invalid_argument("partition: the model must have at least 1 block, got " + std::to_string(layers));
  if (layers < stages)
    return invalid_argument("partition: " + std::to_string(layers) + " blocks cannot fill " + std::to_string(stages) +
                            " stages (every stage needs at least one block); use fewer stages or more layers");
  return Status::Ok();
}

}  // namespace

Result<Partition> Partition::even(int layers, int stages) {
  LH_RETURN_IF_ERROR(check_shape(layers, stages));
  std::vector<int> counts(stages, layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++counts[s];
  return Partition(std::move(counts));
}

Result<Partition> Partition::from_counts(const std::vector<int>& counts, int layers) {
  const int stages = static_cast<int>(counts.size());
  LH_RETURN_IF_ERROR(check_shape(layers, stages));
  int64_t sum = 0;
  for (int s = 0; s < stages; ++s) {
    if (counts[s] < 1)
      return invalid_argument("partition: stage " + std::to_string(s) + " has " + std::to_string(counts[s]) +
                              " blocks; every stage needs at least one");
    sum += counts[s];
  }
  if (sum != layers)
    return invalid_argument("partition: the stage block counts sum to " + std::to_string(sum) + " but the model has " +
                            std::to_string(layers) + " blocks");
  return Partition(counts);
}

Result<Partition> Partition::parse(const std::string& text, int layers, int stages) {
  if (stages < 1)
    return invalid_argument("partition: the number of stages must be at least 1, got " + std::to_string(stages));
  std::vector<int> counts;
  size_t pos = 0;
  while (true) {
    size_t comma = text.find(',', pos);
    std::string item = trim_spaces(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    const std::string what = "partition '" + text + "': entry " + std::to_string(counts.size() + 1);
    if (item.empty()) return invalid_argument(what + " is empty; expected comma-separated block counts such as 3,3,2");
    LH_ASSIGN_OR_RETURN(int n, parse_int(item, what));
    if (n < 1) return invalid_argument(what + " is " + std::to_string(n) + "; every stage needs at least one block");
    counts.push_back(n);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int>(counts.size()) != stages)
    return invalid_argument("partition '" + text + "' has " + std::to_string(counts.size()) +
                            " entries but the job has " + std::to_string(stages) + " stages");
  int64_t sum = 0;
  for (int n : counts) sum += n;
  if (sum != layers)
    return invalid_argument("partition '" + text + "' sums to " + std::to_string(sum) + " blocks but the model has " +
                            std::to_string(layers));
  return Partition(std::move(counts));
}

Result<Partition> Partition::proportional(int layers, const std::vector<double>& speeds) {
  const int stages = static_cast<int>(speeds.size());
  LH_RETURN_IF_ERROR(check_shape(layers, stages));
  for (int s = 0; s < stages; ++s)
    if (!(speeds[s] > 0) || !std::isfinite(speeds[s]))
      return invalid_argument("partition: stage " + std::to_string(s) + " has speed " + std::to_string(speeds[s]) +
                              "; speeds must be positive and finite");
  // Greedy min-max allocation: it is optimal for minimising max(n_s / speed_s) because each
  // stage's cost grows linearly in its own blocks only.
  std::vector<int> counts(stages, 1);
  for (int given = stages; given < layers; ++given) {
    int best = 0;
    double best_time = (counts[0] + 1) / speeds[0];
    for (int s = 1; s < stages; ++s) {
      double t = (counts[s] + 1) / speeds[s];
      if (t < best_time) best = s, best_time = t;
    }
    ++counts[best];
  }
  return Partition(std::move(counts));
}

int Partition::layers() const {
  int sum = 0;
  for (int n : counts_) sum += n;
  return sum;
}

StageSpan Partition::stage(int s) const {
  LH_ASSERT(s >= 0 && s < stages(), "stage " + std::to_string(s) + " outside partition " + to_string());
  StageSpan span;
  span.stage = s;
  for (int i = 0; i < s; ++i) span.first_block += counts_[i];
  span.num_blocks = counts_[s];
  span.has_embedding = s == 0;
  span.has_head = s == stages() - 1;
  return span;
}

int Partition::stage_of_block(int block) const {
  LH_ASSERT(block >= 0 && block < layers(), "block " + std::to_string(block) + " outside partition " + to_string());
  int end = 0;
  for (int s = 0; s < stages(); ++s) {
    end += counts_[s];
    if (block < end) return s;
  }
  return stages() - 1;  // unreachable after the assert
}

std::string Partition::to_string() const {
  std::string out;
  for (size_t i = 0; i < counts_.size(); ++i) out += (i ? "," : "") + std::to_string(counts_[i]);
  return out;
}

}  // namespace lh
