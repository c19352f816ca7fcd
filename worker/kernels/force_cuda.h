// The CUDA device as the top-k selector of host data, even for host data
// (copied over first): for checking and timing the device path through the
// engine (--topk=cuda). The engine's own choice is the CPU for host-resident
// data. Built only with GRADMESH_CUDA.
#ifndef GRADMESH_WORKER_KERNELS_FORCE_CUDA_H_
#define GRADMESH_WORKER_KERNELS_FORCE_CUDA_H_

#include "absl/status/statusor.h"
#include "worker/kernels/topk.h"

namespace gradmesh::kernels {

// One instance for the process; Unavailable when there is no usable device.
// A CUDA failure during a later selection aborts the process with its
// message: selections have no error path, and a device that fails is not to
// be silently replaced.
absl::StatusOr<const TopKSelector*> CudaTopKForHostData();

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_FORCE_CUDA_H_
