// defines: lh::Partition — a contiguous split of a model's L transformer blocks into S pipeline
// stages (even, user-chosen "3,3,2", or in proportion to measured worker speeds). Used by launch,
// the coordinator's plan and StageRunner.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace lh {

// What one stage holds: blocks [first_block, first_block + num_blocks), plus the token/position
// embedding on the first stage and the final layernorm, output head and loss on the last.
struct StageSpan {
  int stage = 0;
  int first_block = 0;
  int num_blocks = 0;
  bool has_embedding = false;
  bool has_head = false;
  int end_block() const { return first_block + num_blocks; }
};

class Partition {
 public:
  // L blocks over S stages as evenly as possible; the first L mod S stages get one block more.
  static Result<Partition> even(int layers, int stages);
  // A user string such as "3,3,2": exactly S positive counts that sum to L.
  static Result<Partition> parse(const std::string& text, int layers, int stages);
  // Blocks in proportion to each stage's measured speed (blocks per second, or any unit common to
  // all), every stage at least one block. Minimises the slowest stage's time, max(n_s / speed_s):
  // each block in turn goes to the stage that would finish it soonest (ties: the lower stage).
  static Result<Partition> proportional(int layers, const std::vector<double>& speeds);
  // Explicit counts, validated like parse().
  static Result<Partition> from_counts(const std::vector<int>& counts, int layers);

  int stages() const { return static_cast<int>(counts_.size()); }
  int layers() const;
  const std::vector<int>& counts() const { return counts_; }
  StageSpan stage(int s) const;
  // The stage that holds block b.
  int stage_of_block(int block) const;
  std::string to_string() const;  // "3,3,2", the form parse() reads

 private:
  explicit Partition(std::vector<int> counts) : counts_(std::move(counts)) {}
  std::vector<int> counts_;
};

}  // namespace lh
