// The binaries' --topk flag: which implementation makes the top-k
// selections of the algorithms a process creates (AlgorithmOptions::topk).
//   auto, cpu: the CPU (topk.h), the engine's choice for host data;
//   cuda: the CUDA kernels (force_cuda.h), each span copied to the device
//         first; FailedPrecondition in a build without CUDA, Unavailable
//         without a usable device.
// InvalidArgument for any other name.
#ifndef GRADMESH_WORKER_KERNELS_TOPK_CHOICE_H_
#define GRADMESH_WORKER_KERNELS_TOPK_CHOICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/kernels/topk.h"

namespace gradmesh::kernels {

inline constexpr char kTopKFlagHelp[] =
    "top-k implementation: auto (the CPU for host data), cpu, or cuda "
    "(copies each span to the device; needs a CUDA build and device)";

absl::StatusOr<const TopKSelector*> TopKNamed(absl::string_view name);

// InvalidArgument unless `name` is one TopKNamed knows; changes nothing (for a
// process that hands the flag on to others).
absl::Status CheckTopKName(absl::string_view name);

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_TOPK_CHOICE_H_
