#include <cuda_runtime.h>

#include <cstdio>

#include "worker/kernels/cuda_device.h"

namespace gradmesh::kernels {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::string CudaDeviceDescription() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(error);
  }
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    return "CUDA device 0 cannot be queried";
  }
  char text[256];
  std::snprintf(text, sizeof(text), "%s (sm_%d%d, %.0f GiB)", prop.name,
                prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
  return text;
}

}  // namespace gradmesh::kernels
