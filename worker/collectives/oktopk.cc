#include "worker/collectives/oktopk.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/schedule.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/coo.h"

namespace gradmesh::collectives {
namespace {

constexpr int kSplitPhase = 0;
constexpr int kRepartitionPhase = 1;
constexpr int kEvaluatePhase = 2;
constexpr int kCountsPhase = 3;
constexpr int kBalancePhase = 4;
constexpr int kGatherPhase = 5;

std::string EncodeUint32s(const std::vector<uint32_t>& values) {
  std::string out(values.size() * sizeof(uint32_t), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

absl::StatusOr<std::vector<uint32_t>> DecodeUint32s(absl::string_view bytes,
                                                    size_t count) {
  if (bytes.size() != count * sizeof(uint32_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", count, " uint32 values, got ", bytes.size(), " bytes"));
  }
  std::vector<uint32_t> out(count);
  if (count > 0) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// The entries of `a` whose index is also in `b`.
sparse::SparseBlock Intersect(const sparse::SparseBlock& a,
                              const sparse::SparseBlock& b) {
  sparse::SparseBlock out;
  size_t j = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    while (j < b.size() && b.indices[j] < a.indices[i]) ++j;
    if (j < b.size() && b.indices[j] == a.indices[i]) {
      out.push_back(a.indices[i], a.values[i]);
    }
  }
  return out;
}

// The part of `block` at positions [begin, end) of its entries.
sparse::SparseBlock Positions(const sparse::SparseBlock& block, uint64_t begin,
                              uint64_t end) {
  return sparse::SparseBlock{
      {block.indices.begin() + begin, block.indices.begin() + end},
      {block.values.begin() + begin, block.values.begin() + end}};
}

}  // namespace

absl::StatusOr<std::unique_ptr<OkTopk>> OkTopk::Create(
    int world_size, int rank, uint64_t n, const OkTopkOptions& options) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, options.density));
  if (options.tau < 1 || options.tau_prime < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Ok-Topk periods must be positive (tau = ", options.tau,
                     ", tau' = ", options.tau_prime, ")"));
  }
  return std::unique_ptr<OkTopk>(new OkTopk(world_size, rank, n, options));
}

OkTopk::OkTopk(int world_size, int rank, uint64_t n,
               const OkTopkOptions& options)
    : world_size_(world_size),
      rank_(rank),
      n_(n),
      k_(SelectionSize(n, options.density)),
      options_(options),
      world_(Group::World(world_size, rank)),
      codec_(options.wire) {
  for (int r = 0; r <= world_size; ++r) {
    boundaries_.push_back(r == world_size ? n
                                          : BlockRange(n, world_size, r).begin);
  }
}

absl::StatusOr<uint64_t> OkTopk::Accumulate(absl::Span<const float> gradient,
                                            absl::Span<float> residual,
                                            OpStats* stats) {
  GM_RETURN_IF_ERROR(ValidateSizes("Ok-Topk", n_, gradient, residual));
  // Every call counts, failed or not (in the caller's agreement after this
  // phase too), so that ranks whose calls ended differently still agree on
  // the periods of the next one.
  iteration_++;
  return AccumulateChecked("Ok-Topk", n_, gradient, residual, stats);
}

absl::StatusOr<Proposal> OkTopk::Reduce(absl::Span<const float> accumulator,
                                        const OpContext& context,
                                        OpStats* stats) {
  const uint64_t t = iteration_ - 1;
  StepRunner runner(context, stats);
  const bool evaluate = t % options_.tau_prime == 0;
  const bool repartition = t % options_.tau == 0;

  sparse::SparseBlock local;
  {
    ScopedTimer timer(&stats->topk_seconds);
    if (evaluate) local_threshold_ = topk().KthLargestAbs(accumulator, k_);
    local = kernels::SelectAbsAtLeast(accumulator, local_threshold_, 0);
  }
  // Values that round to zero for the wire are not selected after all.
  sparse::SparseBlock local_loss = codec_.Round(&local);
  if (repartition) GM_RETURN_IF_ERROR(Repartition(runner, local));
  GM_ASSIGN_OR_RETURN(sparse::SparseBlock reduced,
                      SplitAndReduce(runner, local));
  if (evaluate) GM_RETURN_IF_ERROR(EvaluateGlobalThreshold(runner, reduced));
  sparse::SparseBlock mine;
  for (size_t i = 0; i < reduced.size(); ++i) {
    const float v = reduced.values[i];
    if (v != 0.0f && std::fabs(v) >= global_threshold_) {
      mine.push_back(reduced.indices[i], v);
    }
  }
  // The owner keeps what rounding takes off its global values; one that
  // rounds to zero leaves the result, and its contributors keep theirs.
  sparse::SparseBlock owner_loss = codec_.Round(&mine);
  GM_ASSIGN_OR_RETURN(sparse::SparseBlock result,
                      BalanceAndAllGather(runner, std::move(mine), stats));

  // Where a locally selected value reached the result, the residual keeps
  // only what wire rounding took off it.
  stats->figures.local_selected = static_cast<int64_t>(local.size());
  stats->figures.global_selected = static_cast<int64_t>(result.size());
  stats->figures.thresholds_evaluated = static_cast<int64_t>(evaluate);
  stats->figures.repartitioned = static_cast<int64_t>(repartition);
  stats->result_nonzeros = result.size();
  return Proposal{
      .result = std::move(result),
      .apply = [local = std::move(local), local_loss = std::move(local_loss),
                owner_loss = std::move(owner_loss)](
                   const sparse::SparseBlock& applied,
                   absl::Span<float> residual) {
        // Where a locally selected value reached the result, the
        // residual keeps only what wire rounding took off it.
        LeaveSelected(Intersect(local, applied), Intersect(local_loss, applied),
                      residual);
        sparse::ScatterAdd(owner_loss, residual);
      }};
}

absl::Status OkTopk::Repartition(StepRunner& runner,
                                 const sparse::SparseBlock& local) {
  const int p = world_size_;
  std::vector<uint32_t> mine(p - 1);
  const uint64_t m = local.size();
  for (int r = 1; r < p; ++r) {
    mine[r - 1] = m == 0 ? static_cast<uint32_t>(BlockRange(n_, p, r).begin)
                         : local.indices[r * m / p];
  }
  GM_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                      AllGather(runner, PhaseStep(kRepartitionPhase), world_,
                                EncodeUint32s(mine), PreferredAllGather(p)));
  std::vector<uint64_t> sums(p - 1, 0);
  for (int q = 0; q < p; ++q) {
    auto theirs = DecodeUint32s(gathered[q], p - 1);
    if (!theirs.ok()) return PeerError(theirs.status(), q);
    for (int r = 0; r + 1 < p; ++r)
      sums[r] += std::min<uint64_t>((*theirs)[r], n_);
  }
  for (int r = 1; r < p; ++r) {
    boundaries_[r] = std::max(boundaries_[r - 1], sums[r - 1] / p);
  }
  return absl::OkStatus();
}

absl::StatusOr<sparse::SparseBlock> OkTopk::SplitAndReduce(
    StepRunner& runner, const sparse::SparseBlock& local) {
  std::vector<sparse::IndexRange> regions;
  for (int r = 0; r < world_size_; ++r) regions.push_back(Region(r));
  GM_ASSIGN_OR_RETURN(std::vector<sparse::SparseBlock> parts,
                      SplitExchange(runner, PhaseStep(kSplitPhase), codec_,
                                    world_, local, regions));
  return SumInOrder(std::move(parts));
}

absl::Status OkTopk::EvaluateGlobalThreshold(
    StepRunner& runner, const sparse::SparseBlock& reduced) {
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGather(runner, PhaseStep(kEvaluatePhase), world_,
                codec_.Encode(reduced, sparse::IndexRange{0, n_}),
                PreferredAllGather(world_size_)));
  std::vector<float> values;
  for (int r = 0; r < world_size_; ++r) {
    auto region = codec_.Decode(gathered[r], sparse::IndexRange{0, n_},
                                r == rank_ ? nullptr : runner.stats());
    if (!region.ok()) return PeerError(region.status(), r);
    values.insert(values.end(), region->values.begin(), region->values.end());
  }
  global_threshold_ = topk().KthLargestAbs(values, k_);
  return absl::OkStatus();
}

absl::StatusOr<sparse::SparseBlock> OkTopk::BalanceAndAllGather(
    StepRunner& runner, sparse::SparseBlock mine, OpStats* stats) {
  const int p = world_size_;
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered_counts,
      AllGather(runner, PhaseStep(kCountsPhase), world_,
                EncodeUint32s({static_cast<uint32_t>(mine.size())}),
                PreferredAllGather(p)));
  std::vector<uint64_t> counts(p);
  for (int r = 0; r < p; ++r) {
    auto count = DecodeUint32s(gathered_counts[r], 1);
    if (!count.ok()) return PeerError(count.status(), r);
    counts[r] = (*count)[0];
  }
  const Balance balance = PlanBalance(counts);
  stats->figures.balanced = static_cast<int64_t>(balance.needed);
  sparse::SparseBlock chunk = std::move(mine);
  if (balance.needed) {
    GM_ASSIGN_OR_RETURN(chunk, Rebalance(runner, balance, chunk, stats));
  }
  GM_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                      AllGather(runner, PhaseStep(kGatherPhase), world_,
                                codec_.Encode(chunk, sparse::IndexRange{0, n_}),
                                PreferredAllGather(p)));
  sparse::SparseBlock result;
  for (int r = 0; r < p; ++r) {
    auto part = codec_.Decode(gathered[r], sparse::IndexRange{0, n_},
                              r == rank_ ? nullptr : stats);
    if (!part.ok()) return PeerError(part.status(), r);
    result.indices.insert(result.indices.end(), part->indices.begin(),
                          part->indices.end());
    result.values.insert(result.values.end(), part->values.begin(),
                         part->values.end());
  }
  GM_RETURN_IF_ERROR(sparse::Validate(result, sparse::IndexRange{0, n_}));
  return result;
}

absl::StatusOr<sparse::SparseBlock> OkTopk::Rebalance(
    StepRunner& runner, const Balance& balance, const sparse::SparseBlock& mine,
    OpStats* stats) {
  const int w = rank_;
  const uint64_t own = balance.offsets[w];
  const auto piece_of_mine = [&](PositionRange range) {
    return Positions(mine, range.begin - own, range.end - own);
  };
  std::vector<sparse::SparseBlock> pieces(world_size_);
  if (const PositionRange keep = balance.Transfer(w, w); keep.size() > 0) {
    pieces[w] = piece_of_mine(keep);
  }
  const std::vector<Step> steps = PlanRotation(world_size_, w);
  for (size_t s = 0; s < steps.size(); ++s) {
    const uint32_t tag = PhaseStep(kBalancePhase, s + 1);
    const int to = steps[s].send_to;
    const int from = steps[s].recv_from;
    const PositionRange out = balance.Transfer(w, to);
    const PositionRange in = balance.Transfer(from, w);
    std::vector<std::string> outgoing;
    if (out.size() > 0) {
      outgoing.push_back(
          codec_.Encode(piece_of_mine(out), sparse::IndexRange{0, n_}));
    }
    // One round whichever halves this step has.
    std::vector<std::string> received;
    if (!outgoing.empty() && in.size() > 0) {
      GM_ASSIGN_OR_RETURN(
          received, runner.Exchange(tag, to, std::move(outgoing), from, 1));
    } else if (!outgoing.empty()) {
      GM_RETURN_IF_ERROR(runner.Send(tag, to, std::move(outgoing)));
    } else if (in.size() > 0) {
      GM_ASSIGN_OR_RETURN(received, runner.Receive(tag, from, 1));
    }
    if (in.size() == 0) continue;
    auto piece = codec_.Decode(received[0], sparse::IndexRange{0, n_}, stats);
    if (!piece.ok()) return PeerError(piece.status(), from);
    if (piece->size() != in.size()) {
      return PeerError(absl::InvalidArgumentError("unexpected piece size"),
                       from);
    }
    pieces[from] = *std::move(piece);
  }
  return SumInOrder(std::move(pieces));  // disjoint: a concatenation
}

}  // namespace gradmesh::collectives
