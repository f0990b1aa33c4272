// Distributed job checkpoints on the coordinator: durable shards, a manifest committed last, pruning, and loading
// with fallback. Used by JobCoordinator.
#include "job/job_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/checkpoint.h"
#include "core/json_limits.h"
#include "core/log.h"

namespace lh {
namespace {

constexpr uint64_t kMaxShardBytes = uint64_t(1) << 36;
constexpr uint64_t kMaxManifestBytes = 16 << 20;

std::string shard_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%04d.shard", rank);
  return name;
}

std::string hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

}  // namespace

std::string JobCheckpointStore::step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

Result<std::unique_ptr<JobCheckpointStore>> JobCheckpointStore::open(const std::string& dir, int workers,
                                                                     const std::string& resume_hash, int keep) {
  if (dir.empty()) return invalid_argument("--checkpoint-dir: empty path");
  if (keep < 1) return invalid_argument("--keep-checkpoints " + std::to_string(keep) + ": keep at least 1");
  if (workers < 1) return invalid_argument("job checkpoints: no workers");
  std::error_code ec;
  if (std::filesystem::create_directories(dir, ec))
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  if (!std::filesystem::is_directory(dir, ec))
    return io_error("--checkpoint-dir '" + dir + "' is not a directory and cannot be created");
  std::unique_ptr<JobCheckpointStore> s(new JobCheckpointStore());
  s->dir_ = dir;
  s->hash_ = resume_hash;
  s->workers_ = workers;
  s->keep_ = keep;
  auto committed = s->steps_on_disk(true);
  s->committed_ = committed.empty() ? 0 : committed.back();
  return s;
}

std::vector<int64_t> JobCheckpointStore::steps_on_disk(bool committed) const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    long long step = -1;
    char tail = 0;
    if (std::sscanf(name.c_str(), "step_%lld%c", &step, &tail) != 1 || step < 0 || name != step_dir_name(step))
      continue;
    const bool has_manifest = std::filesystem::exists(e.path() / "manifest.json", ec);
    if (has_manifest == committed) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<bool> JobCheckpointStore::add_shard(int64_t step, int rank, const std::string& bytes) {
  if (rank < 0 || rank >= workers_)
    return invalid_argument("a checkpoint shard for rank " + std::to_string(rank) + " of a job of " +
                            std::to_string(workers_) + " workers");
  if (bytes.empty() || bytes.size() > kMaxShardBytes)
    return invalid_argument("a checkpoint shard of " + std::to_string(bytes.size()) + " bytes from rank " +
                            std::to_string(rank));
  std::lock_guard<std::mutex> lock(mu_);
  if (step <= committed_)
    return invalid_argument("a checkpoint shard for step " + std::to_string(step) + " from rank " +
                            std::to_string(rank) + ", at or before the committed step " + std::to_string(committed_));
  if (!pending_.count(step)) {
    int open = 0;  // unfinished steps this rank has a shard in
    for (const auto& [other, ranks] : pending_) open += int(ranks.count(rank));
    if (open >= kMaxPendingStepsPerRank)
      return invalid_argument("a checkpoint shard for step " + std::to_string(step) + " from rank " +
                              std::to_string(rank) + ", which already has shards in " + std::to_string(open) +
                              " unfinished checkpoints");
  }
  auto& have = pending_[step];
  if (have.count(rank))
    return invalid_argument("a second checkpoint shard for step " + std::to_string(step) + " from rank " +
                            std::to_string(rank));
  std::error_code ec;
  if (std::filesystem::create_directories(step_dir(step), ec))  // its files are the owner's only, and so is it
    std::filesystem::permissions(step_dir(step), std::filesystem::perms::owner_all, ec);
  if (ec) return io_error("cannot create '" + step_dir(step) + "': " + ec.message());
  LH_RETURN_IF_ERROR(write_file_atomically(step_dir(step) + "/" + shard_name(rank), bytes));
  have[rank] = {uint64_t(bytes.size()), XXH64(bytes.data(), bytes.size(), 0)};
  return int(have.size()) == workers_;
}

Status JobCheckpointStore::commit(int64_t step, const nlohmann::json& extra) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(step);
  if (it == pending_.end() || int(it->second.size()) != workers_)
    return internal_error("commit of checkpoint step " + std::to_string(step) + " before every shard arrived");
  nlohmann::json m = extra.is_object() ? extra : nlohmann::json::object();
  m["step"] = step;
  m["workers"] = workers_;
  m["resume_hash"] = hash_;
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& [rank, info] : it->second)
    shards.push_back(
        {{"rank", rank}, {"file", shard_name(rank)}, {"bytes", info.first}, {"xxh64", hex64(info.second)}});
  m["shards"] = shards;
  LH_RETURN_IF_ERROR(write_file_atomically(step_dir(step) + "/manifest.json", m.dump(1) + "\n"));
  committed_ = std::max(committed_, step);
  pending_.erase(pending_.begin(), std::next(it));
  lock.unlock();
  // Pruning: a failure to delete is only worth a warning.
  std::vector<int64_t> committed = steps_on_disk(true);
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep_) < committed.size(); ++i) std::filesystem::remove_all(step_dir(committed[i]), ec);
  for (int64_t s : steps_on_disk(false))
    if (s < step) std::filesystem::remove_all(step_dir(s), ec);
  if (ec) LH_LOG_WARN("checkpoints: pruning '{}': {}", dir_, ec.message());
  return Status::Ok();
}

Status JobCheckpointStore::set_aside(int64_t step, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string aside = step_dir(step) + ".unusable";
  std::error_code ec;
  std::filesystem::remove_all(aside, ec);
  std::filesystem::rename(step_dir(step), aside, ec);
  if (ec) return io_error("cannot move '" + step_dir(step) + "' aside: " + ec.message());
  (void)write_file_atomically(aside + "/why.txt", why + "\n");
  const std::vector<int64_t> committed = steps_on_disk(true);
  committed_ = committed.empty() ? 0 : committed.back();
  pending_.clear();
  return Status::Ok();
}

void JobCheckpointStore::discard_uncommitted_after(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  for (auto it = pending_.lower_bound(step + 1); it != pending_.end();) {
    std::filesystem::remove_all(step_dir(it->first), ec);
    it = pending_.erase(it);
  }
}

int64_t JobCheckpointStore::last_committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_;
}

void JobCheckpointStore::set_workers(int workers) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_ = workers;
  pending_.clear();
}

Result<JobCheckpoint> JobCheckpointStore::load(int64_t step, const GridCheck& fits) const {
  const std::string where = step_dir(step) + ": ";
  LH_ASSIGN_OR_RETURN(std::string text, read_whole_file(step_dir(step) + "/manifest.json", kMaxManifestBytes));
  Status bounded = check_json_limits(text, JsonLimits{kMaxManifestBytes}, where + "manifest.json");
  if (!bounded.ok()) return corrupt(bounded.message());
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return corrupt(where + "manifest.json is not a JSON object");
  try {
    if (m.at("step").get<int64_t>() != step) return corrupt(where + "the manifest says step " + m.at("step").dump());
    const int workers = m.at("workers").get<int>();
    if (fits) {
      Status f = fits(m);
      if (!f.ok()) return f.prepend(where.substr(0, where.size() - 2));
    } else if (workers != workers_) {
      return invalid_argument(where + "a checkpoint of " + m.at("workers").dump() + " workers; this job has " +
                              std::to_string(workers_));
    }
    if (workers < 1 || workers > 4096) return corrupt(where + "a checkpoint of " + m.at("workers").dump() + " workers");
    if (m.at("resume_hash").get<std::string>() != hash_)
      return invalid_argument(where +
                              "a checkpoint of another job configuration (model, data, grid, codecs or "
                              "optimizer differ; resume hash " +
                              m.at("resume_hash").get<std::string>() + ", this job's " + hash_ + ")");
    const nlohmann::json& shards = m.at("shards");
    if (!shards.is_array() || int(shards.size()) != workers)
      return corrupt(where + "the manifest lists " + std::to_string(shards.is_array() ? shards.size() : 0) +
                     " shards for " + std::to_string(workers) + " workers");
    JobCheckpoint c;
    c.step = step;
    c.shards.assign(size_t(workers), std::string());
    for (const auto& e : shards) {
      const int rank = e.at("rank").get<int>();
      if (rank < 0 || rank >= workers || !c.shards[size_t(rank)].empty())
        return corrupt(where + "the manifest lists rank " + std::to_string(rank) + " twice or out of range");
      const std::string file = step_dir(step) + "/" + shard_name(rank);
      const uint64_t bytes = e.at("bytes").get<uint64_t>();
      if (bytes == 0 || bytes > kMaxShardBytes) return corrupt(where + "rank " + std::to_string(rank) + "'s size");
      auto data = read_whole_file(file, bytes);
      if (!data.ok()) return Status(data.status()).prepend(where + "rank " + std::to_string(rank) + "'s shard");
      if (data->size() != bytes)
        return corrupt(where + "rank " + std::to_string(rank) + "'s shard holds " + std::to_string(data->size()) +
                       " bytes, the manifest says " + std::to_string(bytes) + " (truncated)");
      if (hex64(XXH64(data->data(), data->size(), 0)) != e.at("xxh64").get<std::string>())
        return corrupt(where + "rank " + std::to_string(rank) + "'s shard does not match its hash (corrupted)");
      c.shards[size_t(rank)] = std::move(*data);
    }
    c.manifest = std::move(m);
    return c;
  } catch (const std::exception& e) {
    return corrupt(where + "manifest.json lacks a field or has a wrong type (" + e.what() + ")");
  }
}

Result<JobCheckpoint> JobCheckpointStore::load_latest(std::vector<std::string>* warnings, const GridCheck& fits) {
  std::vector<int64_t> steps = steps_on_disk(true);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto c = load(*it, fits);
    if (c.ok()) {
      // Newer checkpoints that failed are moved aside (kept for inspection), so the job's next commits of those
      // steps do not mix with them.
      std::error_code ec;
      for (auto newer = steps.rbegin(); newer != it; ++newer) {
        const std::string aside = step_dir(*newer) + ".unusable";
        std::filesystem::remove_all(aside, ec);
        std::filesystem::rename(step_dir(*newer), aside, ec);
      }
      std::lock_guard<std::mutex> lock(mu_);
      committed_ = c->step;
      pending_.clear();
      return c;
    }
    if (warnings)
      warnings->push_back("checkpoint step " + std::to_string(*it) + " cannot be used: " + c.status().message() +
                          (std::next(it) != steps.rend() ? "; trying the one before it" : ""));
  }
  return not_found("no usable checkpoint in '" + dir_ + "'" +
                   (steps.empty() ? " (no committed step_*/manifest.json)" : ""));
}

}  // namespace lh
