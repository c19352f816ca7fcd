// How the algorithms put sparse blocks on the wire.
//
// The default is plain COO (sparse/coo.h): 8 bytes a value, no tag, what the
// papers' cost formulas count. The tagged formats (sparse/codec.h) encode
// every block on its own, in a fixed encoding or in whichever is smallest
// for it (`auto`), with float32, float16 or bfloat16 values.
//
// 16-bit values are lossy. An algorithm rounds a block with Round() before it
// first leaves, keeps the rounded block as its own copy (so that every rank
// holds what the others decode) and puts what rounding took off into its
// residual, with the same share as a discard of that block; the conservation
// identity then still holds to float rounding.
#ifndef GRADMESH_WORKER_COLLECTIVES_WIRE_H_
#define GRADMESH_WORKER_COLLECTIVES_WIRE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/collectives/plan.h"
#include "worker/sparse/codec.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::collectives {

struct OpStats;

class BlockCodec {
 public:
  explicit BlockCodec(WireFormat format = {}) : format_(format) {}

  bool lossy() const { return format_.values != sparse::ValueType::kFloat32; }

  // Rounds `block` to the wire's value type in place. Returns what rounding
  // took off (value - rounded) at the kept entries it changed; entries that
  // round to zero leave the block and, when `dropped` is not null, are
  // appended there whole. Nothing happens for float32.
  sparse::SparseBlock Round(sparse::SparseBlock* block,
                            sparse::SparseBlock* dropped = nullptr) const;

  // One message carrying `blocks` over `ranges` (in order).
  std::string Encode(absl::Span<const sparse::SparseBlock* const> blocks,
                     absl::Span<const sparse::IndexRange> ranges) const;
  std::string Encode(const sparse::SparseBlock& block,
                     sparse::IndexRange range) const;

  // Decodes a message of blocks over `ranges`; InvalidArgument for anything
  // malformed, including bytes left over. Adds the volume as plain COO to
  // stats->coo_bytes_received unless `stats` is null (a worker decoding its
  // own message).
  absl::StatusOr<std::vector<sparse::SparseBlock>> Decode(
      absl::string_view bytes, absl::Span<const sparse::IndexRange> ranges,
      OpStats* stats) const;
  absl::StatusOr<sparse::SparseBlock> Decode(absl::string_view bytes,
                                             sparse::IndexRange range,
                                             OpStats* stats) const;

 private:
  WireFormat format_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_WIRE_H_
