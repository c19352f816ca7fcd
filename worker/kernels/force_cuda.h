// Forces every top-k selection of this process onto the CUDA device, even
// for host data (which is copied over first): for checking and timing the
// device path through the engine. The engine's own choice is the CPU for
// host-resident data. Built only with GRADMESH_CUDA.
#ifndef GRADMESH_WORKER_KERNELS_FORCE_CUDA_H_
#define GRADMESH_WORKER_KERNELS_FORCE_CUDA_H_

#include "absl/status/status.h"

namespace gradmesh::kernels {

// Unavailable when there is no usable device. A CUDA failure during a later
// selection aborts the process with its message: selections have no error
// path, and a forced device that fails is not to be silently replaced.
absl::Status ForceCudaTopK();

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_FORCE_CUDA_H_
