// RetuneWatch: notices that an autotune round's choice no longer fits the
// link it was made on (a link that slowed, a new neighbour on it), so that
// the coordinator tunes again with the same members.
//
// After a round, each bucket size the round timed runs the chosen algorithm
// (ChosenSeconds: the chosen trial's mean seconds for that size, each
// operation counted at its slowest member's). The watch takes each complete
// operation of such a size (every member reported it) at its slowest
// member's seconds too, in batches of `steps` operations, and compares each
// batch's median with the chosen figure: over factor x it, at least
// kMinChange more, and over the other algorithm's fastest trial for the size (a
// SparDL choice that slowed 3x from 3 ms, with the dense trial at 480 ms,
// has no better choice to find), Add says why, once. A median, so that a few
// slow steps (an evaluation on one rank, a checkpoint) do not count; a batch,
// so that a report costs O(log steps) amortized. Sizes the round did not time
// are not watched; an operation with a lost report is left out.
//
// Slow-downs only. A faster link makes the dense ring gain more than SparDL:
// where the dense ring was chosen it stays the better choice. Where SparDL
// was, its time is mostly its own compute, so it shows a faster link too
// little to tell (a trial's warm-up shows more: in one run SparDL's steps
// took 0.42x its trial's time on an unchanged link). So a job that chose
// SparDL on a slow link keeps it on a link that became fast.
//
// Not thread-safe: the coordinator holds its mutex around every call.
#ifndef GRADMESH_SERVER_RETUNE_H_
#define GRADMESH_SERVER_RETUNE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/autotune.h"

namespace gradmesh::server {

// Per bucket size the round timed, the seconds of the trial `choice` runs it
// with: the dense trial's for Choice::dense_sizes (and every size when the
// choice is the dense ring), else the SparDL trial of Choice::teams. With
// `others`, also the least seconds of the other algorithm's trials for each
// size (SparDL's for a dense size, the dense ring's for a sparse one: a
// SparDL d's trials differ by their noise more than a link moves them).
std::map<uint64_t, double> ChosenSeconds(
    const std::vector<Trial>& trials, const Choice& choice,
    std::map<uint64_t, double>* others = nullptr);

class RetuneWatch {
 public:
  struct Options {
    double factor = 2.0;  // > 1
    int steps = 20;       // operations per batch, >= 1
  };

  // `others`: per size, the other algorithm's fastest trial (ChosenSeconds);
  // a size slower than its trial by the factor but not slower than that
  // does not count: no other choice would be faster.
  RetuneWatch(std::map<uint64_t, double> chosen, int members, Options options,
              std::map<uint64_t, double> others = {});

  // Feeds `node`'s report of `step` for bucket size n (several buckets of
  // one size: the operation is the step, at its slowest report). Returns
  // why to tune again the first time a batch's median leaves the range by
  // at least kMinChange, e.g. "the all-reduce of 824458 values took 2.31x
  // its trial's 40.100 ms (median of the last 20 steps)"; nullopt
  // otherwise, and after that.
  std::optional<std::string> Add(const std::string& node, uint64_t n,
                                 uint64_t step, double seconds);

  // Smaller changes do not count, whatever the ratio: a sum of a
  // millisecond moves by more than 2x with the load alone.
  static constexpr double kMinChange = 1e-3;  // seconds
  // Operations this many steps behind a size's newest are closed: one with
  // a lost report is left out, a late report of a complete one ignored.
  static constexpr uint64_t kLag = 8;

 private:
  struct Operation {
    std::set<std::string> nodes;
    double slowest = 0;
  };
  struct Size {
    std::map<uint64_t, Operation> pending;  // by step
    std::set<uint64_t> done;                // steps counted, within kLag
    uint64_t newest = 0;
    std::vector<double> batch;  // complete operations' slowest seconds
  };

  const std::map<uint64_t, double> chosen_;
  const std::map<uint64_t, double> others_;
  const int members_;
  const size_t steps_;
  const double factor_;
  std::map<uint64_t, Size> sizes_;
  bool fired_ = false;
};

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_RETUNE_H_
