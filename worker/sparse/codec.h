// Wire encodings of sparse blocks, chosen per block.
//
// A block covers a range [begin, end) known to both sides. Its encoding is
// one tag byte (encoding in the low 4 bits, value type in the high 4) and a
// payload that delimits itself given the range:
//
//   kCoo          varint c, c x uint32 index, c values
//   kDeltaVarint  varint c, c x varint gap (first: index - begin; then
//                 index - previous - 1), c values
//   kRuns         varint r, then r runs: uint32 start, uint32 length, length
//                 values (DenseStream); zeros inside a run stand for gaps of
//                 at most the break-even length (below)
//   kBitmap       ceil(size / 8) bytes, bit i (LSB first) = begin + i
//                 present; then one value per set bit; padding bits are 0
//   kDense        size values
//
// Values are float32, float16 or bfloat16 (little-endian; 16-bit types
// round to nearest even and saturate at the largest finite value). Entries
// whose value is, or rounds to, zero are not encoded: they carry nothing, and
// leaving them out makes every encoding decode to the same block.
//
// DenseStream's break-even gap: a run header costs 2 x 4 bytes and a zero
// inside a run K bytes, so a gap of z zeros is cheaper inside a run when
// z K <= 8, i.e. z <= 2 for float32 and z <= 4 for 16-bit values. (The
// paper's equation (3) prints the bounds of the total the wrong way round:
// the cost lies between 8 + K nnz, one run, and (8 + K) nnz, all isolated.)
//
// Decoders never trust their input: a truncated payload, a count or run past
// the range, unsorted or out-of-range indices, set padding bits, a bad tag or
// a non-finite value are InvalidArgument errors, never a crash or an
// out-of-bounds read.
#ifndef GRADMESH_WORKER_SPARSE_CODEC_H_
#define GRADMESH_WORKER_SPARSE_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::sparse {

enum class Encoding : uint8_t {
  kCoo = 0,
  kDeltaVarint = 1,
  kRuns = 2,
  kBitmap = 3,
  kDense = 4,
};
inline constexpr int kEncodingCount = 5;

enum class ValueType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBfloat16 = 2 };

// Bytes of one value of `type`.
size_t ValueBytes(ValueType type);

// `value` as the receiver will decode it: rounded to `type` (nearest even),
// saturated at the type's largest finite value.
float RoundTo(ValueType type, float value);

// The bytes EncodeBlock would write (tag included), without encoding.
size_t EncodedSize(const SparseBlock& block, IndexRange range,
                   Encoding encoding, ValueType type);

// The encoding with the fewest bytes for `block` (ties: the lower tag).
Encoding SmallestEncoding(const SparseBlock& block, IndexRange range,
                          ValueType type);

// Appends the tagged encoding of `block` in its smallest encoding (what
// SmallestEncoding would pick, without computing the entries twice); returns
// the encoding used.
Encoding EncodeSmallest(const SparseBlock& block, IndexRange range,
                        ValueType type, std::string* out);

// Appends the tagged encoding of `block` (whose indices lie in `range`).
void EncodeBlock(const SparseBlock& block, IndexRange range, Encoding encoding,
                 ValueType type, std::string* out);

// Decodes one tagged block from the front of `*in` and advances `*in` past
// it.
absl::StatusOr<SparseBlock> DecodeBlock(absl::string_view* in,
                                        IndexRange range);

}  // namespace gradmesh::sparse

#endif  // GRADMESH_WORKER_SPARSE_CODEC_H_
