#include "worker/kernels/topk_choice.h"

#include "absl/strings/str_cat.h"
#include "worker/kernels/topk.h"
#ifdef GRADMESH_HAS_CUDA
#include "worker/kernels/force_cuda.h"
#endif

namespace gradmesh::kernels {

absl::Status UseTopK(absl::string_view name) {
  if (name == "auto" || name == "cpu") {
    SetTopKPositionsForTesting(nullptr);
    return absl::OkStatus();
  }
  if (name != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--topk=", name, " is not auto, cpu or cuda"));
  }
#ifdef GRADMESH_HAS_CUDA
  absl::Status status = ForceCudaTopK();
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("--topk=cuda: ", status.message()));
#else
  return absl::FailedPreconditionError(
      "--topk=cuda: this build has no CUDA (nvcc was not found when it was "
      "configured)");
#endif
}

}  // namespace gradmesh::kernels
