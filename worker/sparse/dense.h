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

}  // namespace gradmesh::sparse

#endif  // GRADMESH_WORKER_SPARSE_DENSE_H_
