// Tests for checkpoint files: round trip, atomic write, and refusal of truncated, corrupted and
// foreign files with a message that says what is wrong (label core).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/checkpoint.h"
#include "tests/common/temp_dir.h"

namespace lh {
namespace {

Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.model.layers = 3;
  c.model.d_model = 32;
  c.model.heads = 2;
  c.train_config_json = R"({"batch":4})";
  c.step = 42;
  c.data_rng = Rng(9, 3);
  for (int i = 0; i < 5; ++i) c.data_rng.next_u32();
  c.data_fingerprint = 0x1234567890abcdefull;
  for (int g = 0; g < 3; ++g) {
    CheckpointGroup grp;
    grp.name = "block." + std::to_string(g);
    for (int i = 0; i < 100 + g; ++i) {
      grp.params.push_back(0.5f * i - g);
      grp.adam_m.push_back(1e-3f * i);
      grp.adam_v.push_back(1e-6f * i * i);
    }
    c.groups.push_back(grp);
  }
  return c;
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(Checkpoint, RoundTripKeepsEverything) {
  const std::string dir = temp_dir("ckpt");
  const std::string path = dir + "/" + checkpoint_filename(42);
  const Checkpoint c = sample_checkpoint();
  ASSERT_TRUE(save_checkpoint(path, c).ok());
  auto r = load_checkpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->model, c.model);
  EXPECT_EQ(r->train_config_json, c.train_config_json);
  EXPECT_EQ(r->step, 42);
  EXPECT_EQ(r->data_rng.seed(), 9u);
  EXPECT_EQ(r->data_rng.stream(), 3u);
  EXPECT_EQ(r->data_rng.offset(), c.data_rng.offset());
  EXPECT_EQ(r->data_fingerprint, c.data_fingerprint);
  ASSERT_EQ(r->groups.size(), 3u);
  for (size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(r->groups[g].name, c.groups[g].name);
    EXPECT_EQ(r->groups[g].params, c.groups[g].params);
    EXPECT_EQ(r->groups[g].adam_m, c.groups[g].adam_m);
    EXPECT_EQ(r->groups[g].adam_v, c.groups[g].adam_v);
  }
  // The write leaves no temp file behind.
  auto latest = latest_checkpoint(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, path);
  EXPECT_NE(::access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK), 0);
}

TEST(Checkpoint, TruncatedFilesAreRefused) {
  const std::string dir = temp_dir("ckpt");
  const std::string path = dir + "/c.lhckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_checkpoint()).ok());
  const std::string full = read_file(path);
  for (size_t keep : {size_t(0), size_t(10), kCheckpointHeaderBytes - 1, kCheckpointHeaderBytes,
                      kCheckpointHeaderBytes + 5, full.size() / 2, full.size() - 1}) {
    write_file(path, full.substr(0, keep));
    auto r = load_checkpoint(path);
    ASSERT_FALSE(r.ok()) << "kept " << keep;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  }
  write_file(path, full + "xx");
  auto trailing = load_checkpoint(path);
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.status().message().find("trailing"), std::string::npos);
}

TEST(Checkpoint, CorruptedBytesAreRefused) {
  const std::string dir = temp_dir("ckpt");
  const std::string path = dir + "/c.lhckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_checkpoint()).ok());
  const std::string full = read_file(path);
  // Every tenth payload byte flipped in turn: the checksum catches each.
  for (size_t at = kCheckpointHeaderBytes; at < full.size(); at += full.size() / 10) {
    std::string bad = full;
    bad[at] ^= 0x20;
    write_file(path, bad);
    auto r = load_checkpoint(path);
    ASSERT_FALSE(r.ok()) << "byte " << at;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status().message();
  }
  std::string bad_magic = full;
  bad_magic[0] = 'X';
  write_file(path, bad_magic);
  EXPECT_NE(load_checkpoint(path).status().message().find("magic"), std::string::npos);
  std::string bad_version = full;
  bad_version[8] = 7;
  write_file(path, bad_version);
  EXPECT_NE(load_checkpoint(path).status().message().find("format version 7"), std::string::npos);
}

TEST(Checkpoint, PayloadThatDoesNotDecodeIsRefused) {
  // A consistent header around garbage: only the decoder can notice.
  const std::string dir = temp_dir("ckpt");
  const std::string path = dir + "/c.lhckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_checkpoint()).ok());
  std::string full = read_file(path);
  std::string payload(40, '\xff');
  std::string header = full.substr(0, kCheckpointHeaderBytes);
  uint64_t len = payload.size(), hash = XXH64(payload.data(), payload.size(), 0);
  for (int i = 0; i < 8; ++i) {
    header[16 + i] = static_cast<char>(len >> (8 * i));
    header[24 + i] = static_cast<char>(hash >> (8 * i));
  }
  write_file(path, header + payload);
  auto r = load_checkpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("decode"), std::string::npos) << r.status().message();
}

TEST(Checkpoint, MissingFilesAndDirectories) {
  EXPECT_EQ(load_checkpoint("/nonexistent/x.lhckpt").status().code(), StatusCode::kNotFound);
  const std::string dir = temp_dir("ckpt");
  EXPECT_EQ(latest_checkpoint(dir).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(load_checkpoint(dir).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(save_checkpoint("/nonexistent/dir/x.lhckpt", sample_checkpoint()).code(), StatusCode::kIo);
}

TEST(Checkpoint, LatestPicksTheHighestCompleteStep) {
  const std::string dir = temp_dir("ckpt");
  Checkpoint c = sample_checkpoint();
  for (int64_t s : {5, 120, 40}) {
    c.step = s;
    ASSERT_TRUE(save_checkpoint(dir + "/" + checkpoint_filename(s), c).ok());
  }
  write_file(dir + "/" + checkpoint_filename(900) + ".tmp.1", "partial");  // an interrupted write
  write_file(dir + "/notes.txt", "x");
  auto latest = resolve_checkpoint_path(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir + "/" + checkpoint_filename(120));
  auto r = load_checkpoint(*latest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->step, 120);
}

}  // namespace
}  // namespace lh
