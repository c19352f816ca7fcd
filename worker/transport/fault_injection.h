// FaultInjectingTransport: wraps a Transport and misbehaves on request, so
// that tests can show that faults end in a clear error, never a hang.
//
//   FaultInjectingTransport faulty(net.endpoint(2));
//   faulty.CrashAfterSends(3, absl::UnavailableError("killed"));
//
// The wrapper does not own `base`. Thread-safe.
#ifndef GRADMESH_WORKER_TRANSPORT_FAULT_INJECTION_H_
#define GRADMESH_WORKER_TRANSPORT_FAULT_INJECTION_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/transport.h"

namespace gradmesh::transport {

class FaultInjectingTransport : public Transport {
 public:
  explicit FaultInjectingTransport(Transport* base) : base_(base) {}

  // After `sends` further successful sends, the endpoint crashes: the base is
  // aborted with `status` (peers see Unavailable) and every later call fails.
  void CrashAfterSends(int sends, absl::Status status);

  // Silently drops every later message to `peer`; the peer then waits until
  // its deadline.
  void DropSendsTo(int peer);

  // Silently drops every later message for which `drop` returns true.
  using DropIf =
      std::function<bool(int peer, const Tag& tag, absl::string_view payload)>;
  void DropSendsIf(DropIf drop);

  // Sends, in place of every later message, what `mangle` returns: nothing
  // (dropped), two copies (duplicated), other bytes (truncated, corrupted).
  // Mangles apply in the order they were added, under the wrapper's lock:
  // they must not call the transport.
  using Mangle = std::function<std::vector<std::string>(
      int peer, const Tag& tag, std::string payload)>;
  void MangleSends(Mangle mangle);

  // Waits `delay` before every later send (a slow link; Send blocks).
  void DelaySends(absl::Duration delay);

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  absl::Status Send(int peer, const Tag& tag, std::string payload) override;
  absl::StatusOr<std::string> Recv(int peer, const Tag& tag,
                                   absl::Time deadline) override;
  void Abort(const absl::Status& status) override { base_->Abort(status); }
  void EndOperation(uint64_t epoch, uint64_t operation) override {
    base_->EndOperation(epoch, operation);
  }
  std::optional<absl::Time> UnclaimedSince(uint64_t epoch,
                                           uint64_t operation) const override {
    return base_->UnclaimedSince(epoch, operation);
  }
  std::vector<int> StalledPeers(absl::Duration timeout,
                                absl::Time now) const override {
    return base_->StalledPeers(timeout, now);
  }
  Counters counters() const override { return base_->counters(); }

 private:
  Transport* const base_;
  absl::Mutex mu_;
  std::optional<int> sends_before_crash_ ABSL_GUARDED_BY(mu_);
  absl::Status crash_status_ ABSL_GUARDED_BY(mu_);
  std::vector<Mangle> mangles_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_FAULT_INJECTION_H_
