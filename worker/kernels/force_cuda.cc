#include "worker/kernels/force_cuda.h"

#include <memory>
#include <vector>

#include "common/status_macros.h"
#include "worker/kernels/cuda_device.h"
#include "worker/kernels/topk.h"
#include "worker/kernels/topk_cuda.h"

namespace gradmesh::kernels {
namespace {

std::vector<uint32_t> CudaPositions(absl::Span<const float> values, size_t k) {
  // One device context per thread (CudaTopK is not thread-safe), grown to
  // the largest span seen.
  thread_local std::unique_ptr<CudaTopK> topk;
  thread_local size_t capacity = 0;
  if (topk == nullptr || values.size() > capacity) {
    capacity = std::max<size_t>(values.size(), 1 << 20);
    auto created = CudaTopK::Create(capacity);
    GM_CHECK_OK(created.status());
    topk = *std::move(created);
  }
  auto positions = topk->TopKPositionsOfHostData(values, k);
  GM_CHECK_OK(positions.status());
  return *std::move(positions);
}

class CudaSelector final : public TopKSelector {
 public:
  std::vector<uint32_t> Positions(absl::Span<const float> x,
                                  size_t k) const override {
    return CudaPositions(x, k);
  }
};

}  // namespace

absl::StatusOr<const TopKSelector*> CudaTopKForHostData() {
  if (CudaDeviceCount() == 0) {
    return absl::UnavailableError(CudaDeviceDescription());
  }
  static const CudaSelector* const kCuda = new CudaSelector();
  return kCuda;
}

}  // namespace gradmesh::kernels
