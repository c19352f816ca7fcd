// RetuneWatch: notices that an autotune round's choice no longer fits the
// link it was made on (a link that slowed or sped up, a new neighbour on
// it), so that the coordinator tunes again with the same members.
//
// After a round, each bucket size the round timed runs the chosen algorithm
// (ChosenSeconds: the chosen trial's mean seconds for that size). The watch
// takes the all-reduce seconds of every report of such a size in batches of
// `steps` x members reports, and compares each batch's median with the
// chosen figure: outside [1 / factor, factor] of it, Add says why, once. A
// median, so that a few slow steps (an evaluation on one rank, a checkpoint)
// do not count; a batch, so that a report costs O(1) amortized. Sizes the
// round did not time are not watched.
//
// What it cannot see: a change that moves the chosen algorithm's time by less
// than the factor. A link that grows faster under SparDL, whose time is
// mostly its own compute there, may keep SparDL where the dense ring would
// now pay.
//
// Not thread-safe: the coordinator holds its mutex around every call.
#ifndef GRADMESH_SERVER_RETUNE_H_
#define GRADMESH_SERVER_RETUNE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "server/autotune.h"

namespace gradmesh::server {

// Per bucket size the round timed, the seconds of the trial `choice` runs it
// with: the dense trial's for Choice::dense_sizes (and every size when the
// choice is the dense ring), else the SparDL trial of Choice::teams.
std::map<uint64_t, double> ChosenSeconds(const std::vector<Trial>& trials,
                                         const Choice& choice);

class RetuneWatch {
 public:
  struct Options {
    double factor = 2.0;  // > 1
    int steps = 20;       // reports per batch = steps x members, >= 1
  };

  RetuneWatch(std::map<uint64_t, double> chosen, int members, Options options);

  // Feeds one report's all-reduce seconds for bucket size n. Returns why to
  // tune again the first time a batch's median leaves the range, e.g. "the
  // all-reduce of 824458 values took 2.31x its trial's 40.100 ms (median of
  // the last 80 reports)"; nullopt otherwise, and after that.
  std::optional<std::string> Add(uint64_t n, double seconds);

 private:
  const std::map<uint64_t, double> chosen_;
  const size_t batch_;
  const double factor_;
  std::map<uint64_t, std::vector<double>> batches_;
  bool fired_ = false;
};

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_RETUNE_H_
