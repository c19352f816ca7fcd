#include "worker/collectives/wire.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/collective.h"
#include "worker/sparse/coo.h"

namespace gradmesh::collectives {

sparse::SparseBlock BlockCodec::Round(sparse::SparseBlock* block,
                                      sparse::SparseBlock* dropped) const {
  sparse::SparseBlock loss;
  if (!lossy()) return loss;
  sparse::SparseBlock kept;
  kept.reserve(block->size());
  for (size_t i = 0; i < block->size(); ++i) {
    const float v = block->values[i];
    const float r = sparse::RoundTo(format_.values, v);
    if (r == 0.0f) {
      if (dropped != nullptr) dropped->push_back(block->indices[i], v);
      continue;
    }
    kept.push_back(block->indices[i], r);
    if (r != v) loss.push_back(block->indices[i], v - r);
  }
  *block = std::move(kept);
  return loss;
}

std::string BlockCodec::Encode(
    absl::Span<const sparse::SparseBlock* const> blocks,
    absl::Span<const sparse::IndexRange> ranges) const {
  GM_CHECK(blocks.size() == ranges.size());
  if (!format_.tagged) return sparse::EncodeCoo(blocks);
  std::string out;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (format_.fixed.has_value()) {
      sparse::EncodeBlock(*blocks[i], ranges[i], *format_.fixed, format_.values,
                          &out);
    } else {
      sparse::EncodeSmallest(*blocks[i], ranges[i], format_.values, &out);
    }
  }
  return out;
}

std::string BlockCodec::Encode(const sparse::SparseBlock& block,
                               sparse::IndexRange range) const {
  const sparse::SparseBlock* one[] = {&block};
  return Encode(one, absl::MakeConstSpan(&range, 1));
}

absl::StatusOr<std::vector<sparse::SparseBlock>> BlockCodec::Decode(
    absl::string_view bytes, absl::Span<const sparse::IndexRange> ranges,
    OpStats* stats) const {
  std::vector<sparse::SparseBlock> blocks;
  if (!format_.tagged) {
    GM_ASSIGN_OR_RETURN(blocks, sparse::DecodeCoo(bytes, ranges));
  } else {
    for (const sparse::IndexRange& range : ranges) {
      GM_ASSIGN_OR_RETURN(sparse::SparseBlock block,
                          sparse::DecodeBlock(&bytes, range));
      blocks.push_back(std::move(block));
    }
    if (!bytes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(bytes.size(), " bytes left after the message's blocks"));
    }
  }
  for (const sparse::SparseBlock& b : blocks) {
    if (stats != nullptr) {
      stats->coo_bytes_received += sparse::kCooEntryBytes * b.size();
    }
  }
  return blocks;
}

absl::StatusOr<sparse::SparseBlock> BlockCodec::Decode(absl::string_view bytes,
                                                       sparse::IndexRange range,
                                                       OpStats* stats) const {
  GM_ASSIGN_OR_RETURN(std::vector<sparse::SparseBlock> blocks,
                      Decode(bytes, absl::MakeConstSpan(&range, 1), stats));
  return std::move(blocks[0]);
}

}  // namespace gradmesh::collectives
