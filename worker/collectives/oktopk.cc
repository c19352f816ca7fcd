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

constexpr uint32_t kSplitStep = 0;
constexpr uint32_t kRepartitionStep = 1u << 12;
constexpr uint32_t kEvaluateStep = 2u << 12;
constexpr uint32_t kCountsStep = 3u << 12;
constexpr uint32_t kBalanceStep = 4u << 12;
constexpr uint32_t kGatherStep = 5u << 12;

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

absl::StatusOr<sparse::SparseBlock> OkTopk::AllReduce(
    absl::Span<const float> gradient, absl::Span<float> residual,
    const OpContext& context, OpStats* stats) {
  GM_RETURN_IF_ERROR(ValidateSizes("Ok-Topk", n_, gradient, residual));
  // Every call counts, failed or not (in the agreement of
  // OpContext::accumulated too), so that ranks whose calls ended
  // differently still agree on the periods of the next one.
  const uint64_t t = iteration_++;
  GM_RETURN_IF_ERROR(
      BeginAllReduce("Ok-Topk", n_, gradient, residual, context, stats));
  StepRunner runner(context, stats);
  const bool evaluate = t % options_.tau_prime == 0;
  const bool repartition = t % options_.tau == 0;

  sparse::SparseBlock local;
  {
    ScopedTimer timer(&stats->topk_seconds);
    if (evaluate) local_threshold_ = kernels::KthLargestAbs(residual, k_);
    local = kernels::SelectAbsAtLeast(residual, local_threshold_, 0);
  }
  // Values that round to zero for the wire are not selected after all.
  const sparse::SparseBlock local_loss = codec_.Round(&local);
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
  const sparse::SparseBlock owner_loss = codec_.Round(&mine);
  GM_ASSIGN_OR_RETURN(sparse::SparseBlock result,
                      BalanceAndAllGather(runner, std::move(mine), stats));

  // Where a locally selected value reached the result, the residual keeps
  // only what wire rounding took off it.
  const sparse::SparseBlock left = Intersect(local, result);
  GM_RETURN_IF_ERROR(Commit(context, result));
  LeaveSelected(left, Intersect(local_loss, result), residual);
  sparse::ScatterAdd(owner_loss, residual);
  stats->SetDetail("local_selected", static_cast<int64_t>(local.size()));
  stats->SetDetail("global_selected", static_cast<int64_t>(result.size()));
  stats->SetDetail("thresholds_evaluated", evaluate);
  stats->SetDetail("repartitioned", repartition);
  stats->result_nonzeros = result.size();
  return result;
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
                      AllGather(runner, kRepartitionStep, world_,
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
  GM_ASSIGN_OR_RETURN(
      std::vector<sparse::SparseBlock> parts,
      SplitExchange(runner, kSplitStep, codec_, world_, local, regions));
  return SumInOrder(std::move(parts));
}

absl::Status OkTopk::EvaluateGlobalThreshold(
    StepRunner& runner, const sparse::SparseBlock& reduced) {
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGather(runner, kEvaluateStep, world_,
                codec_.Encode(reduced, sparse::IndexRange{0, n_}),
                PreferredAllGather(world_size_)));
  std::vector<float> values;
  for (int r = 0; r < world_size_; ++r) {
    auto region = codec_.Decode(gathered[r], sparse::IndexRange{0, n_},
                                r == rank_ ? nullptr : runner.stats());
    if (!region.ok()) return PeerError(region.status(), r);
    values.insert(values.end(), region->values.begin(), region->values.end());
  }
  global_threshold_ = kernels::KthLargestAbs(values, k_);
  return absl::OkStatus();
}

absl::StatusOr<sparse::SparseBlock> OkTopk::BalanceAndAllGather(
    StepRunner& runner, sparse::SparseBlock mine, OpStats* stats) {
  const int p = world_size_;
  const int w = rank_;
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered_counts,
      AllGather(runner, kCountsStep, world_,
                EncodeUint32s({static_cast<uint32_t>(mine.size())}),
                PreferredAllGather(p)));
  std::vector<uint64_t> offset(p + 1, 0);
  uint64_t largest = 0;
  for (int r = 0; r < p; ++r) {
    auto count = DecodeUint32s(gathered_counts[r], 1);
    if (!count.ok()) return PeerError(count.status(), r);
    offset[r + 1] = offset[r] + (*count)[0];
    largest = std::max<uint64_t>(largest, (*count)[0]);
  }
  const uint64_t total = offset[p];
  const bool balance = total > 0 && largest * p > 4 * total;
  stats->SetDetail("balanced", balance);

  sparse::SparseBlock chunk;
  if (!balance) {
    chunk = std::move(mine);
  } else {
    // Worker j takes global positions [target(j), target(j+1)).
    auto target = [&](int j) { return j * total / p; };
    auto overlap = [&](int from, int to) {
      const uint64_t lo = std::max(offset[from], target(to));
      const uint64_t hi = std::min(offset[from + 1], target(to + 1));
      return std::make_pair(lo, std::max(lo, hi));
    };
    std::vector<sparse::SparseBlock> pieces(p);
    const auto [own_lo, own_hi] = overlap(w, w);
    if (own_hi > own_lo) {
      pieces[w] = Positions(mine, own_lo - offset[w], own_hi - offset[w]);
    }
    for (int s = 1; s < p; ++s) {
      const int to = (w + s) % p;
      const int from = (w - s + p) % p;
      const auto [send_lo, send_hi] = overlap(w, to);
      const auto [recv_lo, recv_hi] = overlap(from, w);
      std::vector<std::string> outgoing;
      if (send_hi > send_lo) {
        outgoing.push_back(codec_.Encode(
            Positions(mine, send_lo - offset[w], send_hi - offset[w]),
            sparse::IndexRange{0, n_}));
      }
      const int expected = recv_hi > recv_lo ? 1 : 0;
      std::vector<std::string> received;
      if (!outgoing.empty() && expected) {
        GM_ASSIGN_OR_RETURN(
            received, runner.Exchange(kBalanceStep + s, to, std::move(outgoing),
                                      from, 1));
      } else if (!outgoing.empty()) {
        GM_RETURN_IF_ERROR(
            runner.Send(kBalanceStep + s, to, std::move(outgoing)));
      } else if (expected) {
        GM_ASSIGN_OR_RETURN(received,
                            runner.Receive(kBalanceStep + s, from, 1));
      }
      if (expected) {
        auto piece =
            codec_.Decode(received[0], sparse::IndexRange{0, n_}, stats);
        if (!piece.ok()) return PeerError(piece.status(), from);
        if (piece->size() != recv_hi - recv_lo) {
          return PeerError(absl::InvalidArgumentError("unexpected piece size"),
                           from);
        }
        pieces[from] = *std::move(piece);
      }
    }
    chunk = SumInOrder(std::move(pieces));  // disjoint: a concatenation
  }

  GM_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                      AllGather(runner, kGatherStep, world_,
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

}  // namespace gradmesh::collectives
