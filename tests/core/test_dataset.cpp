// Tests for TextDataset (split, files, default corpus, errors) and BatchSampler (determinism, resume)
// (label core).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/dataset.h"

namespace lh {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "lh_dataset_" + std::to_string(::getpid()) + "_" + name;
}

std::string numbered_text(int64_t n) {
  std::string s;
  for (int64_t i = 0; static_cast<int64_t>(s.size()) < n; ++i) s += "line " + std::to_string(i) + " of the text\n";
  s.resize(n);
  return s;
}

TEST(TextDataset, SplitInterleavesChunksDeterministically) {
  const int64_t n = 25 * TextDataset::kChunk + 123;
  std::string text = numbered_text(n);
  auto d = TextDataset::from_bytes(text, 64, "test");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  // Chunks 9 and 19 go to validation: 2 chunks.
  EXPECT_EQ(d->size(Split::val), 2 * TextDataset::kChunk);
  EXPECT_EQ(d->size(Split::train), n - 2 * TextDataset::kChunk);
  const auto& val = d->bytes(Split::val);
  EXPECT_EQ(std::string(val.begin(), val.begin() + 16), text.substr(9 * TextDataset::kChunk, 16));
  auto again = TextDataset::from_bytes(text, 64, "test");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->fingerprint(), d->fingerprint());
  text[5] ^= 1;
  auto other = TextDataset::from_bytes(text, 64, "test");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->fingerprint(), d->fingerprint());
}

TEST(TextDataset, SmallTextStillGetsAValidationSplit) {
  auto d = TextDataset::from_bytes(numbered_text(1000), 16, "small");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->size(Split::val), 100);
  EXPECT_EQ(d->size(Split::train), 900);
}

TEST(TextDataset, TooShortForTheWindowNamesTheSizes) {
  auto d = TextDataset::from_bytes(numbered_text(300), 64, "short.txt");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("short.txt"), std::string::npos);
  EXPECT_NE(d.status().message().find("--seq"), std::string::npos) << d.status().message();
}

TEST(TextDataset, FileErrorsNameThePath) {
  auto missing = TextDataset::from_file("/nonexistent/dir/corpus.txt", 8);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/corpus.txt"), std::string::npos);

  const std::string empty = temp_path("empty.txt");
  { std::ofstream(empty).flush(); }
  auto e = TextDataset::from_file(empty, 8);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("empty"), std::string::npos);
  std::remove(empty.c_str());

  auto dir = TextDataset::from_file(::testing::TempDir(), 8);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("directory"), std::string::npos);

  const std::string good = temp_path("good.txt");
  { std::ofstream(good) << numbered_text(5000); }
  auto g = TextDataset::from_file(good, 8);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->size(Split::train) + g->size(Split::val), 5000);
  std::remove(good.c_str());
}

TEST(TextDataset, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of their mode";
  const std::string p = temp_path("noread.txt");
  { std::ofstream(p) << numbered_text(5000); }
  ASSERT_EQ(::chmod(p.c_str(), 0), 0);
  auto r = TextDataset::from_file(p, 8);
  EXPECT_FALSE(r.ok());
  std::remove(p.c_str());
}

TEST(TextDataset, DefaultCorpusIsFortunesWithoutSeparators) {
  if (::access(kDefaultCorpusDir, R_OK) != 0) GTEST_SKIP() << "fortunes not installed (scripts/setup.sh)";
  auto d = TextDataset::default_corpus(128);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_GT(d->size(Split::train), 1000000);
  EXPECT_GT(d->size(Split::val), 100000);
  const auto& b = d->bytes(Split::train);
  std::string head(b.begin(), b.begin() + 200000);
  EXPECT_EQ(head.find("\n%\n"), std::string::npos);
  EXPECT_NE(d->source().find("fortunes"), std::string::npos);
}

TEST(TextDataset, MissingCorpusDirectorySaysHowToFixIt) {
  auto d = TextDataset::default_corpus(16, "/nonexistent/fortunes");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("setup.sh"), std::string::npos);
  EXPECT_NE(d.status().message().find("--data"), std::string::npos);
}

TEST(BatchSampler, SeededTargetsAreTheNextBytes) {
  auto d = TextDataset::from_bytes(numbered_text(50000), 32, "t");
  ASSERT_TRUE(d.ok());
  BatchSampler a(&*d, Split::train, 4, 32, 7), b(&*d, Split::train, 4, 32, 7), c(&*d, Split::train, 4, 32, 8);
  std::vector<int32_t> ta, ya, tb, yb, tc, yc;
  for (int i = 0; i < 5; ++i) {
    a.next(&ta, &ya);
    b.next(&tb, &yb);
    c.next(&tc, &yc);
    EXPECT_EQ(ta, tb);
    EXPECT_EQ(ya, yb);
    EXPECT_NE(ta, tc);
    for (int row = 0; row < 4; ++row)
      for (int t = 0; t + 1 < 32; ++t) EXPECT_EQ(ya[row * 32 + t], ta[row * 32 + t + 1]);
    for (int32_t x : ta) EXPECT_TRUE(x >= 0 && x < 256);
  }
  // Train and validation samplers under one seed draw different windows from different bytes.
  BatchSampler v(&*d, Split::val, 4, 32, 7);
  std::vector<int32_t> tv, yv;
  v.next(&tv, &yv);
  EXPECT_NE(tv, ta);
}

TEST(BatchSampler, RestoreContinuesTheSameSequence) {
  auto d = TextDataset::from_bytes(numbered_text(50000), 16, "t");
  ASSERT_TRUE(d.ok());
  BatchSampler a(&*d, Split::train, 3, 16, 5);
  std::vector<int32_t> t, y, t2, y2;
  for (int i = 0; i < 7; ++i) a.next(&t, &y);
  Rng saved = a.rng();
  a.next(&t, &y);
  BatchSampler b(&*d, Split::train, 3, 16, 5);
  ASSERT_TRUE(b.restore(saved).ok());
  b.next(&t2, &y2);
  EXPECT_EQ(t, t2);
  EXPECT_EQ(y, y2);
  BatchSampler other(&*d, Split::train, 3, 16, 6);
  Status s = other.restore(saved);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("seed 5"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace lh
