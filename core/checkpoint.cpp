// Checkpoint files: the header (magic, version, length, xxHash64), atomic writes and verified reads.
// Used by the trainer and tests.
#include "core/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace lh {

namespace {

constexpr char kMagic[8] = {'L', 'H', 'C', 'K', 'P', 'T', '\0', '\1'};

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string errno_text() {
  return std::strerror(errno);
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("writing checkpoint '" + path + "': " + errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

std::string dir_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Status save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  const std::string payload = to_portable_bytes(ckpt);
  unsigned char header[kCheckpointHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  put_u32(header + 8, kCheckpointVersion);
  put_u32(header + 12, 0);
  put_u64(header + 16, payload.size());
  put_u64(header + 24, XXH64(payload.data(), payload.size(), 0));

  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes += payload;
  return write_file_atomically(path, bytes);
}

Status write_file_atomically(const std::string& path, const std::string& bytes, unsigned mode) {
  // The temp file lives beside the target so rename() stays within one filesystem and is atomic.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode_t(mode));
  if (fd < 0) return io_error("cannot create temp file '" + tmp + "': " + errno_text());
  // O_CREAT's mode is for a new file only (a crashed writer's leftover keeps its own) and passes through the umask.
  if (::fchmod(fd, mode_t(mode)) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error("cannot set the mode of '" + tmp + "': " + why);
  }
  Status s = write_all(fd, bytes.data(), bytes.size(), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = io_error("fsync of '" + tmp + "': " + errno_text());
  if (::close(fd) != 0 && s.ok()) s = io_error("closing '" + tmp + "': " + errno_text());
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = io_error("renaming '" + tmp + "' to '" + path + "': " + errno_text());
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // The rename itself is durable only once the directory entry is on disk.
  int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Result<std::string> read_whole_file(const std::string& path, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found("'" + path + "': " + errno_text());
  if (S_ISDIR(st.st_mode)) return invalid_argument("'" + path + "' is a directory");
  if (uint64_t(st.st_size) > max_bytes)
    return corrupt("'" + path + "' holds " + std::to_string(st.st_size) + " bytes, more than the " +
                   std::to_string(max_bytes) + " expected");
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) return io_error("'" + path + "' cannot be opened: " + errno_text());
  std::string bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), fp)) > 0 && bytes.size() <= max_bytes) bytes.append(buf, n);
  const bool read_error = std::ferror(fp) != 0;
  std::fclose(fp);
  if (read_error) return io_error("'" + path + "': read failed");
  if (bytes.size() > max_bytes) return corrupt("'" + path + "' grew past " + std::to_string(max_bytes) + " bytes");
  return bytes;
}

Result<Checkpoint> load_checkpoint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found("checkpoint '" + path + "': " + errno_text());
  if (S_ISDIR(st.st_mode)) return invalid_argument("checkpoint '" + path + "' is a directory");
  auto read = read_whole_file(path, uint64_t(1) << 40);
  if (!read.ok()) return Status(read.status()).prepend("checkpoint");
  const std::string& bytes = *read;

  const std::string where = "checkpoint '" + path + "': ";
  if (bytes.size() < kCheckpointHeaderBytes)
    return corrupt(where + "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                   std::to_string(kCheckpointHeaderBytes) + "-byte header");
  const auto* h = reinterpret_cast<const unsigned char*>(bytes.data());
  if (std::memcmp(h, kMagic, 8) != 0) return corrupt(where + "not a longhaul checkpoint (bad magic)");
  const uint32_t version = get_u32(h + 8);
  if (version != kCheckpointVersion)
    return corrupt(where + "format version " + std::to_string(version) + ", this build reads version " +
                   std::to_string(kCheckpointVersion));
  const uint64_t length = get_u64(h + 16), hash = get_u64(h + 24);
  const uint64_t have = bytes.size() - kCheckpointHeaderBytes;
  if (length != have)
    return corrupt(where + (have < length ? "truncated" : "trailing bytes") + ": the header says " +
                   std::to_string(length) + " payload bytes, the file holds " + std::to_string(have));
  const char* payload = bytes.data() + kCheckpointHeaderBytes;
  if (XXH64(payload, length, 0) != hash) return corrupt(where + "checksum mismatch: the payload is corrupted");

  Checkpoint c;
  Status decoded = from_portable_bytes(std::string(payload, length), &c, "payload");
  if (!decoded.ok()) return corrupt(where + decoded.message());
  Status cs = c.model.validate();
  if (!cs.ok()) return corrupt(where + cs.message());
  if (c.step < 0) return corrupt(where + "negative step " + std::to_string(c.step));
  for (const auto& g : c.groups)
    if (g.adam_m.size() != g.params.size() || g.adam_v.size() != g.params.size())
      return corrupt(where + "group '" + g.name + "' has optimizer state of a different size than its parameters");
  return c;
}

std::string checkpoint_filename(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%08lld.lhckpt", static_cast<long long>(step));
  return name;
}

Result<std::string> latest_checkpoint(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return not_found("checkpoint directory '" + dir + "': " + errno_text());
  std::string best;
  long long best_step = -1;
  while (dirent* e = ::readdir(d)) {
    long long step;
    char tail[16];
    // Only complete files: temp files end in ".tmp.<pid>" and do not match the pattern exactly.
    if (std::sscanf(e->d_name, "step_%lld.lhckp%1s", &step, tail) == 2 && std::strcmp(tail, "t") == 0 &&
        std::string(e->d_name) == checkpoint_filename(step) && step > best_step) {
      best_step = step;
      best = e->d_name;
    }
  }
  ::closedir(d);
  if (best_step < 0) return not_found("no checkpoint (step_*.lhckpt) in directory '" + dir + "'");
  return dir + "/" + best;
}

Result<std::string> resolve_checkpoint_path(const std::string& file_or_dir) {
  struct stat st {};
  if (::stat(file_or_dir.c_str(), &st) != 0) return not_found("checkpoint '" + file_or_dir + "': " + errno_text());
  if (S_ISDIR(st.st_mode)) return latest_checkpoint(file_or_dir);
  return file_or_dir;
}

}  // namespace lh
