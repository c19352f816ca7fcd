#include "worker/collectives/collective.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/work_meter.h"
#include "worker/kernels/topk.h"

namespace gradmesh::collectives {
namespace {}  // namespace

StepRunner::StepRunner(const OpContext& context, OpStats* stats)
    : context_(context), stats_(stats) {
  GM_CHECK(context_.transport != nullptr);
}

sparse::SparseBlock TimedTopKAbs(const kernels::TopKSelector& topk,
                                 absl::Span<const float> x, uint64_t k,
                                 OpStats* stats) {
  ScopedTimer timer(&stats->topk_seconds);
  return topk.TopKAbs(x, k, 0);
}

void OpFigures::ForEach(
    absl::FunctionRef<void(absl::string_view name, int64_t value)> visit)
    const {
  const std::pair<absl::string_view, const std::optional<int64_t>*> all[] = {
      {"srs_nonzeros", &srs_nonzeros},
      {"sag_nonzeros", &sag_nonzeros},
      {"bsag_h", &bsag_h},
      {"bsag_gathered", &bsag_gathered},
      {"selected", &selected},
      {"local_selected", &local_selected},
      {"global_selected", &global_selected},
      {"thresholds_evaluated", &thresholds_evaluated},
      {"repartitioned", &repartitioned},
      {"balanced", &balanced},
      {"dense_partitions", &dense_partitions},
      {"own_dense", &own_dense}};
  for (const auto& [name, value] : all) {
    if (value->has_value()) visit(name, **value);
  }
}

absl::Status StepRunner::Send(uint32_t step, int send_to,
                              std::vector<std::string> payloads) {
  ++stats_->rounds;
  return SendPayloads(step, send_to, std::move(payloads));
}

absl::StatusOr<std::vector<std::string>> StepRunner::Receive(uint32_t step,
                                                             int recv_from,
                                                             int recv_count) {
  ++stats_->rounds;
  return ReceivePayloads(step, recv_from, recv_count);
}

absl::StatusOr<std::vector<std::string>> StepRunner::Exchange(
    uint32_t step, int send_to, std::vector<std::string> payloads,
    int recv_from, int recv_count) {
  ++stats_->rounds;
  GM_RETURN_IF_ERROR(SendPayloads(step, send_to, std::move(payloads)));
  return ReceivePayloads(step, recv_from, recv_count);
}

absl::Status StepRunner::SendPayloads(uint32_t step, int send_to,
                                      std::vector<std::string> payloads) {
  for (std::string& payload : payloads) {
    GM_RETURN_IF_ERROR(SendPiece(step, send_to, std::move(payload)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> StepRunner::ReceivePayloads(
    uint32_t step, int recv_from, int recv_count) {
  std::vector<std::string> received;
  received.reserve(recv_count);
  for (int i = 0; i < recv_count; ++i) {
    GM_ASSIGN_OR_RETURN(std::string bytes, ReceivePiece(step, recv_from));
    received.push_back(std::move(bytes));
  }
  return received;
}

absl::Status StepRunner::SendPiece(uint32_t step, int send_to,
                                   std::string payload) {
  stats_->bytes_sent += payload.size();
  ++stats_->messages_sent;
  return context_.transport->Send(
      send_to, {context_.epoch, context_.operation, context_.first_step + step},
      std::move(payload));
}

absl::StatusOr<std::string> StepRunner::ReceivePiece(uint32_t step,
                                                     int recv_from) {
  absl::StatusOr<std::string> message;
  {
    ScopedTimer waiting(&stats_->wait_seconds);
    message = context_.transport->Recv(
        recv_from,
        {context_.epoch, context_.operation, context_.first_step + step},
        context_.deadline);
  }
  GM_ASSIGN_OR_RETURN(std::string bytes, std::move(message));
  stats_->bytes_received += bytes.size();
  ++stats_->messages_received;
  return bytes;
}

absl::StatusOr<std::string> StepRunner::Exchange(uint32_t step, int send_to,
                                                 std::string payload,
                                                 int recv_from) {
  std::vector<std::string> payloads;
  payloads.push_back(std::move(payload));
  GM_ASSIGN_OR_RETURN(std::vector<std::string> received,
                      Exchange(step, send_to, std::move(payloads), recv_from,
                               /*recv_count=*/1));
  return std::move(received[0]);
}

absl::Status ValidateCommon(int world_size, int rank, uint64_t n,
                            double density) {
  if (world_size < 1 || world_size > kMaxWorldSize || rank < 0 ||
      rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside a world of ", world_size,
                     " (at most ", kMaxWorldSize, " workers)"));
  }
  if (!(density > 0.0 && density <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("density ", density, " is outside (0, 1]"));
  }
  if (n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient of ", n, " values exceeds uint32 indices"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSizes(absl::string_view algorithm, uint64_t n,
                           absl::Span<const float> gradient,
                           absl::Span<const float> residual) {
  if (gradient.size() != n || residual.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(algorithm, " expects ", n, " values, got a gradient of ",
                     gradient.size(), " and a residual of ", residual.size()));
  }
  return absl::OkStatus();
}

absl::Status PeerError(const absl::Status& status, int peer) {
  return absl::Status(status.code(), absl::StrCat("message from rank ", peer,
                                                  ": ", status.message()));
}

uint64_t AccumulateFinite(absl::Span<const float> gradient,
                          absl::Span<float> residual) {
  GM_CHECK(gradient.size() == residual.size());
  CountAccumulated(gradient.size());
  uint64_t nonfinite = 0;
  for (size_t i = 0; i < residual.size(); ++i) {
    const float v = gradient[i];
    const bool finite = std::isfinite(v);
    residual[i] += finite ? v : 0.0f;
    nonfinite += finite ? 0 : 1;
  }
  return nonfinite;
}

absl::StatusOr<uint64_t> AccumulateChecked(absl::string_view algorithm,
                                           uint64_t n,
                                           absl::Span<const float> gradient,
                                           absl::Span<float> residual,
                                           OpStats* stats) {
  GM_CHECK(stats != nullptr);
  GM_RETURN_IF_ERROR(ValidateSizes(algorithm, n, gradient, residual));
  *stats = OpStats{};
  return AccumulateFinite(gradient, residual);
}

absl::StatusOr<sparse::SparseBlock> Collective::AllReduce(
    absl::Span<const float> gradient, absl::Span<float> residual,
    const OpContext& context, OpStats* stats) {
  GM_RETURN_IF_ERROR(Accumulate(gradient, residual, stats).status());
  GM_ASSIGN_OR_RETURN(Proposal proposal, Reduce(residual, context, stats));
  std::move(proposal.apply)(proposal.result, residual);
  return std::move(proposal.result);
}

void LeaveSelected(const sparse::SparseBlock& sent,
                   const sparse::SparseBlock& loss,
                   absl::Span<float> residual) {
  for (uint32_t i : sent.indices) residual[i] = 0.0f;
  sparse::ScatterAdd(loss, residual);
}

sparse::SparseBlock SumInOrder(std::vector<sparse::SparseBlock> blocks) {
  if (blocks.empty()) return {};
  sparse::SparseBlock sum = std::move(blocks[0]);
  for (size_t i = 1; i < blocks.size(); ++i) sum = sparse::Add(sum, blocks[i]);
  return sum;
}

}  // namespace gradmesh::collectives
