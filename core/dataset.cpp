// TextDataset and BatchSampler: loading a corpus, the interleaved-chunk split and seeded batches.
// Used by the trainer, pipeline stages and tests.
#include "core/dataset.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace lh {

namespace {

Result<std::string> read_whole_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found("data file '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return invalid_argument("data file '" + path + "' is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("data file '" + path + "' cannot be opened: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("data file '" + path + "': read failed");
  return ss.str();
}

// Drops the '%' lines that separate fortunes; each fortune keeps its own trailing newline, and a blank
// line marks the boundary so the model still sees where one ends.
std::string strip_fortune_separators(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string_view line(text.data() + pos, end - pos);
    if (line == "%\n" || line == "%") {
      out += '\n';
    } else {
      out.append(line);
    }
    pos = end;
  }
  return out;
}

uint64_t fnv1a(const std::vector<uint8_t>& a, uint64_t h) {
  for (uint8_t c : a) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

Result<TextDataset> TextDataset::from_bytes(std::string bytes, int64_t min_window, std::string source) {
  if (bytes.empty()) return invalid_argument("data '" + source + "' is empty");
  TextDataset d;
  d.source_ = std::move(source);
  const int64_t n = static_cast<int64_t>(bytes.size());
  for (int64_t start = 0, chunk = 0; start < n; start += kChunk, ++chunk) {
    int64_t end = std::min(n, start + kChunk);
    auto& dst = (chunk % kValEvery == kValEvery - 1) ? d.val_ : d.train_;
    dst.insert(dst.end(), bytes.begin() + start, bytes.begin() + end);
  }
  // A corpus too small for one validation chunk still gets a validation split: its last tenth.
  if (d.val_.empty()) {
    int64_t nval = n / kValEvery;
    d.train_.assign(bytes.begin(), bytes.end() - nval);
    d.val_.assign(bytes.end() - nval, bytes.end());
  }
  const int64_t need = min_window + 1;
  if (d.size(Split::train) < need || d.size(Split::val) < need)
    return invalid_argument("data '" + d.source_ + "' has " + std::to_string(n) + " bytes: too few for windows of " +
                            std::to_string(need) + " bytes in both the train split (" +
                            std::to_string(d.size(Split::train)) + " bytes) and the validation split (" +
                            std::to_string(d.size(Split::val)) + " bytes); use a longer text or a shorter --seq");
  d.fingerprint_ = fnv1a(d.val_, fnv1a(d.train_, 0xcbf29ce484222325ull));
  return d;
}

Result<TextDataset> TextDataset::from_file(const std::string& path, int64_t min_window) {
  LH_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  if (text.empty()) return invalid_argument("data file '" + path + "' is empty");
  return from_bytes(std::move(text), min_window, path);
}

Result<TextDataset> TextDataset::default_corpus(int64_t min_window, const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d)
    return not_found("default corpus directory '" + dir + "' cannot be read (" + std::strerror(errno) +
                     "); install the Debian packages with scripts/setup.sh, or pass --data FILE");
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;
    // fortune's index files (.dat) and the .u8 links to the same text are skipped.
    auto ends_with = [&](const char* suf) {
      size_t n = std::strlen(suf);
      return name.size() >= n && name.compare(name.size() - n, n, suf) == 0;
    };
    if (ends_with(".dat") || ends_with(".u8")) continue;
    struct stat st {};
    std::string path = dir + "/" + name;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());  // readdir order differs between filesystems
  std::string all;
  for (const auto& name : names) {
    LH_ASSIGN_OR_RETURN(std::string text, read_whole_file(dir + "/" + name));
    all += strip_fortune_separators(text);
  }
  if (all.empty())
    return not_found("default corpus directory '" + dir +
                     "' holds no fortune text; install the Debian packages with scripts/setup.sh, or pass --data FILE");
  return from_bytes(std::move(all), min_window, "fortunes (" + dir + ", " + std::to_string(names.size()) + " files)");
}

BatchSampler::BatchSampler(const TextDataset* data, Split split, int batch, int seq, uint64_t seed)
    : data_(data), split_(split), batch_(batch), seq_(seq), rng_(seed, 0x5A3D0000ull + static_cast<uint64_t>(split)) {
  LH_ASSERT(data && batch > 0 && seq > 0 && data->size(split) >= seq + 1, "BatchSampler: window larger than the split");
}

void BatchSampler::next(int32_t* tokens, int32_t* targets) {
  const auto& bytes = data_->bytes(split_);
  const uint64_t starts = static_cast<uint64_t>(bytes.size()) - static_cast<uint64_t>(seq_);  // windows of seq+1
  for (int b = 0; b < batch_; ++b) {
    const uint8_t* p = bytes.data() + rng_.below(starts);
    for (int t = 0; t < seq_; ++t) {
      tokens[b * seq_ + t] = p[t];
      targets[b * seq_ + t] = p[t + 1];
    }
  }
}

void BatchSampler::next(std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  tokens->resize(static_cast<size_t>(batch_) * seq_);
  targets->resize(static_cast<size_t>(batch_) * seq_);
  next(tokens->data(), targets->data());
}

Status BatchSampler::restore(const Rng& saved) {
  if (saved.seed() != rng_.seed() || saved.stream() != rng_.stream())
    return invalid_argument("data sampler position is for seed " + std::to_string(saved.seed()) + " stream " +
                            std::to_string(saved.stream()) + ", but this run samples with seed " +
                            std::to_string(rng_.seed()) + " stream " + std::to_string(rng_.stream()));
  rng_ = saved;
  return Status::Ok();
}

}  // namespace lh
