// The dense wire encoding: float32 values, little-endian, 4 bytes each. The
// receiver knows the range the values cover.
#ifndef GRADMESH_WORKER_SPARSE_DENSE_H_
#define GRADMESH_WORKER_SPARSE_DENSE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradmesh::sparse {

inline constexpr size_t kDenseValueBytes = 4;

std::string EncodeDense(absl::Span<const float> values);

// Copies a message of exactly out.size() values into `out`; InvalidArgument
// for any other length or a non-finite value.
absl::Status DecodeDense(absl::string_view bytes, absl::Span<float> out);

// Adds a message of exactly target.size() values into `target`, in one pass
// and without a copy; InvalidArgument for any other length (target
// untouched) or a non-finite value (target then holds the sums, non-finite
// ones included: for a scratch buffer only).
absl::Status AddDense(absl::string_view bytes, absl::Span<float> target);

}  // namespace gradmesh::sparse

#endif  // GRADMESH_WORKER_SPARSE_DENSE_H_
