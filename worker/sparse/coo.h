// The COO wire encoding of sparse blocks.
//
// A message carries one or more blocks whose index ranges are known to both
// sides (the schedule says which blocks travel). Layout, little-endian:
//
//   uint32 indices[c] | float32 values[c]      (c = total entries, 8c bytes)
//
// Blocks follow each other in the order of `ranges`; within a block the
// indices increase. No per-block header is needed: the receiver assigns each
// index to the first listed range, at or after the current one, that contains
// it. A message of c entries is exactly 8c bytes, which is the volume the
// papers' cost formulas count (4-byte index + 4-byte value per entry).
//
// DecodeCoo never trusts its input: a length that is not a multiple of 8, an
// index outside every remaining range, indices that do not increase within a
// block, or a non-finite value are InvalidArgument errors.
#ifndef GRADMESH_WORKER_SPARSE_COO_H_
#define GRADMESH_WORKER_SPARSE_COO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::sparse {

// Bytes of one COO entry on the wire: a uint32 index and a float32 value.
inline constexpr size_t kCooEntryBytes = 8;

// Encodes `blocks` (in order) into one message.
std::string EncodeCoo(absl::Span<const SparseBlock* const> blocks);
inline std::string EncodeCoo(const SparseBlock& block) {
  const SparseBlock* one[] = {&block};
  return EncodeCoo(one);
}

// Decodes a message holding blocks for `ranges` (in order), one output block
// per range.
absl::StatusOr<std::vector<SparseBlock>> DecodeCoo(
    absl::string_view bytes, absl::Span<const IndexRange> ranges);
absl::StatusOr<SparseBlock> DecodeCoo(absl::string_view bytes,
                                      IndexRange range);

}  // namespace gradmesh::sparse

#endif  // GRADMESH_WORKER_SPARSE_COO_H_
