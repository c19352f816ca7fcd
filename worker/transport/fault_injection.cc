#include "worker/transport/fault_injection.h"

namespace gradmesh::transport {

void FaultInjectingTransport::CrashAfterSends(int sends, absl::Status status) {
  absl::MutexLock lock(&mu_);
  sends_before_crash_ = sends;
  crash_status_ = std::move(status);
}

void FaultInjectingTransport::DropSendsTo(int peer) {
  DropSendsIf(
      [peer](int to, const Tag&, absl::string_view) { return to == peer; });
}

void FaultInjectingTransport::DropSendsIf(DropIf drop) {
  absl::MutexLock lock(&mu_);
  drops_.push_back(std::move(drop));
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
    for (const DropIf& drop : drops_) {
      if (drop(peer, tag, payload)) return absl::OkStatus();
    }
  }
  return base_->Send(peer, tag, std::move(payload));
}

absl::StatusOr<std::string> FaultInjectingTransport::Recv(int peer,
                                                          const Tag& tag,
                                                          absl::Time deadline) {
  return base_->Recv(peer, tag, deadline);
}

}  // namespace gradmesh::transport
