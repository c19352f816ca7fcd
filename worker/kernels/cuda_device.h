// Whether a CUDA device can run the project's kernels here.
//
// Built into gradmesh::kernels_cuda only when GRADMESH_CUDA is on; callers
// that may run without it check GRADMESH_HAS_CUDA first.
#ifndef GRADMESH_WORKER_KERNELS_CUDA_DEVICE_H_
#define GRADMESH_WORKER_KERNELS_CUDA_DEVICE_H_

#include <string>

namespace gradmesh::kernels {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int CudaDeviceCount();

// "name (sm_XY, N GiB)" of device 0, or why there is none.
std::string CudaDeviceDescription();

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_CUDA_DEVICE_H_
