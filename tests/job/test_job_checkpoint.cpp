// Tests for JobCheckpointStore: a step is committed only with every shard, loads give the bytes back, old steps
// are pruned, and a corrupted, truncated or foreign newest checkpoint falls back to the one before it with a
// warning naming why. Label `job`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "job/job_checkpoint.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "lh_jobckpt_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  return d;
}

std::string shard_bytes(int64_t step, int rank) {
  return "shard of rank " + std::to_string(rank) + " at step " + std::to_string(step) + std::string(100, char(rank));
}

void save_step(JobCheckpointStore& store, int64_t step, int workers) {
  for (int r = 0; r < workers; ++r) {
    bool complete = value_of(store.add_shard(step, r, shard_bytes(step, r)));
    EXPECT_EQ(complete, r == workers - 1) << "step " << step << " rank " << r;
  }
  ASSERT_TRUE(store.commit(step, {{"note", "test"}}).ok());
}

TEST(JobCheckpointTest, CommitsOnlyCompleteStepsAndLoadsThemBack) {
  const std::string dir = fresh_dir("commit");
  auto store = value_of(JobCheckpointStore::open(dir, 3, "h1", 3));
  EXPECT_EQ(store->load_latest(nullptr).status().code(), StatusCode::kNotFound);
  save_step(*store, 2, 3);
  // Step 4 never completes (a worker died before sending its shard): not a checkpoint.
  EXPECT_FALSE(value_of(store->add_shard(4, 0, shard_bytes(4, 0))));
  EXPECT_FALSE(store->commit(4, {}).ok());
  EXPECT_FALSE(fs::exists(dir + "/step_00000004/manifest.json"));
  auto again = value_of(JobCheckpointStore::open(dir, 3, "h1", 3));
  EXPECT_EQ(again->last_committed(), 2);
  std::vector<std::string> warnings;
  JobCheckpoint c = value_of(again->load_latest(&warnings));
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(c.step, 2);
  ASSERT_EQ(c.shards.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(c.shards[size_t(r)], shard_bytes(2, r));
  EXPECT_EQ(c.manifest.value("note", ""), "test");
}

TEST(JobCheckpointTest, RefusesBadShards) {
  auto store = value_of(JobCheckpointStore::open(fresh_dir("bad"), 2, "h1", 3));
  EXPECT_NE(store->add_shard(2, 2, "x").status().message().find("rank 2"), std::string::npos);
  EXPECT_NE(store->add_shard(2, -1, "x").status().message().find("rank -1"), std::string::npos);
  EXPECT_FALSE(store->add_shard(2, 0, "").ok());
  ASSERT_TRUE(store->add_shard(2, 0, "x").ok());
  EXPECT_NE(store->add_shard(2, 0, "y").status().message().find("second"), std::string::npos);
  ASSERT_TRUE(value_of(store->add_shard(2, 1, "y")));
  ASSERT_TRUE(store->commit(2, {}).ok());
  EXPECT_NE(store->add_shard(2, 0, "z").status().message().find("committed step 2"), std::string::npos);
  EXPECT_FALSE(JobCheckpointStore::open(fresh_dir("keep0"), 2, "h", 0).ok());
}

TEST(JobCheckpointTest, PrunesToTheNewestKeepAndDropsAbandonedSteps) {
  const std::string dir = fresh_dir("prune");
  auto store = value_of(JobCheckpointStore::open(dir, 2, "h1", 2));
  save_step(*store, 2, 2);
  ASSERT_TRUE(store->add_shard(3, 0, "abandoned").ok());  // an unfinished step before the next commit
  save_step(*store, 4, 2);
  save_step(*store, 6, 2);
  EXPECT_FALSE(fs::exists(dir + "/step_00000002"));
  EXPECT_FALSE(fs::exists(dir + "/step_00000003"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000004/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000006/manifest.json"));
  ASSERT_TRUE(store->add_shard(8, 1, "rolled back").ok());
  store->discard_uncommitted_after(6);
  EXPECT_FALSE(fs::exists(dir + "/step_00000008"));
  EXPECT_TRUE(value_of(store->add_shard(8, 1, shard_bytes(8, 1))) == false);  // step 8 can be saved again
}

TEST(JobCheckpointTest, ADamagedNewestCheckpointFallsBackToTheOneBefore) {
  struct Damage {
    const char* what;
    const char* expect;
    std::function<void(const std::string& step_dir)> apply;
  };
  const std::vector<Damage> damages = {
      {"a flipped byte", "corrupted",
       [](const std::string& d) {
         std::fstream f(d + "/rank_0001.shard", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(5);
         f.put('#');
       }},
      {"a truncated shard", "truncated", [](const std::string& d) { fs::resize_file(d + "/rank_0000.shard", 10); }},
      {"a missing shard", "rank 1's shard", [](const std::string& d) { fs::remove(d + "/rank_0001.shard"); }},
      {"a torn manifest", "not a JSON object",
       [](const std::string& d) { std::ofstream(d + "/manifest.json") << "{\"step\": 6, \"shar"; }},
      {"a manifest nested 100,000 deep", "manifest.json: JSON nested more than 64 levels deep",
       [](const std::string& d) {
         std::ofstream(d + "/manifest.json")
             << "{\"step\":6,\"job\":" << std::string(100000, '[') << std::string(100000, ']') << "}";
       }},
      {"a manifest without shards", "lacks a field",
       [](const std::string& d) {
         std::ofstream(d + "/manifest.json") << R"({"step":6,"workers":2,"resume_hash":"h1"})";
       }},
  };
  for (const Damage& dmg : damages) {
    const std::string dir = fresh_dir("damage");
    {
      auto store = value_of(JobCheckpointStore::open(dir, 2, "h1", 3));
      save_step(*store, 4, 2);
      save_step(*store, 6, 2);
    }
    dmg.apply(dir + "/step_00000006");
    auto store = value_of(JobCheckpointStore::open(dir, 2, "h1", 3));
    std::vector<std::string> warnings;
    JobCheckpoint c = value_of(store->load_latest(&warnings));
    EXPECT_EQ(c.step, 4) << dmg.what;
    ASSERT_EQ(warnings.size(), 1u) << dmg.what;
    EXPECT_NE(warnings[0].find("step 6"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find(dmg.expect), std::string::npos) << dmg.what << ": " << warnings[0];
    EXPECT_EQ(c.shards[1], shard_bytes(4, 1));
    // The unusable one is moved aside; step 6 can be checkpointed again.
    EXPECT_TRUE(fs::exists(dir + "/step_00000006.unusable")) << dmg.what;
    EXPECT_EQ(store->last_committed(), 4);
    save_step(*store, 6, 2);
  }
}

// Checkpoints hold the model and the job: their files are the owner's only (0600, in 0700 step directories), and a
// rank may hold shards in only a few unfinished steps (a member parking shards for future steps fills no disk).
TEST(JobCheckpointTest, FilesAreTheOwnersAndARanksUnfinishedStepsAreBounded) {
  const std::string dir = fresh_dir("modes");
  auto store = value_of(JobCheckpointStore::open(dir, 2, "h1", 3));
  save_step(*store, 2, 2);
  for (const char* f : {"/step_00000002/manifest.json", "/step_00000002/rank_0000.shard"})
    EXPECT_EQ(fs::status(dir + f).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write) << f;
  EXPECT_EQ(fs::status(dir + "/step_00000002").permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
  for (int i = 0; i < JobCheckpointStore::kMaxPendingStepsPerRank; ++i)
    EXPECT_FALSE(value_of(store->add_shard(10 * (i + 1), 1, shard_bytes(10 * (i + 1), 1))));
  Status more = store->add_shard(1000, 1, shard_bytes(1000, 1)).status();
  EXPECT_NE(more.message().find("from rank 1, which already has shards in 8 unfinished checkpoints"), std::string::npos)
      << more.message();
  EXPECT_FALSE(fs::exists(dir + "/step_00001000"));
  // The other rank completes a parked step, which then commits; rank 1 may park another.
  EXPECT_TRUE(value_of(store->add_shard(10, 0, shard_bytes(10, 0))));
  ASSERT_TRUE(store->commit(10, {}).ok());
  EXPECT_FALSE(value_of(store->add_shard(1000, 1, shard_bytes(1000, 1))));
}

TEST(JobCheckpointTest, AnotherJobsCheckpointIsRefusedNamingIt) {
  const std::string dir = fresh_dir("foreign");
  {
    auto store = value_of(JobCheckpointStore::open(dir, 2, "h1", 3));
    save_step(*store, 4, 2);
  }
  std::vector<std::string> warnings;
  auto other = value_of(JobCheckpointStore::open(dir, 2, "h2", 3));
  auto r = other->load_latest(&warnings);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("another job configuration"), std::string::npos) << warnings[0];
  auto bigger = value_of(JobCheckpointStore::open(dir, 3, "h1", 3));
  warnings.clear();
  EXPECT_FALSE(bigger->load_latest(&warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("2 workers"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace lh
