#include "server/autotune.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

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

// The rest of a training step around size n's all-reduce (compute, other
// buckets), as both trials saw it: the least of their step minus all-reduce,
// 0 unless both know the step.
double RestOfStep(const Trial& dense, const Trial& sparse, uint64_t n) {
  const auto d = dense.size_step_seconds.find(n);
  const auto s = sparse.size_step_seconds.find(n);
  if (d == dense.size_step_seconds.end() ||
      s == sparse.size_step_seconds.end()) {
    return 0;
  }
  return std::max(0.0, std::min(d->second - SecondsOf(dense, n),
                                s->second - SecondsOf(sparse, n)));
}

// Whether size n goes to SparDL as `sparse` timed it: only where the dense
// ring was timed too and SparDL made the step (the all-reduce plus the rest
// of the step) `margin` times shorter (the dense ring is exact, so it is the
// default).
bool SparseFor(const Trial& dense, const Trial& sparse, uint64_t n,
               double margin) {
  if (!dense.size_seconds.contains(n)) return false;
  const double rest = RestOfStep(dense, sparse, n);
  return (SecondsOf(sparse, n) + rest) * margin < SecondsOf(dense, n) + rest;
}

// A step's all-reduce seconds with SparDL as `sparse` timed it and the dense
// ring where SparseFor says dense (sizes nobody timed cost nothing).
double StepSeconds(const Trial& dense, const Trial& sparse,
                   const std::set<uint64_t>& sizes, double margin) {
  double total = 0;
  for (uint64_t n : sizes) {
    if (SparseFor(dense, sparse, n, margin)) {
      total += SecondsOf(sparse, n);
    } else if (dense.size_seconds.contains(n)) {
      total += SecondsOf(dense, n);
    }
  }
  return total;
}

// "100000 values: dense 1.000 ms against d=1 0.900 ms" (the choice first),
// then ", in steps of 101.000 ms against 100.900 ms" where the rest of the
// step is known.
std::string SizeFigures(uint64_t n, bool sparse, const std::string& name,
                        const Trial& dense, const Trial* best) {
  const double dense_s = SecondsOf(dense, n);
  const double sparse_s = best != nullptr
                              ? SecondsOf(*best, n)
                              : std::numeric_limits<double>::infinity();
  const double rest = best != nullptr ? RestOfStep(dense, *best, n) : 0;
  const double chosen = sparse ? sparse_s : dense_s;
  const double other = sparse ? dense_s : sparse_s;
  std::string figures = absl::StrFormat(
      "%d values: %s %s against %s %s", n, sparse ? name : "dense",
      Milliseconds(chosen), sparse ? "dense" : name, Milliseconds(other));
  if (rest > 0) {
    absl::StrAppend(&figures, ", in steps of ", Milliseconds(chosen + rest),
                    " against ", Milliseconds(other + rest));
  }
  return figures;
}

// Of the SparDL trials not skipped that `keep` accepts, the one of the
// largest d whose `cost` is within `margin` x `fastest`'s: a larger d
// selects from larger blocks, closer to the global top-k (in the runs of
// docs/benchmarks.md, it ended an epoch higher).
template <typename Cost, typename Keep>
const Trial* LargestDWithin(const std::vector<Trial>& trials,
                            const Trial& fastest, double margin, Cost cost,
                            Keep keep) {
  const Trial* chosen = &fastest;
  if (margin <= 1) return chosen;  // time alone
  for (const Trial& trial : trials) {
    if (!trial.skipped && trial.algorithm == kSparDl &&
        trial.teams > chosen->teams && keep(trial) &&
        cost(trial) <= margin * cost(fastest)) {
      chosen = &trial;
    }
  }
  return chosen;
}

// "; the largest d within 1.2x of the fastest, d=1" where `chosen` is not
// `best`, else empty.
std::string WhyNotFastest(const Trial& chosen, const Trial& best,
                          double margin) {
  if (&chosen == &best) return "";
  return absl::StrFormat("; the largest d within %gx of the fastest, %s",
                         margin, best.Name());
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
                        double seconds, double period_seconds) {
  while (current_ < trials_.size() && trials_[current_].skipped) ++current_;
  if (current_ == trials_.size()) return false;
  if (!sizes_.contains(n) && sizes_.size() >= kMaxSizes) return false;
  sizes_.insert(n);
  const Operation operation{step, n};
  if (completed_.contains(operation)) return false;
  Reports& reports = pending_[operation];
  double& slowest = reports.seconds[std::string(node)];
  slowest = std::max(slowest, seconds);
  reports.period_seconds = std::max(reports.period_seconds, period_seconds);
  uint64_t& latest = latest_[{std::string(node), n}];
  latest = std::max(latest, step);
  uint64_t& newest = newest_[n];
  newest = std::max(newest, step);
  return ResolveOperations();
}

bool AutotuneRound::ResolveOperations() {
  Trial& trial = trials_[current_];
  // In step order, so that each size's warm-up is its earliest operation.
  for (auto it = pending_.begin(); it != pending_.end();) {
    const auto& [operation, reports] = *it;
    const auto& seconds = reports.seconds;
    const auto [step, n] = operation;
    auto reported = [&](const std::string& node) {
      const auto later = latest_.find({node, n});
      return seconds.contains(node) ||
             (later != latest_.end() && later->second > step);
    };
    const bool complete =
        std::all_of(members_.begin(), members_.end(), reported);
    const uint64_t newest = newest_[n];
    const bool lost = newest >= kStepsBeforeReportsAreLost &&
                      step <= newest - kStepsBeforeReportsAreLost;
    if (!complete && !lost) {
      ++it;
      continue;
    }
    double max_seconds = 0;
    for (const auto& [node, s] : seconds) {
      max_seconds = std::max(max_seconds, s);
    }
    const double period = reports.period_seconds;
    completed_.insert(operation);
    it = pending_.erase(it);
    // The first operation of a size warms up (connections, allocations).
    if (!warmed_up_.insert(n).second) {
      auto& [sum, count] = sums_[n];
      // The first counted operation's period holds the warm-up's sum.
      if (period > 0 && count > 0) periods_[n].push_back(period);
      sum += max_seconds;
      trial.iterations = std::max(trial.iterations, ++count);
      if (TrialDone()) {
        EndTrial();
        return true;
      }
    }
  }
  return false;
}

bool AutotuneRound::TrialDone() const {
  bool every_size = true;
  for (uint64_t n : warmed_up_) {
    const auto it = sums_.find(n);
    const int count = it == sums_.end() ? 0 : it->second.second;
    if (count >= kRareSizeWindows * options_.window) return true;
    every_size = every_size && count >= options_.window;
  }
  return every_size;
}

void AutotuneRound::EndTrial() {
  Trial& trial = trials_[current_];
  trial.mean_seconds = 0;
  for (const auto& [n, sum_count] : sums_) {
    const double mean = sum_count.first / sum_count.second;
    trial.size_seconds[n] = mean;
    trial.mean_seconds += mean;
  }
  for (auto& [n, periods] : periods_) {
    // The lower median: of two, the shorter (the other may hold a pause).
    const auto middle = periods.begin() + (periods.size() - 1) / 2;
    std::nth_element(periods.begin(), middle, periods.end());
    trial.size_step_seconds[n] = *middle;
  }
  pending_.clear();
  completed_.clear();
  latest_.clear();
  newest_.clear();
  warmed_up_.clear();
  sums_.clear();
  periods_.clear();
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

std::set<uint64_t> AutotuneRound::CommonSizes() const {
  std::set<uint64_t> common;
  bool first = true;
  for (const Trial& trial : trials_) {
    if (trial.skipped) continue;
    std::set<uint64_t> sizes;
    for (const auto& [n, seconds] : trial.size_seconds) {
      if (first || common.contains(n)) sizes.insert(n);
    }
    common = std::move(sizes);
    first = false;
  }
  return common;
}

Choice AutotuneRound::SparseOnlyResult() const {
  // Trials are compared over the sizes every one of them timed (all of them,
  // unless a size came too rarely), the fastest winning, ties to the
  // earlier trial; then the largest d within the teams margin of it.
  const std::set<uint64_t> common = CommonSizes();
  auto total = [&](const Trial& trial) {
    if (common.empty()) return trial.mean_seconds;
    double sum = 0;
    for (uint64_t n : common) sum += SecondsOf(trial, n);
    return sum;
  };
  const Trial* fastest = nullptr;
  for (const Trial& trial : trials_) {
    if (!trial.skipped &&
        (fastest == nullptr || total(trial) < total(*fastest))) {
      fastest = &trial;
    }
  }
  GM_CHECK(fastest != nullptr) << "no trial ran";
  const Trial* best = LargestDWithin(trials_, *fastest, options_.teams_margin,
                                     total, [](const Trial&) { return true; });
  std::vector<std::string> others, skipped;
  for (const Trial& trial : trials_) {
    if (trial.skipped) {
      skipped.push_back(trial.Name());
    } else if (&trial != best) {
      others.push_back(
          absl::StrFormat("%s (%s)", trial.Name(), Milliseconds(total(trial))));
    }
  }
  Choice choice{.algorithm = std::string(kSparDl), .teams = best->teams};
  choice.note = absl::StrFormat(
      "autotune chose %s (%s%s)", best->Name(), Milliseconds(total(*best)),
      WhyNotFastest(*best, *fastest, options_.teams_margin));
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
  std::set<uint64_t> sizes;  // timed by any trial
  for (const Trial& trial : trials_) {
    if (trial.algorithm == kDense) dense = &trial;
    for (const auto& [n, seconds] : trial.size_seconds) sizes.insert(n);
  }
  const double margin = options_.sparse_margin;
  auto step = [&](const Trial& t) {
    return StepSeconds(*dense, t, sizes, margin);
  };
  const Trial* fastest = nullptr;
  for (const Trial& trial : trials_) {
    if (trial.algorithm == kDense || trial.skipped) continue;
    // Ties (every size dense either way) go to SparDL's own fastest d.
    auto key = [&](const Trial& t) {
      return std::pair(step(t), t.mean_seconds);
    };
    if (fastest == nullptr || key(trial) < key(*fastest)) fastest = &trial;
  }
  // A larger d only where it keeps every size the fastest sums sparsely
  // sparse: the margin picks a d, it does not turn SparDL off.
  auto keeps_sparse = [&](const Trial& t) {
    return std::all_of(sizes.begin(), sizes.end(), [&](uint64_t n) {
      return !SparseFor(*dense, *fastest, n, margin) ||
             SparseFor(*dense, t, n, margin);
    });
  };
  const Trial* best = fastest == nullptr ? nullptr
                                         : LargestDWithin(trials_, *fastest,
                                                          options_.teams_margin,
                                                          step, keeps_sparse);
  Choice choice{.algorithm = std::string(kSparDl),
                .teams = best != nullptr ? best->teams : 1};
  const std::string sparse_name = best != nullptr ? best->Name() : "spardl";
  std::vector<std::string> figures;
  bool any_sparse = false;
  for (uint64_t n : sizes) {
    const bool sparse = best != nullptr && SparseFor(*dense, *best, n, margin);
    any_sparse = any_sparse || sparse;
    // n = 0: reports that did not say their size (no bucket has 0 values).
    if (!sparse && n > 0) choice.dense_sizes.push_back(n);
    figures.push_back(SizeFigures(n, sparse, sparse_name, *dense, best));
  }
  if (!any_sparse) {
    choice.algorithm = std::string(kDense);
    choice.teams = 1;
    choice.dense_sizes.clear();
  }
  choice.note = absl::StrFormat(
      "auto chose %s (%s; SparDL's step must be %gx shorter than dense's%s)",
      !any_sparse ? "dense for every bucket"
      : choice.dense_sizes.empty()
          ? absl::StrCat("spardl ", sparse_name)
          : absl::StrCat("spardl ", sparse_name,
                         ", dense for some bucket sizes"),
      absl::StrJoin(figures, "; "), margin,
      any_sparse ? WhyNotFastest(*best, *fastest, options_.teams_margin) : "");
  return choice;
}

}  // namespace gradmesh::server
