// Splitting heads across tensor-parallel shards: --tp-split parsing, the speed split, and each shard's range.
#include "grid/tp_split.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "grid/parse_number.h"

namespace lh {
namespace {

// The heads closest to `weights`' proportions (largest remainder, each shard at least one): the fix an error offers.
std::vector<int> nearest_split(const std::vector<double>& weights, int heads) {
  const int n = static_cast<int>(weights.size());
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int> out(n, 1);
  int left = heads - n;
  std::vector<double> want(n), frac(n);
  for (int t = 0; t < n; ++t) {
    want[t] = std::max(0.0, weights[t] / total * heads - 1.0);
    const int whole = std::min(left, static_cast<int>(std::floor(want[t])));
    out[t] += whole;
    left -= whole;
    frac[t] = want[t] - std::floor(want[t]);
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return frac[a] > frac[b]; });
  for (int i = 0; left > 0; i = (i + 1) % n, --left) ++out[order[i]];
  return out;
}

}  // namespace

std::string tp_split_string(const std::vector<int>& heads_per_shard) {
  std::string s;
  for (size_t t = 0; t < heads_per_shard.size(); ++t) s += (t ? ":" : "") + std::to_string(heads_per_shard[t]);
  return s;
}

Result<std::vector<int>> tp_heads(const std::string& text, int tp, int heads) {
  if (tp < 1) return invalid_argument("--tp must be at least 1, got " + std::to_string(tp));
  if (heads < tp)
    return invalid_argument("--tp " + std::to_string(tp) + " needs at least one head per shard, but the model has " +
                            std::to_string(heads) + " heads; use --tp " + std::to_string(heads) +
                            " or fewer, or a model with more --heads");
  if (text == "speed")
    return invalid_argument("--tp-split speed is settled by the coordinator from the workers' speeds");
  std::vector<double> weights;
  if (text.empty() || text == "even") {
    weights.assign(tp, 1.0);
    if (heads % tp == 0) return std::vector<int>(tp, heads / tp);
    return invalid_argument("--tp " + std::to_string(tp) + " does not divide the model's " + std::to_string(heads) +
                            " heads; give the shards whole heads with --tp-split " +
                            tp_split_string(nearest_split(weights, heads)) + ", or use a --tp that divides " +
                            std::to_string(heads));
  }
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (static_cast<int>(parts.size()) != tp)
    return invalid_argument("--tp-split " + text + " has " + std::to_string(parts.size()) + " parts but --tp is " +
                            std::to_string(tp) + "; give one weight per shard (e.g. " +
                            tp_split_string(std::vector<int>(tp, 1)) + "), 'speed', or leave it out for an even split");
  int64_t total = 0;
  std::vector<int64_t> w;
  for (const std::string& p : parts) {
    auto v = parse_int(p, "--tp-split weight");
    if (!v.ok() || *v < 1 || *v > 1000000)
      return invalid_argument("--tp-split " + text + ": '" + p +
                              "' is not a positive whole weight (W0:W1:…, e.g. 3:1)");
    w.push_back(*v);
    weights.push_back(double(*v));
    total += *v;
  }
  std::vector<int> out;
  for (int t = 0; t < tp; ++t) {
    if ((int64_t(heads) * w[t]) % total != 0) {
      char share[32];
      std::snprintf(share, sizeof share, "%.3g", double(heads) * w[t] / total);
      return invalid_argument("--tp-split " + text + " gives shard " + std::to_string(t) + " " + share +
                              " of the model's " + std::to_string(heads) +
                              " heads; heads must divide: use --tp-split " +
                              tp_split_string(nearest_split(weights, heads)));
    }
    out.push_back(static_cast<int>(int64_t(heads) * w[t] / total));
  }
  return out;
}

Result<std::vector<int>> tp_heads_by_speed(const std::vector<double>& speeds, int heads) {
  const int tp = static_cast<int>(speeds.size());
  if (tp < 1 || heads < tp)
    return invalid_argument("--tp-split speed: " + std::to_string(heads) + " heads cannot split over " +
                            std::to_string(tp) + " shards");
  bool known = true;
  for (double v : speeds) known &= v > 0 && std::isfinite(v);
  if (!known) return nearest_split(std::vector<double>(tp, 1.0), heads);
  return nearest_split(speeds, heads);
}

TpShard tp_shard(const std::vector<int>& heads_per_shard, int t) {
  TpShard s;
  s.index = t;
  s.size = static_cast<int>(heads_per_shard.size());
  s.head_begin = std::accumulate(heads_per_shard.begin(), heads_per_shard.begin() + t, 0);
  s.head_end = s.head_begin + heads_per_shard.at(size_t(t));
  return s;
}

}  // namespace lh
