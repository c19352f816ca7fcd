// WorkMeter: how many values the calling thread has passed through the kinds
// of work that dominate a sparse all-reduce's computation: selection (top-k
// and threshold scans over a span), merging two sparse blocks, and
// accumulating values into a dense span (the gradient into the residual,
// sparse blocks scatter-added, dense blocks summed). The kernels count on
// entry, one add per call, never per value.
//
// `gradmesh sim` reads the counts around each message of a simulated worker
// (every worker is one thread) and charges a calibrated cost per value, so
// that the simulated clock sees the real code's computation, not a formula
// of it. Work that no kernel counts (encoding, the algorithms' own small
// loops) costs nothing there.
//
//   const WorkCount before = ThreadWork();
//   ... kernels run on this thread ...
//   const uint64_t selected = ThreadWork().selected - before.selected;
//
// Thread-safety: each thread has its own counts; read them on that thread.
#ifndef GRADMESH_COMMON_WORK_METER_H_
#define GRADMESH_COMMON_WORK_METER_H_

#include <cstdint>

namespace gradmesh {

struct WorkCount {
  uint64_t selected = 0;     // values scanned by selections
  uint64_t merged = 0;       // entries of both operands of sparse merges
  uint64_t accumulated = 0;  // values added into dense spans
};

inline WorkCount& ThreadWork() {
  thread_local WorkCount count;
  return count;
}

inline void CountSelected(uint64_t values) { ThreadWork().selected += values; }
inline void CountMerged(uint64_t values) { ThreadWork().merged += values; }
inline void CountAccumulated(uint64_t values) {
  ThreadWork().accumulated += values;
}

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_WORK_METER_H_
