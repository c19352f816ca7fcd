// QSGD-style stochastic quantization of dense values (SparCML Section 6):
// buckets of 1024 consecutive values, each with one float32 scale (its
// largest |x|) and b-bit signed levels, b in {2, 4, 8}:
//
//   s = 2^(b-1) - 1 levels per sign; y = |x| / scale * s;
//   level = floor(y) + (1 with probability y - floor(y)); q = sign(x) level
//   value = q * scale / s
//
// so E[value] = x and |value - x| <= scale / s. Randomness comes from a
// seeded generator per bucket, so the same (seed, bucket) always rounds the
// same way. Wire layout per bucket, little-endian: float32 scale, then the
// levels as b-bit two's complement, packed from the low bits of each byte,
// padded to a whole byte.
#ifndef GRADMESH_WORKER_SPARSE_QSGD_H_
#define GRADMESH_WORKER_SPARSE_QSGD_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradmesh::sparse {

inline constexpr size_t kQsgdBucket = 1024;

// True for the supported bit widths.
bool IsQsgdBits(int bits);

// Encoded size of `count` values.
size_t QsgdBytes(size_t count, int bits);

// Quantizes `values` (finite: a broken invariant otherwise), appends the
// encoding to `out` and writes the values as the receiver will decode them into
// `decoded` (decoded.size() == values.size()).
void EncodeQsgd(absl::Span<const float> values, int bits, uint64_t seed,
                std::string* out, absl::Span<float> decoded);

// Decodes exactly out.size() values; InvalidArgument for a wrong length or a
// non-finite scale.
absl::Status DecodeQsgd(absl::string_view bytes, int bits,
                        absl::Span<float> out);

}  // namespace gradmesh::sparse

#endif  // GRADMESH_WORKER_SPARSE_QSGD_H_
