#include "worker/collectives/topkdsa.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/work_meter.h"
#include "worker/collectives/primitives.h"
#include "worker/collectives/schedule.h"
#include "worker/sparse/coo.h"
#include "worker/sparse/dense.h"
#include "worker/sparse/qsgd.h"

namespace gradmesh::collectives {
namespace {

constexpr int kSplitPhase = 0;
constexpr int kAllGatherPhase = 1;
constexpr char kSparse = 0;
constexpr char kDense = 1;
constexpr char kQuantized = 2;

// A partition being reduced: a sparse stream until delta is passed, dense
// after.
struct Stream {
  bool dense = false;
  sparse::SparseBlock sparse_sum;
  std::vector<float> dense_sum;
};

void AddToStream(const sparse::SparseBlock& part, sparse::IndexRange range,
                 Stream* stream) {
  if (!stream->dense &&
      stream->sparse_sum.size() + part.size() > TopkDsa::Delta(range.size())) {
    stream->dense = true;
    stream->dense_sum.assign(range.size(), 0.0f);
    for (size_t i = 0; i < stream->sparse_sum.size(); ++i) {
      stream->dense_sum[stream->sparse_sum.indices[i] - range.begin] =
          stream->sparse_sum.values[i];
    }
    stream->sparse_sum.clear();
  }
  if (stream->dense) {
    CountAccumulated(part.size());
    for (size_t i = 0; i < part.size(); ++i) {
      stream->dense_sum[part.indices[i] - range.begin] += part.values[i];
    }
  } else {
    stream->sparse_sum = sparse::Add(stream->sparse_sum, part);
  }
}

// OutOfRange if the stream's sum overflowed float32.
absl::Status CheckFinite(const Stream& stream) {
  for (float v : stream.dense ? stream.dense_sum : stream.sparse_sum.values) {
    if (!std::isfinite(v)) {
      return absl::OutOfRangeError(
          "TopkDSA: a partition's sum overflowed float32");
    }
  }
  return absl::OkStatus();
}

// Encodes the reduced partition. A quantized dense partition also returns,
// in `error`, what quantization took off each value (x - Q(x)).
std::string EncodeStream(const Stream& stream, sparse::IndexRange range,
                         const BlockCodec& codec, int quantize_bits,
                         uint64_t seed, std::vector<float>* error) {
  if (!stream.dense) {
    return kSparse + codec.Encode(stream.sparse_sum, range);
  }
  if (quantize_bits == 0) return kDense + sparse::EncodeDense(stream.dense_sum);
  std::string out{kQuantized, static_cast<char>(quantize_bits)};
  error->resize(stream.dense_sum.size());
  sparse::EncodeQsgd(stream.dense_sum, quantize_bits, seed, &out,
                     absl::MakeSpan(*error));
  for (size_t i = 0; i < error->size(); ++i) {
    (*error)[i] = stream.dense_sum[i] - (*error)[i];
  }
  return out;
}

// Appends the nonzero entries of a partition message to `result`; returns
// whether it was dense.
absl::StatusOr<bool> AppendPartition(absl::string_view bytes,
                                     sparse::IndexRange range,
                                     const BlockCodec& codec,
                                     sparse::SparseBlock* result,
                                     OpStats* stats) {
  if (bytes.empty()) {
    return absl::InvalidArgumentError("partition message lacks its tag byte");
  }
  const char tag = bytes[0];
  bytes.remove_prefix(1);
  if (tag == kDense || tag == kQuantized) {
    std::vector<float> values(range.size());
    if (tag == kDense) {
      GM_RETURN_IF_ERROR(sparse::DecodeDense(bytes, absl::MakeSpan(values)));
    } else {
      if (bytes.empty()) {
        return absl::InvalidArgumentError(
            "quantized partition lacks its width");
      }
      const int bits = bytes[0];
      bytes.remove_prefix(1);
      GM_RETURN_IF_ERROR(
          sparse::DecodeQsgd(bytes, bits, absl::MakeSpan(values)));
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] != 0.0f) {
        result->push_back(static_cast<uint32_t>(range.begin + i), values[i]);
      }
    }
    return true;
  }
  if (tag != kSparse) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown partition representation ", int{tag}));
  }
  GM_ASSIGN_OR_RETURN(sparse::SparseBlock block,
                      codec.Decode(bytes, range, stats));
  for (size_t i = 0; i < block.size(); ++i) {
    if (block.values[i] != 0.0f) {
      result->push_back(block.indices[i], block.values[i]);
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TopkDsa>> TopkDsa::Create(
    int world_size, int rank, uint64_t n, double density, int quantize_bits,
    uint64_t seed, const WireFormat& wire) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, density));
  if (quantize_bits != 0 && !sparse::IsQsgdBits(quantize_bits)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize_bits = ", quantize_bits, " must be 0, 2, 4 or 8"));
  }
  return std::unique_ptr<TopkDsa>(new TopkDsa(world_size, rank, n,
                                              SelectionSize(n, density),
                                              quantize_bits, seed, wire));
}

absl::StatusOr<uint64_t> TopkDsa::Accumulate(absl::Span<const float> gradient,
                                             absl::Span<float> residual,
                                             OpStats* stats) {
  return AccumulateChecked("TopkDSA", n_, gradient, residual, stats);
}

absl::StatusOr<Proposal> TopkDsa::Reduce(absl::Span<const float> accumulator,
                                         const OpContext& context,
                                         OpStats* stats) {
  sparse::SparseBlock selected = TimedTopKAbs(topk(), accumulator, k_, stats);
  sparse::SparseBlock local_loss = codec_.Round(&selected);
  StepRunner runner(context, stats);
  const int p = world_size_;
  const int w = rank_;
  const sparse::IndexRange mine = BlockRange(n_, p, w);

  // Split: send each owner its part, receive the parts of mine.
  std::vector<sparse::IndexRange> partitions;
  for (int r = 0; r < p; ++r) partitions.push_back(BlockRange(n_, p, r));
  GM_ASSIGN_OR_RETURN(std::vector<sparse::SparseBlock> parts,
                      SplitExchange(runner, PhaseStep(kSplitPhase), codec_,
                                    Group::World(p, w), selected, partitions));
  Stream stream;
  for (const sparse::SparseBlock& part : parts) {
    AddToStream(part, mine, &stream);
  }
  GM_RETURN_IF_ERROR(CheckFinite(stream));

  // A sparse sum rounds for the wire here, at its owner, who keeps the loss.
  sparse::SparseBlock owner_loss, owner_dropped;
  if (!stream.dense) {
    owner_loss = codec_.Round(&stream.sparse_sum, &owner_dropped);
  }

  // All-gather the reduced partitions.
  std::vector<float> quantization_error;
  const uint64_t seed = seed_ ^ (context.operation * 0x9e3779b97f4a7c15ULL) ^
                        (static_cast<uint64_t>(w) << 40);
  GM_ASSIGN_OR_RETURN(
      sparse::SparseBlock result,
      GatherPartitions(runner,
                       EncodeStream(stream, mine, codec_, quantize_bits_, seed,
                                    &quantization_error),
                       stats));
  stats->figures.own_dense = static_cast<int64_t>(stream.dense);
  stats->result_nonzeros = result.size();
  return Proposal{.result = std::move(result),
                  .apply = [selected = std::move(selected),
                            local_loss = std::move(local_loss),
                            owner_loss = std::move(owner_loss),
                            owner_dropped = std::move(owner_dropped),
                            quantization_error = std::move(quantization_error),
                            first = mine.begin](const sparse::SparseBlock&,
                                                absl::Span<float> residual) {
                    LeaveSelected(selected, local_loss, residual);
                    sparse::ScatterAdd(owner_loss, residual);
                    sparse::ScatterAdd(owner_dropped, residual);
                    for (size_t i = 0; i < quantization_error.size(); ++i) {
                      residual[first + i] += quantization_error[i];
                    }
                  }};
}

absl::StatusOr<sparse::SparseBlock> TopkDsa::GatherPartitions(
    StepRunner& runner, std::string mine, OpStats* stats) {
  const int p = world_size_;
  const int w = rank_;
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGather(runner, PhaseStep(kAllGatherPhase), Group::World(p, w),
                std::move(mine), PreferredAllGather(p)));
  sparse::SparseBlock result;
  int dense_partitions = 0;
  for (int r = 0; r < p; ++r) {
    auto dense = AppendPartition(gathered[r], BlockRange(n_, p, r), codec_,
                                 &result, r == w ? nullptr : stats);
    if (!dense.ok()) return PeerError(dense.status(), r);
    dense_partitions += *dense;
  }
  stats->figures.dense_partitions = dense_partitions;
  return result;
}

}  // namespace gradmesh::collectives
