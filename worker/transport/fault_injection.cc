#include "worker/transport/fault_injection.h"

namespace gradmesh::transport {

void FaultInjectingTransport::CrashAfterSends(int sends, absl::Status status) {
  absl::MutexLock lock(&mu_);
  sends_before_crash_ = sends;
  crash_status_ = std::move(status);
}

void FaultInjectingTransport::DropSendsTo(int peer) {
  absl::MutexLock lock(&mu_);
  dropped_peers_.insert(peer);
}

absl::Status FaultInjectingTransport::Send(int peer, const Tag& tag,
                                           std::string payload) {
  {
    absl::MutexLock lock(&mu_);
    if (sends_before_crash_.has_value()) {
      if (*sends_before_crash_ == 0) {
        base_->Abort(crash_status_);
        return crash_status_;
      }
      --*sends_before_crash_;
    }
    if (dropped_peers_.contains(peer)) return absl::OkStatus();
  }
  return base_->Send(peer, tag, std::move(payload));
}

absl::StatusOr<std::string> FaultInjectingTransport::Recv(int peer,
                                                          const Tag& tag,
                                                          absl::Time deadline) {
  return base_->Recv(peer, tag, deadline);
}

}  // namespace gradmesh::transport
