#include "worker/transport/fault_injection.h"

#include <utility>

#include "absl/time/clock.h"

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
  MangleSends(
      [drop = std::move(drop)](int peer, const Tag& tag, std::string payload) {
        std::vector<std::string> out;
        if (!drop(peer, tag, payload)) out.push_back(std::move(payload));
        return out;
      });
}

void FaultInjectingTransport::MangleSends(Mangle mangle) {
  absl::MutexLock lock(&mu_);
  mangles_.push_back(std::move(mangle));
}

void FaultInjectingTransport::DelaySends(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  delay_ = delay;
}

absl::Status FaultInjectingTransport::Send(int peer, const Tag& tag,
                                           std::string payload) {
  std::vector<std::string> out;
  out.push_back(std::move(payload));
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    if (sends_before_crash_.has_value()) {
      if (*sends_before_crash_ == 0) {
        base_->Abort(crash_status_);
        return crash_status_;
      }
      --*sends_before_crash_;
    }
    for (const Mangle& mangle : mangles_) {
      std::vector<std::string> next;
      for (std::string& p : out) {
        for (std::string& m : mangle(peer, tag, std::move(p))) {
          next.push_back(std::move(m));
        }
      }
      out = std::move(next);
    }
    delay = delay_;
  }
  absl::SleepFor(delay);
  for (std::string& p : out) {
    if (absl::Status sent = base_->Send(peer, tag, std::move(p)); !sent.ok()) {
      return sent;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FaultInjectingTransport::Recv(int peer,
                                                          const Tag& tag,
                                                          absl::Time deadline) {
  return base_->Recv(peer, tag, deadline);
}

}  // namespace gradmesh::transport
