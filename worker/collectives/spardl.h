// SparDL (paper 000): Spar-Reduce-Scatter, Spar-All-Gather over d teams and
// global residual collection, for any number of workers P >= 1.
//
// The P workers form d teams of p = P/d consecutive ranks (TeamLayout). The
// gradient [0, n) is cut into p blocks; block b's quota q_b splits
// k = SelectionSize(n, density) over the p blocks (about dk/P each), so the
// result never holds more than k values. One AllReduce runs:
//
//  1. acc = gradient + residual (the residual buffer itself) and a dense
//     working copy `work`.
//  2. Spar-Reduce-Scatter inside the team (schedule.h), with Algorithm 1's
//     timing: blocks stay dense, received sparse blocks are added into them,
//     and a block is cut to the top q_b of |x| right before it leaves. What a
//     cut discards stays in `work` (the selected entries are zeroed), i.e. the
//     in-procedure residual xi at the worker that cut it. At the end the kept
//     block w is cut the same way.
//  3. Spar-All-Gather across teams, between the workers of equal position:
//     - R-SAG (d a power of two): recursive doubling; each exchange sums the
//       two blocks (lower team first), keeps the top q_w and the discarded part
//       D goes to the residual. At step t (1-based) 2^t workers compute the
//       identical D, so each keeps D / 2^t. (The paper says "half"; that is
//       right at step 1 only, and 1/2^t is the split that conserves mass.)
//     - B-SAG (otherwise): top-h of the block (the rest goes to the
//       residual), a Bruck all-gather of the d top-h blocks across teams, a sum
//       in team order 0..d-1 (canonical, so all d holders agree bitwise),
//       N = its number of entries, the top q_w kept and D / d of the discarded
//       D kept by each of the d holders. h follows Algorithm 2 per block: it
//       starts at q_w / d with step 0.01 * q_w * (d-1)/d, is updated after each
//       iteration from that iteration's N (the paper's N_t), and is clamped to
//       [ceil(q_w/d), q_w], the range the paper derives. The first iteration
//       uses the initial h.
//     d = 1 skips this phase.
//  4. Bruck all-gather of the kept blocks inside the team.
//  5. Global residual collection (Algorithm 1, lines 11-13): the residual is
//     acc (the worker's own gradient + old residual) at indexes absent from
//     the result, and `work` (xi plus its SAG shares) at indexes present in
//     it. Only the O(k) result indexes are touched.
//
// Memory: the residual (caller's) plus one n-float working buffer kept across
// iterations; sparse buffers are O(k). Passes over dense data: one fused
// add-and-copy and one top-k scan per block.
//
// Rounds: 2 ceil(log2 p) + (log2 d for R-SAG, ceil(log2 d) for B-SAG).
// Bytes: 8 per value with the default plain COO (coo.h); other wire formats
// (wire.h) encode each block on its own, and 16-bit values round where a
// block is made to leave, the loss kept with the block's discard share.
// Figures (OpFigures): srs_nonzeros, the kept block's entries after SRS, and
// sag_nonzeros after SAG (d > 1); B-SAG sets bsag_h, the h used, and
// bsag_gathered, the entries after the all-gather across teams (N_t of
// Algorithm 2).
#ifndef GRADMESH_WORKER_COLLECTIVES_SPARDL_H_
#define GRADMESH_WORKER_COLLECTIVES_SPARDL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/collectives/collective.h"
#include "worker/collectives/schedule.h"
#include "worker/collectives/tensor_quota.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

struct SparDlOptions {
  double density = 0.01;  // k / n, in (0, 1]
  int teams = 1;          // d, must divide the world size
  WireFormat wire;        // how blocks travel (wire.h)
  // The first index of each tensor fused in the buffer: every selection
  // splits its quota per tensor (tensor_quota.h). Empty: one vector.
  std::vector<uint64_t> tensor_starts;
};

// Algorithm 2 of the paper: the compression-ratio (h) adjustment of B-SAG for
// one block of quota `quota` shared by `teams` teams.
class BsagHController {
 public:
  BsagHController(uint64_t quota, int teams);

  // The h to use in the coming iteration.
  uint64_t h() const;

  // Feeds back N, the entries after this iteration's all-gather.
  void Update(uint64_t gathered);

 private:
  double quota_;
  double min_h_;
  double h_;
  double step_;
  bool flag_ = false;
};

class SparDl : public Collective {
 public:
  // InvalidArgument when the density is outside (0, 1], d does not divide
  // world_size, rank is out of range or n does not fit uint32 indices.
  static absl::StatusOr<std::unique_ptr<SparDl>> Create(
      int world_size, int rank, uint64_t n, const SparDlOptions& options);

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

 private:
  SparDl(int world_size, int rank, uint64_t n, const SparDlOptions& options);

  // Runs steps 2-4 on `work`; returns this worker's sparse result.
  absl::StatusOr<sparse::SparseBlock> Run(StepRunner& runner, OpStats* stats);
  absl::Status SparReduceScatter(StepRunner& runner);
  absl::Status RecursiveSag(StepRunner& runner);
  absl::Status BruckSag(StepRunner& runner, OpStats* stats);
  absl::StatusOr<sparse::SparseBlock> TeamAllGather(StepRunner& runner);

  // Sends `outgoing` (the blocks of step.send) to the team member
  // step.send_to and returns the blocks of step.recv from step.recv_from.
  absl::StatusOr<std::vector<sparse::SparseBlock>> ExchangeInTeam(
      StepRunner& runner, uint32_t tag_step, const Step& step,
      absl::Span<const sparse::SparseBlock* const> outgoing);
  // Cuts dense block b of `work_` to its quota: returns the kept entries and
  // zeroes them in `work_`, leaving the discarded part there.
  sparse::SparseBlock CutBlock(int b, OpStats* stats);
  // work_[i] += share * value for every discarded entry.
  void KeepShare(const sparse::SparseBlock& dropped, float share);

  const TeamLayout layout_;
  const int rank_;
  const int team_;
  const int position_;
  const uint64_t n_;
  const uint64_t k_;
  const BlockCodec codec_;
  const TensorQuotas tensors_;  // how each selection splits its quota
  std::vector<sparse::IndexRange> ranges_;  // the p blocks
  std::vector<uint64_t> quotas_;  // per block, this round's (RotatedBlockQuota)
  uint64_t rounds_ = 0;           // Reduce calls so far
  std::vector<float> work_;
  sparse::SparseBlock own_;  // this worker's block after SRS / SAG
  BsagHController h_controller_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_SPARDL_H_
