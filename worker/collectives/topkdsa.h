// TopkDSA: SparCML's dynamic sparse all-reduce (DSAR split-allgather,
// Section 5.3), for any P >= 1.
//
//  1. Each worker selects its exact top k (residual = accumulator - top k).
//  2. Split: [0, n) is cut into P partitions (BlockRange); partition r
//     belongs to worker r. Each worker sends every other owner the part of
//     its selection in that owner's partition directly, with destination
//     rotation (step s: to w + s, from w - s), P - 1 rounds.
//  3. Each owner sums the P parts of its partition in rank order 0..P-1 as a
//     sparse stream that switches to dense as SparCML's summation does: when
//     |H1| + |H2| (the upper bound of the union) would pass
//     delta = N isize / (c + isize), with N the partition size and
//     isize = c = 4 bytes, i.e. delta = N / 2.
//  4. All-gather of the reduced partitions (recursive doubling when P is a
//     power of two, Bruck otherwise). Each partition travels as one message
//     that starts with a representation byte (SparCML's "extra value"):
//     0 = sparse COO (8 bytes per value), 1 = dense float32 (4 bytes per
//     value of the partition).
// Sparse parts and partitions travel in the wire format (wire.h); dense
// partitions stay float32 (or QSGD, below).
//
// Optional low-precision dense phase (SparCML Section 6): with
// quantize_bits = 2, 4 or 8, a partition that went dense travels QSGD-
// quantized (sparse/qsgd.h; representation byte 2, then the width) instead
// of as float32, rounded with a generator seeded by (seed, operation, rank)
// so runs repeat. The owner keeps the rounding error x - Q(x) in its
// residual, so the conservation identity still holds to float rounding;
// each result value is within scale / (2^(b-1) - 1) of the exact sum, scale
// being the largest |x| of its bucket of 1024.
//
// The result is the concatenation of the partitions with exact zeros dropped
// (a dense partition carries zeros, a cancelled sum may), so every
// representation yields the same result. Summation order is fixed by rank,
// so every worker gets the bitwise identical result.
//
// Rounds: (P - 1) + log2 P or ceil(log2 P). Bytes received: the split parts
// (at most 8 k) plus the other partitions, each at most 8 delta + 1 =
// 4 N + 1: within [4 k (P-1)/P, (2 k + n)(P-1)/P] words of 4 bytes, plus one
// representation byte per partition.
// Figures (OpFigures): dense_partitions (how many partitions went dense, the
// same on every worker) and own_dense (1 when this worker's partition did).
#ifndef GRADMESH_WORKER_COLLECTIVES_TOPKDSA_H_
#define GRADMESH_WORKER_COLLECTIVES_TOPKDSA_H_

#include <memory>
#include <vector>

#include "worker/collectives/collective.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

class TopkDsa : public Collective {
 public:
  // quantize_bits: 0 (off), 2, 4 or 8.
  static absl::StatusOr<std::unique_ptr<TopkDsa>> Create(
      int world_size, int rank, uint64_t n, double density,
      int quantize_bits = 0, uint64_t seed = 1, const WireFormat& wire = {});

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

  // delta for a partition of `size` values: size * 4 / (4 + 4).
  static uint64_t Delta(uint64_t size) { return size / 2; }

 private:
  TopkDsa(int world_size, int rank, uint64_t n, uint64_t k, int quantize_bits,
          uint64_t seed, const WireFormat& wire)
      : world_size_(world_size),
        rank_(rank),
        n_(n),
        k_(k),
        quantize_bits_(quantize_bits),
        seed_(seed),
        codec_(wire) {}

  // Gathers every worker's encoded partition (`mine` this worker's) and
  // assembles the result in partition order.
  absl::StatusOr<sparse::SparseBlock> GatherPartitions(StepRunner& runner,
                                                       std::string mine,
                                                       OpStats* stats);

  const int world_size_;
  const int rank_;
  const uint64_t n_;
  const uint64_t k_;
  const int quantize_bits_;
  const uint64_t seed_;
  const BlockCodec codec_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_TOPKDSA_H_
