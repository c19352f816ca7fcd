#include "worker/collectives/spardl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/work_meter.h"
#include "worker/collectives/primitives.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/coo.h"

namespace gradmesh::collectives {
namespace {

// Tag steps of the three phases, so their messages can never mix.
constexpr int kSrsPhase = 0;
constexpr int kSagPhase = 1;
constexpr int kGatherPhase = 2;

std::vector<sparse::IndexRange> RunRanges(
    const std::vector<sparse::IndexRange>& ranges, BlockRun run) {
  std::vector<sparse::IndexRange> out;
  const int p = static_cast<int>(ranges.size());
  for (int i = 0; i < run.count; ++i)
    out.push_back(ranges[(run.first + i) % p]);
  return out;
}

}  // namespace

BsagHController::BsagHController(uint64_t quota, int teams)
    : quota_(static_cast<double>(quota)),
      min_h_(std::ceil(quota_ / teams)),
      h_(quota_ / teams),
      step_(0.01 * quota_ * (teams - 1) / teams) {}

uint64_t BsagHController::h() const {
  return static_cast<uint64_t>(std::clamp(std::llround(h_),
                                          static_cast<long long>(min_h_),
                                          static_cast<long long>(quota_)));
}

void BsagHController::Update(uint64_t gathered) {
  // Algorithm 2, lines 3-12: keep going while the direction is right
  // (too many entries and shrinking, or too few and growing), doubling the
  // step every second time; otherwise turn round at half the step.
  const bool too_many = static_cast<double>(gathered) > quota_;
  if (too_many != (step_ > 0)) {
    if (flag_) {
      step_ *= 2;
      flag_ = false;
    } else {
      flag_ = true;
    }
  } else {
    step_ = -step_ / 2;
    flag_ = false;
  }
  const double span = quota_ - min_h_;
  step_ = std::clamp(step_, -span, span);
  h_ = std::clamp(h_ + step_, min_h_, quota_);
}

absl::StatusOr<std::unique_ptr<SparDl>> SparDl::Create(
    int world_size, int rank, uint64_t n, const SparDlOptions& options) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, options.density));
  if (options.teams < 1 || world_size % options.teams != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "teams d = ", options.teams, " must be a positive divisor of the ",
        world_size, " workers"));
  }
  return std::unique_ptr<SparDl>(new SparDl(world_size, rank, n, options));
}

SparDl::SparDl(int world_size, int rank, uint64_t n,
               const SparDlOptions& options)
    : layout_{world_size, options.teams},
      rank_(rank),
      team_(layout_.team_of(rank)),
      position_(layout_.position_of(rank)),
      n_(n),
      k_(SelectionSize(n, options.density)),
      codec_(options.wire),
      tensors_(options.tensor_starts),
      work_(n),
      h_controller_(0, 1) {
  const int p = layout_.team_size();
  for (int b = 0; b < p; ++b) {
    ranges_.push_back(BlockRange(n_, p, b));
    quotas_.push_back(RotatedBlockQuota(k_, p, b, ranges_.back().size(), 0));
  }
  h_controller_ = BsagHController(quotas_[position_], layout_.teams);
}

absl::StatusOr<uint64_t> SparDl::Accumulate(absl::Span<const float> gradient,
                                            absl::Span<float> residual,
                                            OpStats* stats) {
  GM_CHECK(stats != nullptr);
  GM_RETURN_IF_ERROR(ValidateSizes("SparDL", n_, gradient, residual));
  // Step 1: acc = gradient + residual, in place, and its working copy, in
  // one pass (non-finite values left out, as AccumulateFinite does).
  uint64_t nonfinite = 0;
  CountAccumulated(n_);
  for (uint64_t i = 0; i < n_; ++i) {
    const float v = gradient[i];
    const bool finite = std::isfinite(v);
    residual[i] += finite ? v : 0.0f;
    nonfinite += finite ? 0 : 1;
    work_[i] = residual[i];
  }
  *stats = OpStats{};
  return nonfinite;
}

absl::StatusOr<Proposal> SparDl::Reduce(absl::Span<const float>,
                                        const OpContext& context,
                                        OpStats* stats) {
  // Runs on work_, the accumulator's copy that Accumulate made.
  if (k_ < static_cast<uint64_t>(layout_.team_size())) {
    // The units move on (RotatedBlockQuota), and B-SAG's h follows its
    // block's quota of this round.
    for (int b = 0; b < layout_.team_size(); ++b) {
      quotas_[b] = RotatedBlockQuota(k_, layout_.team_size(), b,
                                     ranges_[b].size(), rounds_);
    }
    h_controller_ = BsagHController(quotas_[position_], layout_.teams);
  }
  ++rounds_;
  StepRunner runner(context, stats);
  GM_ASSIGN_OR_RETURN(sparse::SparseBlock result, Run(runner, stats));
  stats->result_nonzeros = result.size();
  return Proposal{.result = std::move(result),
                  .apply = [this](const sparse::SparseBlock& applied,
                                  absl::Span<float> residual) {
                    // Step 5: xi (and SAG shares) where the result has an
                    // entry.
                    for (uint32_t i : applied.indices) residual[i] = work_[i];
                  }};
}

absl::StatusOr<sparse::SparseBlock> SparDl::Run(StepRunner& runner,
                                                OpStats* stats) {
  GM_RETURN_IF_ERROR(SparReduceScatter(runner));
  own_ = CutBlock(position_, stats);
  stats->figures.srs_nonzeros = static_cast<int64_t>(own_.size());
  if (layout_.teams > 1) {
    if (IsPowerOfTwo(layout_.teams)) {
      GM_RETURN_IF_ERROR(RecursiveSag(runner));
    } else {
      GM_RETURN_IF_ERROR(BruckSag(runner, stats));
    }
    stats->figures.sag_nonzeros = static_cast<int64_t>(own_.size());
  }
  return TeamAllGather(runner);
}

absl::Status SparDl::SparReduceScatter(StepRunner& runner) {
  const std::vector<Step> steps =
      PlanSparReduceScatter(layout_.team_size(), position_);
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& step = steps[s];
    std::vector<sparse::SparseBlock> bag;
    for (int i = 0; i < step.send.count; ++i) {
      bag.push_back(CutBlock((step.send.first + i) % layout_.team_size(),
                             runner.stats()));
    }
    std::vector<const sparse::SparseBlock*> bag_view;
    for (const sparse::SparseBlock& block : bag) bag_view.push_back(&block);
    GM_ASSIGN_OR_RETURN(
        std::vector<sparse::SparseBlock> received,
        ExchangeInTeam(runner, PhaseStep(kSrsPhase, s), step, bag_view));
    for (const sparse::SparseBlock& block : received) {
      sparse::ScatterAdd(block, absl::MakeSpan(work_));
    }
  }
  return absl::OkStatus();
}

absl::Status SparDl::RecursiveSag(StepRunner& runner) {
  const sparse::IndexRange range = ranges_[position_];
  const std::vector<int> partners = PlanRecursiveDoubling(layout_.teams, team_);
  sparse::SparseBlock dropped;
  for (size_t t = 0; t < partners.size(); ++t) {
    const int peer = layout_.rank_of(partners[t], position_);
    GM_ASSIGN_OR_RETURN(std::string bytes,
                        runner.Exchange(PhaseStep(kSagPhase, t), peer,
                                        codec_.Encode(own_, range), peer));
    auto received = codec_.Decode(bytes, range, runner.stats());
    if (!received.ok()) return PeerError(received.status(), peer);
    const sparse::SparseBlock sum = team_ < partners[t]
                                        ? sparse::Add(own_, *received)
                                        : sparse::Add(*received, own_);
    tensors_.SplitTopK(topk(), sum, quotas_[position_], range, &own_, &dropped);
    // 2^(t+1) workers now hold this identical discard, and round own_ alike.
    const float share = std::ldexp(1.0f, -static_cast<int>(t + 1));
    KeepShare(codec_.Round(&own_, &dropped), share);
    KeepShare(dropped, share);
  }
  return absl::OkStatus();
}

absl::Status SparDl::BruckSag(StepRunner& runner, OpStats* stats) {
  const int d = layout_.teams;
  const sparse::IndexRange range = ranges_[position_];
  const uint64_t h = h_controller_.h();
  std::vector<sparse::SparseBlock> team_blocks(d);
  sparse::SparseBlock dropped;
  tensors_.SplitTopK(topk(), own_, h, range, &team_blocks[team_], &dropped);
  KeepShare(dropped, 1.0f);

  Group teams;
  for (int t = 0; t < d; ++t)
    teams.ranks.push_back(layout_.rank_of(t, position_));
  teams.position = team_;
  GM_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                      AllGather(runner, PhaseStep(kSagPhase), teams,
                                codec_.Encode(team_blocks[team_], range),
                                AllGatherKind::kBruck));
  for (int t = 0; t < d; ++t) {
    if (t == team_) continue;
    auto block = codec_.Decode(gathered[t], range, runner.stats());
    if (!block.ok()) return PeerError(block.status(), teams.ranks[t]);
    team_blocks[t] = *std::move(block);
  }
  const sparse::SparseBlock sum = SumInOrder(std::move(team_blocks));
  tensors_.SplitTopK(topk(), sum, quotas_[position_], range, &own_, &dropped);
  const float share = 1.0f / static_cast<float>(d);
  KeepShare(codec_.Round(&own_, &dropped), share);
  KeepShare(dropped, share);

  stats->figures.bsag_h = static_cast<int64_t>(h);
  stats->figures.bsag_gathered = static_cast<int64_t>(sum.size());
  h_controller_.Update(sum.size());
  return absl::OkStatus();
}

absl::StatusOr<sparse::SparseBlock> SparDl::TeamAllGather(StepRunner& runner) {
  const int p = layout_.team_size();
  std::vector<sparse::SparseBlock> blocks(p);
  blocks[position_] = std::move(own_);
  const std::vector<Step> steps = PlanBruckAllGather(p, position_);
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& step = steps[s];
    std::vector<const sparse::SparseBlock*> outgoing;
    for (int i = 0; i < step.send.count; ++i) {
      outgoing.push_back(&blocks[(step.send.first + i) % p]);
    }
    GM_ASSIGN_OR_RETURN(
        std::vector<sparse::SparseBlock> received,
        ExchangeInTeam(runner, PhaseStep(kGatherPhase, s), step, outgoing));
    for (int i = 0; i < step.recv.count; ++i) {
      blocks[(step.recv.first + i) % p] = std::move(received[i]);
    }
  }
  // Blocks cover increasing ranges, so their concatenation is sorted.
  sparse::SparseBlock result;
  for (const sparse::SparseBlock& block : blocks) {
    result.indices.insert(result.indices.end(), block.indices.begin(),
                          block.indices.end());
    result.values.insert(result.values.end(), block.values.begin(),
                         block.values.end());
  }
  return result;
}

absl::StatusOr<std::vector<sparse::SparseBlock>> SparDl::ExchangeInTeam(
    StepRunner& runner, uint32_t tag_step, const Step& step,
    absl::Span<const sparse::SparseBlock* const> outgoing) {
  const int source = layout_.rank_of(team_, step.recv_from);
  GM_ASSIGN_OR_RETURN(
      std::string bytes,
      runner.Exchange(tag_step, layout_.rank_of(team_, step.send_to),
                      codec_.Encode(outgoing, RunRanges(ranges_, step.send)),
                      source));
  auto received =
      codec_.Decode(bytes, RunRanges(ranges_, step.recv), runner.stats());
  if (!received.ok()) return PeerError(received.status(), source);
  return received;
}

sparse::SparseBlock SparDl::CutBlock(int b, OpStats* stats) {
  const sparse::IndexRange range = ranges_[b];
  const absl::Span<float> block =
      absl::MakeSpan(work_).subspan(range.begin, range.size());
  sparse::SparseBlock kept;
  {
    ScopedTimer timer(&stats->topk_seconds);
    kept = tensors_.TopK(topk(), block, quotas_[b], range.begin);
  }
  for (uint32_t i : kept.indices) work_[i] = 0.0f;
  // What wire rounding takes off, or drops, stays here like any discard.
  sparse::SparseBlock dropped;
  KeepShare(codec_.Round(&kept, &dropped), 1.0f);
  KeepShare(dropped, 1.0f);
  return kept;
}

void SparDl::KeepShare(const sparse::SparseBlock& dropped, float share) {
  for (size_t i = 0; i < dropped.size(); ++i) {
    work_[dropped.indices[i]] += share * dropped.values[i];
  }
}

}  // namespace gradmesh::collectives
