#include "worker/collectives/collective.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace gradmesh::collectives {

uint64_t SelectionSize(uint64_t n, double density) {
  if (n == 0) return 0;
  const long long k = std::llround(density * static_cast<double>(n));
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::max(k, 1LL)), 1, n);
}

StepRunner::StepRunner(const OpContext& context, OpStats* stats)
    : context_(context), stats_(stats) {
  GM_CHECK(context_.transport != nullptr);
}

absl::StatusOr<std::vector<std::string>> StepRunner::Exchange(
    uint32_t step, int send_to, std::vector<std::string> payloads,
    int recv_from, int recv_count) {
  const transport::Tag tag{context_.epoch, context_.operation, step};
  ++stats_->rounds;
  for (std::string& payload : payloads) {
    stats_->bytes_sent += payload.size();
    ++stats_->messages_sent;
    GM_RETURN_IF_ERROR(
        context_.transport->Send(send_to, tag, std::move(payload)));
  }
  std::vector<std::string> received;
  received.reserve(recv_count);
  for (int i = 0; i < recv_count; ++i) {
    GM_ASSIGN_OR_RETURN(
        std::string bytes,
        context_.transport->Recv(recv_from, tag, context_.deadline));
    stats_->bytes_received += bytes.size();
    ++stats_->messages_received;
    received.push_back(std::move(bytes));
  }
  return received;
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

}  // namespace gradmesh::collectives
