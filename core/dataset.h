// defines: lh::TextDataset (bytes of a text corpus with a deterministic train/validation split) and
// lh::BatchSampler (seeded, resumable batches of byte tokens). Used by the trainer, pipeline stages and tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/status.h"

namespace lh {

enum class Split : uint8_t { train = 0, val = 1 };

// Where `longhaul train` looks for its default corpus: the plain-text files of Debian's `fortunes`
// and `fortunes-min` packages (installed by scripts/setup.sh).
constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

class TextDataset {
 public:
  // The bytes are cut into chunks of kChunk bytes; every kValEvery-th chunk goes to validation. A
  // split by interleaved chunks (not "the last 10%") keeps both halves drawn from the whole corpus,
  // which matters for a concatenation of topic files like fortunes.
  static constexpr int64_t kChunk = 4096;
  static constexpr int64_t kValEvery = 10;

  // Any byte string; fails if there are too few bytes for a train and a validation window of
  // `min_window` bytes each.
  static Result<TextDataset> from_bytes(std::string bytes, int64_t min_window, std::string source);
  // A text file: a missing, unreadable or empty file is an error that names the path.
  static Result<TextDataset> from_file(const std::string& path, int64_t min_window);
  // Every plain-text fortune file in `dir` (sorted by name, '%' separator lines dropped).
  static Result<TextDataset> default_corpus(int64_t min_window, const std::string& dir = kDefaultCorpusDir);

  const std::vector<uint8_t>& bytes(Split s) const { return s == Split::train ? train_ : val_; }
  int64_t size(Split s) const { return static_cast<int64_t>(bytes(s).size()); }
  const std::string& source() const { return source_; }
  // FNV-1a of all bytes: a checkpoint records it so a resume on other data is noticed.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::vector<uint8_t> train_, val_;
  std::string source_;
  uint64_t fingerprint_ = 0;
};

// Draws batches of `batch` windows of `seq + 1` consecutive bytes from one split; window starts
// are uniform over the split, from a Philox stream under `seed`. Its position (the RNG offsets) is
// all a checkpoint needs to continue the exact same sequence of batches.
class BatchSampler {
 public:
  BatchSampler() = default;
  BatchSampler(const TextDataset* data, Split split, int batch, int seq, uint64_t seed);

  // tokens[b*seq + t] = byte at start_b + t, targets[...] = the byte after it. Both hold batch*seq.
  void next(int32_t* tokens, int32_t* targets);
  void next(std::vector<int32_t>* tokens, std::vector<int32_t>* targets);

  int batch() const { return batch_; }
  int seq() const { return seq_; }
  const Rng& rng() const { return rng_; }
  // Restores a position saved with rng(); the seed and stream must match this sampler's.
  Status restore(const Rng& saved);

 private:
  const TextDataset* data_ = nullptr;
  Split split_ = Split::train;
  int batch_ = 0, seq_ = 0;
  Rng rng_;
};

}  // namespace lh
