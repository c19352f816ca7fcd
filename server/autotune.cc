#include "server/autotune.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace gradmesh::server {
namespace {

std::string Milliseconds(double seconds) {
  return absl::StrFormat("%.3f ms", seconds * 1e3);
}

// `trial`'s seconds for bucket size n; infinite if it did not count any.
double SecondsOf(const Trial& trial, uint64_t n) {
  const auto it = trial.size_seconds.find(n);
  return it == trial.size_seconds.end()
             ? std::numeric_limits<double>::infinity()
             : it->second;
}

}  // namespace

std::string Trial::Name() const {
  return algorithm == kDense ? std::string(kDense) : absl::StrCat("d=", teams);
}

AutotuneRound::AutotuneRound(std::vector<std::string> members,
                             std::vector<int> teams, bool with_dense,
                             Options options)
    : members_(std::move(members)), options_(options) {
  for (int d : teams) trials_.push_back({.teams = d});
  if (with_dense) trials_.push_back({.algorithm = std::string(kDense)});
}

void AutotuneRound::Rank(uint64_t n, const LinkModel& link, size_t from) {
  const std::vector<TeamCountModel> ranked = RankTeamCounts(
      world_size(), n, options_.density, link, options_.skip_factor);
  ranked_by_model_ = n > 0;
  absl::flat_hash_map<int, size_t> positions;  // in `ranked`, by d
  for (size_t i = 0; i < ranked.size(); ++i) positions[ranked[i].teams] = i;
  auto position = [&](const Trial& trial) {
    const auto it = positions.find(trial.teams);
    GM_CHECK(it != positions.end()) << "d=" << trial.teams;
    return it->second;
  };
  double best = std::numeric_limits<double>::infinity();
  for (Trial& trial : trials_) {
    if (trial.algorithm == kDense) {
      const CommCost cost = DenseRingCost(world_size(), n);
      trial.modeled_seconds = ModelSeconds(cost, link);
      continue;
    }
    trial.modeled_seconds = ranked[position(trial)].seconds;
    best = std::min(best, trial.modeled_seconds);
  }
  // The untried SparDL trials are reordered; the dense one stays last.
  const auto first = trials_.begin() + static_cast<std::ptrdiff_t>(from);
  const auto dense = std::find_if(first, trials_.end(), [](const Trial& t) {
    return t.algorithm == kDense;
  });
  std::sort(first, dense, [&](const Trial& a, const Trial& b) {
    return position(a) < position(b);
  });
  for (auto it = first; it != dense; ++it) {
    it->skipped = n > 0 && it->modeled_seconds > options_.skip_factor * best;
  }
}

const Trial* AutotuneRound::current() const {
  size_t i = current_;
  while (i < trials_.size() && trials_[i].skipped) ++i;
  return i < trials_.size() ? &trials_[i] : nullptr;
}

bool AutotuneRound::Add(absl::string_view node, uint64_t step, uint64_t n,
                        double seconds) {
  while (current_ < trials_.size() && trials_[current_].skipped) ++current_;
  if (current_ == trials_.size()) return false;
  const Operation operation{step, n};
  if (completed_.contains(operation)) return false;
  double& slowest = pending_[operation][std::string(node)];
  slowest = std::max(slowest, seconds);
  uint64_t& latest = latest_[std::string(node)];
  latest = std::max(latest, step);
  return ResolveOperations(step);
}

bool AutotuneRound::ResolveOperations(uint64_t latest) {
  Trial& trial = trials_[current_];
  // In step order, so that each size's warm-up is its earliest operation.
  for (auto it = pending_.begin(); it != pending_.end();) {
    const auto& [operation, seconds] = *it;
    const uint64_t step = operation.first;
    auto reported = [&](const std::string& node) {
      const auto later = latest_.find(node);
      return seconds.contains(node) ||
             (later != latest_.end() && later->second > step);
    };
    const bool complete =
        std::all_of(members_.begin(), members_.end(), reported);
    const bool lost = step + kStepsBeforeReportsAreLost <= latest;
    if (!complete && !lost) {
      ++it;
      continue;
    }
    double max_seconds = 0;
    for (const auto& [node, s] : seconds)
      max_seconds = std::max(max_seconds, s);
    const uint64_t n = operation.second;
    completed_.insert(operation);
    it = pending_.erase(it);
    // The first operation of a size warms up (connections, allocations).
    if (!warmed_up_.insert(n).second) {
      auto& [sum, count] = sums_[n];
      sum += max_seconds;
      trial.iterations = std::max(trial.iterations, ++count);
      if (count >= options_.window) {
        EndTrial();
        return true;
      }
    }
  }
  return false;
}

void AutotuneRound::EndTrial() {
  Trial& trial = trials_[current_];
  trial.mean_seconds = 0;
  for (const auto& [n, sum_count] : sums_) {
    const double mean = sum_count.first / sum_count.second;
    trial.size_seconds[n] = mean;
    trial.mean_seconds += mean;
  }
  pending_.clear();
  completed_.clear();
  latest_.clear();
  warmed_up_.clear();
  sums_.clear();
  ++current_;
  while (current_ < trials_.size() && trials_[current_].skipped) ++current_;
}

Choice AutotuneRound::Result() const {
  GM_CHECK(current() == nullptr) << "the round is still in progress";
  const bool with_dense =
      std::any_of(trials_.begin(), trials_.end(),
                  [](const Trial& t) { return t.algorithm == kDense; });
  return with_dense ? WithDenseResult() : SparseOnlyResult();
}

Choice AutotuneRound::SparseOnlyResult() const {
  // The fastest wins, ties to the earlier trial.
  const Trial* best = nullptr;
  for (const Trial& trial : trials_) {
    if (!trial.skipped &&
        (best == nullptr || trial.mean_seconds < best->mean_seconds)) {
      best = &trial;
    }
  }
  GM_CHECK(best != nullptr) << "no trial ran";
  std::vector<std::string> others, skipped;
  for (const Trial& trial : trials_) {
    if (trial.skipped) {
      skipped.push_back(trial.Name());
    } else if (&trial != best) {
      others.push_back(absl::StrFormat("%s (%s)", trial.Name(),
                                       Milliseconds(trial.mean_seconds)));
    }
  }
  Choice choice{.algorithm = std::string(kSparDl), .teams = best->teams};
  choice.note = absl::StrFormat("autotune chose %s (%s)", best->Name(),
                                Milliseconds(best->mean_seconds));
  if (!others.empty()) {
    absl::StrAppend(&choice.note, " over ", absl::StrJoin(others, ", "));
  }
  if (!skipped.empty()) {
    absl::StrAppend(
        &choice.note, "; skipped ", absl::StrJoin(skipped, ", "),
        absl::StrFormat(" (modeled over %gx the best)", options_.skip_factor));
  }
  return choice;
}

Choice AutotuneRound::WithDenseResult() const {
  const Trial* dense = nullptr;
  for (const Trial& trial : trials_) {
    if (trial.algorithm == kDense) dense = &trial;
  }
  const double margin = options_.sparse_margin;
  // A size is dense unless SparDL at d is `margin` times faster for it.
  auto dense_for = [&](const Trial& sparse, uint64_t n) {
    return SecondsOf(sparse, n) * margin >= SecondsOf(*dense, n);
  };
  auto step_seconds = [&](const Trial& sparse) {
    double total = 0;
    for (const auto& [n, seconds] : dense->size_seconds) {
      total += dense_for(sparse, n) ? seconds : SecondsOf(sparse, n);
    }
    for (const auto& [n, seconds] : sparse.size_seconds) {
      if (!dense->size_seconds.contains(n)) total += seconds;
    }
    return total;
  };
  const Trial* best = nullptr;
  for (const Trial& trial : trials_) {
    if (trial.algorithm == kDense || trial.skipped) continue;
    if (best == nullptr || step_seconds(trial) < step_seconds(*best)) {
      best = &trial;
    }
  }
  Choice choice{.algorithm = std::string(kSparDl),
                .teams = best != nullptr ? best->teams : 1};
  std::vector<std::string> sizes;
  bool any_sparse =
      best != nullptr && best->size_seconds.size() > dense->size_seconds.size();
  for (const auto& [n, seconds] : dense->size_seconds) {
    const bool is_dense = best == nullptr || dense_for(*best, n);
    if (is_dense) {
      choice.dense_sizes.push_back(n);
    } else {
      any_sparse = true;
    }
    sizes.push_back(absl::StrFormat(
        "%d values: %s %s against %s %s", n, is_dense ? "dense" : best->Name(),
        Milliseconds(is_dense ? seconds : SecondsOf(*best, n)),
        is_dense ? (best != nullptr ? best->Name() : "nothing") : "dense",
        Milliseconds(is_dense ? SecondsOf(*best, n) : seconds)));
  }
  if (!any_sparse) {
    choice.algorithm = std::string(kDense);
    choice.teams = 1;
    choice.dense_sizes.clear();
  }
  choice.note = absl::StrFormat(
      "auto chose %s (%s; SparDL must be %gx faster than dense)",
      any_sparse ? absl::StrCat("spardl ", best->Name(),
                                choice.dense_sizes.empty()
                                    ? ""
                                    : ", dense for some bucket sizes")
                 : "dense for every bucket",
      absl::StrJoin(sizes, "; "), margin);
  return choice;
}

}  // namespace gradmesh::server
