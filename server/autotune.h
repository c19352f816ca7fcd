// AutotuneRound: one round of the coordinator's autotune (coordinator.h says
// when rounds start and what the coordinator publishes for them). It tries
// candidate plans one after another on the same members, each for a window
// of complete operations, and then picks for each bucket size (the choice,
// below: the fastest, or a larger d close to it).
//
// Candidates. SparDL at each team count d it is given, ranked by the
// alpha-beta model (Rank) and skipped where the model finds them hopeless;
// with the coordinator's `auto` algorithm also the dense ring, tried last
// (when connections and buffers are warm for every candidate) and never
// skipped (the model leaves out the selection's compute, which is all the
// dense ring saves).
//
// Operations. A report names its member, its step, its bucket's size n, the
// all-reduce's seconds and the step's period (the time since the bucket's
// step before began there: the training step, its compute included; 0 when
// not known, as when steps skip numbers). Reports of new sizes past
// kMaxSizes are ignored. An
// operation is one (step, n): complete when every member has reported it or
// a later step of that size (a bucket's reports come in order, so one
// missing below a later step was lost), or, with a member that reports
// nothing, once a step of that size kStepsBeforeReportsAreLost later has
// been reported; it counts with the slowest member's seconds among the
// reports it has. Buckets of one size share their operations: the first
// report of a step from each member completes it, and one of the buckets is
// timed. The first complete operation of each size warms up and does not
// count. A trial ends when every size it warmed up has
// `window` counted operations (or one has kRareSizeWindows x that many: a
// rare size is then timed with what it has); its time for each size is the
// mean of that size's counted operations, and its total the sum over sizes;
// its step for each size the lower median of the known periods (the slowest
// member's; the first counted operation's is left out, as it holds the
// warm-up's sum), so that a pause (an evaluation, a checkpoint) does not
// count.
//
// The choice (Result):
//   - SparDL alone: the largest d whose total over the sizes every trial
//     timed is within `teams_margin` x the least (a larger d selects from
//     larger blocks, closer to the global top-k: fewer steps to the same
//     accuracy, docs/benchmarks.md); with a margin of 1, the least, ties to
//     the earlier trial; "autotune chose d=2 (12.300 ms) over d=1
//     (20.100 ms), d=4 (15.000 ms)";
//   - with the dense ring: a bucket size goes to SparDL only where both
//     were timed and SparDL made the training step `sparse_margin` times
//     shorter (the dense ring is exact: top-k needs more steps to the same
//     accuracy, docs/benchmarks.md); every other size timed is summed
//     densely. The step is the size's all-reduce plus the rest of the step
//     (compute, other buckets): the least of the two trials' step minus
//     all-reduce, 0 where a trial knows no period. So where compute
//     dominates the step, a faster sum does not pay for the extra steps. A size
//     no trial timed (one registered later, or past kMaxSizes) runs the
//     plan's algorithm. SparDL's d is the one whose steps, so divided, cost
//     least (ties to the d of the least total of its own), or the largest
//     d within `teams_margin` of that. Every size dense:
//     the plan is the dense ring; otherwise SparDL with the dense sizes in
//     Plan::dense_sizes.
//
// Not thread-safe: the coordinator holds its mutex around every call.
#ifndef GRADMESH_SERVER_AUTOTUNE_H_
#define GRADMESH_SERVER_AUTOTUNE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "server/cost_model.h"

namespace gradmesh::server {

// Trial::algorithm's values.
inline constexpr absl::string_view kSparDl = "spardl";
inline constexpr absl::string_view kDense = "dense";

// One candidate of an autotune round.
struct Trial {
  std::string algorithm = std::string(kSparDl);  // kSparDl or kDense
  int teams = 1;                                 // SparDL's d (dense: 1)
  double modeled_seconds = 0;
  bool skipped = false;
  int iterations = 0;  // counted operations of its most counted size so far
  // Set when the trial ends: the mean slowest-member seconds of each bucket
  // size it counted, and their sum.
  std::map<uint64_t, double> size_seconds;
  double mean_seconds = 0;
  // The lower median period of each size's counted operations that knew
  // one, the first counted operation's left out (none with a window of 1).
  std::map<uint64_t, double> size_step_seconds;

  // "d=2" or "dense".
  std::string Name() const;
};

// A round's result: the plan's algorithm and d, and the sizes summed densely.
struct Choice {
  std::string algorithm;
  int teams = 1;
  std::vector<uint64_t> dense_sizes;  // ascending
  std::string note;                   // why
};

class AutotuneRound {
 public:
  struct Options {
    int window = 5;              // counted operations per trial, >= 1
    double skip_factor = 3.0;    // skip d modeled over this x the best, >= 1
    double sparse_margin = 1.5;  // see the choice above, >= 1
    double teams_margin = 1.0;   // see the choice above, >= 1
    double density = 0.01;
  };

  // A round over `members` (node ids) trying SparDL at each of `teams`
  // (ascending), then the dense ring when `with_dense`.
  AutotuneRound(std::vector<std::string> members, std::vector<int> teams,
                bool with_dense, Options options);

  // Models every trial with n values and `link`, then sorts the SparDL trials
  // from index `from` on by modeled time (ties to the smaller d) and marks the
  // hopeless ones among them. With n = 0 the rounds alone rank and nothing is
  // skipped. The dense trial stays last.
  void Rank(uint64_t n, const LinkModel& link, size_t from);
  bool ranked_by_model() const { return ranked_by_model_; }

  // The trial in progress (skipping skipped ones); null once all are done.
  const Trial* current() const;
  size_t current_index() const { return current_; }

  // Feeds one report of the current trial. True when it ended that trial.
  bool Add(absl::string_view node, uint64_t step, uint64_t n, double seconds,
           double period_seconds = 0);

  // The choice, once current() is null.
  Choice Result() const;

  const std::vector<Trial>& trials() const { return trials_; }

 private:
  using Operation = std::pair<uint64_t, uint64_t>;  // (step, n)
  // One operation's reports so far.
  struct Reports {
    absl::flat_hash_map<std::string, double> seconds;  // by member
    double period_seconds = 0;                         // the longest known
  };

  // Counts the operations every member has reported, or whose missing
  // reports are lost; true when the trial ended.
  bool ResolveOperations();
  // Every size warmed up in this trial has `window` counted operations, or
  // one has kRareSizeWindows x that many.
  bool TrialDone() const;
  // The sizes every trial that ran timed.
  std::set<uint64_t> CommonSizes() const;
  // Ends the current trial and moves to the next one not skipped.
  void EndTrial();
  Choice SparseOnlyResult() const;
  Choice WithDenseResult() const;

  const std::vector<std::string> members_;
  const Options options_;
  std::vector<Trial> trials_;
  size_t current_ = 0;
  bool ranked_by_model_ = false;
  int world_size() const { return static_cast<int>(members_.size()); }

  // The current trial's state.
  std::map<Operation, Reports> pending_;
  absl::flat_hash_set<Operation> completed_;
  // The highest step each (member, size) has reported: a bucket's steps
  // come in order, so one missing below it was lost.
  absl::flat_hash_map<std::pair<std::string, uint64_t>, uint64_t> latest_;
  absl::flat_hash_map<uint64_t, uint64_t> newest_;   // n -> highest step
  absl::flat_hash_set<uint64_t> warmed_up_;          // sizes
  std::map<uint64_t, std::pair<double, int>> sums_;  // n -> (sum, count)
  std::map<uint64_t, std::vector<double>> periods_;  // n -> known periods
  // The sizes reported in this round (at most kMaxSizes, so that the plan's
  // dense_sizes stay small whatever members report).
  absl::flat_hash_set<uint64_t> sizes_;
};

// A round times at most this many bucket sizes; reports of more are ignored.
inline constexpr size_t kMaxSizes = 64;

// A size seen in a trial but too rare to count `window` operations stops
// delaying its end once another has counted this many windows.
inline constexpr int kRareSizeWindows = 4;

// An operation still missing reports from a member that never reported a
// later one, when a step this many later is reported, has lost them anyway
// (that member's reports do not arrive): it counts with the reports it has.
inline constexpr uint64_t kStepsBeforeReportsAreLost = 8;

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_AUTOTUNE_H_
