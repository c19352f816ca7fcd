#include "worker/kernels/topk_choice.h"

#include "absl/strings/str_cat.h"
#include "worker/kernels/topk.h"
#ifdef GRADMESH_HAS_CUDA
#include "worker/kernels/force_cuda.h"
#endif

namespace gradmesh::kernels {

absl::Status CheckTopKName(absl::string_view name) {
  if (name == "auto" || name == "cpu" || name == "cuda") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--topk=", name, " is not auto, cpu or cuda"));
}

absl::StatusOr<const TopKSelector*> TopKNamed(absl::string_view name) {
  if (absl::Status status = CheckTopKName(name); !status.ok()) return status;
  if (name != "cuda") return &CpuTopK();
#ifdef GRADMESH_HAS_CUDA
  absl::StatusOr<const TopKSelector*> cuda = CudaTopKForHostData();
  if (cuda.ok()) return cuda;
  return absl::Status(cuda.status().code(),
                      absl::StrCat("--topk=cuda: ", cuda.status().message()));
#else
  return absl::FailedPreconditionError(
      "--topk=cuda: this build has no CUDA (nvcc was not found when it was "
      "configured)");
#endif
}

}  // namespace gradmesh::kernels
