#include "worker/collectives/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace gradmesh::collectives {

uint64_t SelectionSize(uint64_t n, double density) {
  if (n == 0) return 0;
  const long long k = std::llround(density * static_cast<double>(n));
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::max(k, 1LL)), 1, n);
}

absl::StatusOr<WireFormat> WireFormat::Parse(absl::string_view encoding,
                                             absl::string_view values) {
  WireFormat format;
  if (values == "fp16") {
    format.values = sparse::ValueType::kFloat16;
  } else if (values == "bf16") {
    format.values = sparse::ValueType::kBfloat16;
  } else if (values != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("values '", values, "' is not fp32, fp16 or bf16"));
  }
  format.tagged = encoding != "coo";
  if (encoding == "coo-tagged") {
    format.fixed = sparse::Encoding::kCoo;
  } else if (encoding == "delta") {
    format.fixed = sparse::Encoding::kDeltaVarint;
  } else if (encoding == "runs") {
    format.fixed = sparse::Encoding::kRuns;
  } else if (encoding == "bitmap") {
    format.fixed = sparse::Encoding::kBitmap;
  } else if (encoding == "dense") {
    format.fixed = sparse::Encoding::kDense;
  } else if (encoding != "auto" && encoding != "coo") {
    return absl::InvalidArgumentError(
        absl::StrCat("encoding '", encoding,
                     "' is not coo, auto, coo-tagged, delta, runs, bitmap or "
                     "dense"));
  }
  if (!format.tagged && format.values != sparse::ValueType::kFloat32) {
    return absl::InvalidArgumentError(
        "16-bit values need a tagged encoding (auto, say), not plain coo");
  }
  return format;
}

}  // namespace gradmesh::collectives
