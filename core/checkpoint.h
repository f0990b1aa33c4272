// defines: lh::Checkpoint (model, optimizer state, RNG and data position, step, config) and its atomic,
// checksummed file format. Used by the trainer (`longhaul train --checkpoint-dir/--resume`) and stages.
#pragma once

#include <cereal/archives/portable_binary.hpp>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/gpt.h"
#include "core/rng.h"
#include "core/status.h"

namespace lh {

// File layout (little-endian): 8-byte magic "LHCKPT\0\1", u32 format version, u32 zero, u64 payload
// length, u64 xxHash64 of the payload, then the payload: a cereal portable-binary archive of Checkpoint.
// The header is checked before the payload is decoded, so a truncated or damaged file never gets as far
// as cereal; cereal's own failures are caught too.
constexpr uint32_t kCheckpointVersion = 1;
constexpr size_t kCheckpointHeaderBytes = 32;

// `value` as a cereal portable-binary archive: the payload of a checkpoint, a worker's shard, a reducer's state.
template <class T>
std::string to_portable_bytes(const T& value) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(os);
    ar(value);
  }
  return os.str();
}

// Reads what to_portable_bytes wrote into *value; a Corrupt status "WHAT does not decode (why)" when the bytes do
// not decode (cereal's exceptions and allocation failures are caught).
template <class T>
Status from_portable_bytes(const std::string& bytes, T* value, const std::string& what) {
  try {
    std::istringstream is(bytes, std::ios::binary);
    cereal::PortableBinaryInputArchive ar(is);
    ar(*value);
  } catch (const std::exception& e) {
    return corrupt(what + " does not decode (" + e.what() + ")");
  }
  return Status::Ok();
}

struct CheckpointGroup {
  std::string name;  // ParamGroup::name
  std::vector<float> params, adam_m, adam_v;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(name, params, adam_m, adam_v);
  }
};

struct Checkpoint {
  GptConfig model;
  std::string train_config_json;  // the run's settings (batch, lr schedule, seed …) as JSON
  int64_t step = 0;               // optimizer steps completed
  Rng data_rng;                   // the train sampler's position
  uint64_t data_fingerprint = 0;  // TextDataset::fingerprint of the data trained on
  std::vector<CheckpointGroup> groups;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(model, train_config_json, step, data_rng, data_fingerprint, groups);
  }
};

// Writes `path` atomically: a temp file in the same directory, fsync, rename, fsync of the directory.
Status save_checkpoint(const std::string& path, const Checkpoint& ckpt);
// Reads and verifies a checkpoint; a truncated, corrupted or foreign file is a kCorrupt error that says
// what is wrong, and nothing of it is returned.
Result<Checkpoint> load_checkpoint(const std::string& path);

// Writes `bytes` to `path` atomically (a temp file beside it, fsync, rename, fsync of the directory): a crash
// leaves the old file or the new one, never a torn one. The file gets `mode` (0600 by default: checkpoints hold a
// model's weights and the job's configuration, for the owner only).
Status write_file_atomically(const std::string& path, const std::string& bytes, unsigned mode = 0600);
// The whole file; more than `max_bytes` is a kCorrupt error (nothing larger is allocated).
Result<std::string> read_whole_file(const std::string& path, uint64_t max_bytes);

// "step_00000100.lhckpt": checkpoints of one run sort by step.
std::string checkpoint_filename(int64_t step);
// The checkpoint with the highest step in `dir`, or kNotFound.
Result<std::string> latest_checkpoint(const std::string& dir);
// A file is used as is; a directory means its latest checkpoint.
Result<std::string> resolve_checkpoint_path(const std::string& file_or_dir);

}  // namespace lh
