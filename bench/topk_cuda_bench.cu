// CUDA top-k against a full CUB radix sort of the same keys and against the
// device's read bandwidth, measured in the same run:
//
//   build/bench/topk_cuda_bench [N ...]      (1M, 25M and 100M values)
//
// Prints one Markdown table (median of 20 runs, CUDA events). "top-k" is
// the selection left on the device (EnqueueTopKAbs: positions, values and
// count in device memory); "+ to host" adds the copy of the selection into
// host vectors (SegmentedTopKAbs), with the allocator set up as
// gradmesh-worker sets it (large blocks reused, not mapped afresh for every
// call).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/cli.h"
#include "worker/kernels/topk_cuda.h"

namespace {

#define CHECK_CUDA(call)                                              \
  do {                                                                \
    cudaError_t e = (call);                                           \
    if (e != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

__global__ void AbsKeys(const float* x, size_t n, unsigned* keys,
                        unsigned* positions) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    keys[i] = __float_as_uint(x[i]) & 0x7fffffffu;
    positions[i] = static_cast<unsigned>(i);
  }
}

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  std::exit(1);
}

// Events on the legacy default stream, which waits for CudaTopK's blocking
// stream: the figures cover its work.
template <typename F>
float MedianMs(F&& f) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  f();  // warm-up
  for (int r = 0; r < 20; ++r) {
    cudaEventRecord(start);
    f();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    size_t n = 0;
    if (!absl::SimpleAtoi(argv[i], &n) || n == 0) {
      std::fprintf(stderr,
                   "topk_cuda_bench: %s is not a positive number of values\n",
                   argv[i]);
      return 2;
    }
    sizes.push_back(n);
  }
  if (sizes.empty()) sizes = {1'000'000, 25'000'000, 100'000'000};
  gradmesh::KeepLargeBuffersWarm();  // as gradmesh-worker does
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n\n", prop.name);
  std::printf(
      "| n | density | top-k ms | + to host ms | CUB sort ms | read ms |"
      " sort / top-k | read / top-k |\n|---|---|---|---|---|---|---|---|\n");
  for (size_t n : sizes) {
    std::vector<float> host(n);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal;
    for (float& v : host) v = normal(rng);
    float* x;
    unsigned *keys, *keys_out, *pos, *pos_out;
    float* sum;
    CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&keys, n * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&keys_out, n * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&pos, n * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&pos_out, n * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&sum, sizeof(float)));
    CHECK_CUDA(
        cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    size_t sort_bytes = 0, reduce_bytes = 0;
    cub::DeviceRadixSort::SortPairsDescending(
        nullptr, sort_bytes, keys, keys_out, pos, pos_out, static_cast<int>(n));
    cub::DeviceReduce::Sum(nullptr, reduce_bytes, x, sum, static_cast<int>(n));
    void* temp;
    CHECK_CUDA(cudaMalloc(&temp, std::max(sort_bytes, reduce_bytes)));
    auto topk = gradmesh::kernels::CudaTopK::Create(n);
    if (!topk.ok()) {
      std::fprintf(stderr, "%s\n",
                   std::string(topk.status().message()).c_str());
      return 1;
    }
    const float read = MedianMs([&] {
      size_t bytes = reduce_bytes;
      cub::DeviceReduce::Sum(temp, bytes, x, sum, static_cast<int>(n));
    });
    const float sort = MedianMs([&] {
      AbsKeys<<<1024, 256>>>(x, n, keys, pos);
      size_t bytes = sort_bytes;
      cub::DeviceRadixSort::SortPairsDescending(
          temp, bytes, keys, keys_out, pos, pos_out, static_cast<int>(n));
    });
    for (double density : {0.001, 0.01}) {
      const gradmesh::kernels::TopKSegment segment{
          0, n, std::max<uint64_t>(1, static_cast<uint64_t>(density * n))};
      const float select = MedianMs([&] {
        const auto selection = (*topk)->EnqueueTopKAbs(x, n, segment.quota);
        if (!selection.ok()) Fail(selection.status());
      });
      const float to_host = MedianMs([&] {
        const auto result = (*topk)->SegmentedTopKAbs(x, n, {segment}, 0);
        if (!result.ok()) Fail(result.status());
      });
      std::printf(
          "| %zu | %.1f%% | %.3f | %.3f | %.3f | %.3f | %.1fx | %.0f%% |\n", n,
          density * 100, select, to_host, sort, read, sort / select,
          100 * read / select);
    }
    cudaFree(x);
    cudaFree(keys);
    cudaFree(keys_out);
    cudaFree(pos);
    cudaFree(pos_out);
    cudaFree(sum);
    cudaFree(temp);
  }
  return 0;
}
