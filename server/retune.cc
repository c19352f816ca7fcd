#include "server/retune.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace gradmesh::server {

std::map<uint64_t, double> ChosenSeconds(const std::vector<Trial>& trials,
                                         const Choice& choice,
                                         std::map<uint64_t, double>* others) {
  const bool all_dense = choice.algorithm == kDense;
  std::map<uint64_t, double> chosen;
  for (const Trial& trial : trials) {
    if (trial.skipped) continue;
    const bool dense_trial = trial.algorithm == kDense;
    const bool chosen_trial =
        dense_trial || (!all_dense && trial.teams == choice.teams);
    for (const auto& [n, seconds] : trial.size_seconds) {
      const bool dense_size =
          all_dense || std::binary_search(choice.dense_sizes.begin(),
                                          choice.dense_sizes.end(), n);
      if (chosen_trial && dense_size == dense_trial) {
        chosen[n] = seconds;
      } else if (others != nullptr && dense_size != dense_trial) {
        auto [it, fresh] = others->try_emplace(n, seconds);
        if (!fresh) it->second = std::min(it->second, seconds);
      }
    }
  }
  return chosen;
}

RetuneWatch::RetuneWatch(std::map<uint64_t, double> chosen, int members,
                         Options options, std::map<uint64_t, double> others)
    : chosen_(std::move(chosen)),
      others_(std::move(others)),
      members_(std::max(members, 1)),
      steps_(static_cast<size_t>(options.steps)),
      factor_(options.factor) {
  GM_CHECK(options.factor > 1 && options.steps >= 1);
}

std::optional<std::string> RetuneWatch::Add(const std::string& node, uint64_t n,
                                            uint64_t step, double seconds) {
  const auto chosen = chosen_.find(n);
  if (fired_ || chosen == chosen_.end() || chosen->second <= 0) {
    return std::nullopt;
  }
  Size& size = sizes_[n];
  size.newest = std::max(size.newest, step);
  const uint64_t oldest = size.newest > kLag ? size.newest - kLag : 0;
  std::erase_if(size.pending, [&](const auto& p) { return p.first < oldest; });
  std::erase_if(size.done, [&](uint64_t s) { return s < oldest; });
  if (step < oldest || size.done.contains(step)) return std::nullopt;
  Operation& operation = size.pending[step];
  operation.nodes.insert(node);
  operation.slowest = std::max(operation.slowest, seconds);
  if (static_cast<int>(operation.nodes.size()) < members_) return std::nullopt;
  size.batch.push_back(operation.slowest);
  size.pending.erase(step);
  size.done.insert(step);
  if (size.batch.size() < steps_) return std::nullopt;
  auto middle = size.batch.begin() + size.batch.size() / 2;
  std::nth_element(size.batch.begin(), middle, size.batch.end());
  const double median = *middle;
  size.batch.clear();
  const double ratio = median / chosen->second;
  const auto other = others_.find(n);
  if (ratio <= factor_ || median - chosen->second < kMinChange ||
      (other != others_.end() && median <= other->second)) {
    return std::nullopt;
  }
  fired_ = true;
  return absl::StrFormat(
      "the all-reduce of %d values took %.2fx its trial's %.3f ms (median of "
      "the last %d steps)",
      n, ratio, chosen->second * 1e3, steps_);
}

}  // namespace gradmesh::server
