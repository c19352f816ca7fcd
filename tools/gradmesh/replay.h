// `gradmesh replay`: runs an all-reduce algorithm on P in-process workers
// (one thread each, loopback transport) over gradients from .npy files or
// generated ones, and writes what every rank ended with.
//
// Inputs: <input_dir>/rank{r}.npy for r = 0..P-1, float32 [n] (one
// iteration) or [T, n] (T iterations, residuals carried between them).
// Outputs, in <output_dir>:
//   rank{r}.result.npy    float32 [T, n]  dense form of each iteration's sum
//   rank{r}.residual.npy  float32 [n]     residual after the last iteration
//   stats.json            per rank and iteration: seconds (the all-reduce,
//                         started on all ranks at once), wait_seconds,
//                         rounds, bytes, nonzeros, h
// Outputs are written into a staging directory that is renamed into place
// only when everything succeeded: a failed run leaves no partial output.
#ifndef GRADMESH_TOOLS_GRADMESH_REPLAY_H_
#define GRADMESH_TOOLS_GRADMESH_REPLAY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/collectives/registry.h"

namespace gradmesh::tools {

struct ReplayOptions {
  collectives::AlgorithmOptions algorithm;
  int workers = 4;
  std::string input_dir;  // empty: generate gradients
  std::string output_dir;
  bool overwrite = false;  // replace a non-empty output_dir
  // Generated gradients (no input_dir).
  uint64_t n = 1 << 20;
  uint64_t iterations = 5;
  uint64_t seed = 1;
  absl::Duration timeout = absl::Minutes(10);  // per operation
  bool progress = true;  // one line per iteration on stdout
};

// Runs the replay. InvalidArgument for bad options or input (a message that
// names the culprit); other codes for I/O or engine failures.
absl::Status RunReplay(const ReplayOptions& options);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_REPLAY_H_
