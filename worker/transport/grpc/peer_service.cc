// PeerService, the mailboxes: delivery, Receive, and what ends them (an
// operation retired, an epoch closed).
#include "worker/transport/grpc/peer_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradmesh::transport {

PeerService::EpochState& PeerService::StateLocked(uint64_t epoch) {
  return epochs_[epoch];
}

absl::Status PeerService::Deliver(uint64_t epoch, int from, uint64_t stream,
                                  const Tag& tag, std::string message,
                                  uint64_t frames) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) {
    stats_.frames_dropped_old_epoch += frames;
    return absl::OkStatus();
  }
  EpochState& state = StateLocked(epoch);
  if (auto refused = state.refused_streams.find(stream);
      refused != state.refused_streams.end()) {
    return refused->second;
  }
  if (state.retired.contains(tag.operation)) {
    ReleaseLocked(state, stream);
    stats_.frames_dropped_retired_operation += frames;
    return absl::OkStatus();
  }
  if (state.open) {
    ReleaseLocked(state, stream);
    HoldUnclaimedLocked(state, from, tag.operation, message.size());
  } else {
    // The charge taken at its first frame stays with the message.
    state.assembling.erase(stream);
  }
  ++stats_.messages_delivered;
  if (auto held = state.unverified.find(stream);
      held != state.unverified.end()) {
    // Its operation is noted once the sender is known (VerifyHeldLocked).
    held->second.messages.emplace_back(tag, std::move(message));
    return absl::OkStatus();
  }
  NoteOperationLocked(state, tag.operation);
  mailboxes_[MessageKey{from, tag}].push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<std::string> PeerService::Receive(uint64_t epoch, int from,
                                                 const Tag& tag,
                                                 absl::Time deadline) {
  const MessageKey key{from, tag};
  absl::MutexLock lock(&mu_);
  if (!RetiredLocked(epoch)) {
    EpochState& state = StateLocked(epoch);
    NoteOperationLocked(state, tag.operation);
    ClaimLocked(state, tag.operation);
  }
  // Why `from` can't send this message any more, or null.
  auto failed = [&]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> const absl::Status* {
    const EpochState& state = StateLocked(epoch);
    if (auto gone = state.gone.find(from); gone != state.gone.end()) {
      return &gone->second;
    }
    auto broken = state.broken.find(tag.operation);
    if (broken == state.broken.end()) return nullptr;
    auto why = broken->second.find(from);
    return why == broken->second.end() ? nullptr : &why->second;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (RetiredLocked(epoch)) return true;
    if (!StateLocked(epoch).aborted.ok() || failed() != nullptr) return true;
    auto it = mailboxes_.find(key);
    return it != mailboxes_.end() && !it->second.empty();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (RetiredLocked(epoch)) {
    return absl::AbortedError(absl::StrCat("epoch ", epoch,
                                           " was retired while waiting for ",
                                           ToString(tag), " from peer ", from));
  }
  EpochState& state = StateLocked(epoch);
  GM_RETURN_IF_ERROR(state.aborted);
  auto it = mailboxes_.find(key);
  if (it == mailboxes_.end() || it->second.empty()) {
    if (const absl::Status* why = failed(); why != nullptr) {
      // Dropped for the budget stays ResourceExhausted; a break Unavailable.
      return absl::Status(
          absl::IsResourceExhausted(*why) ? absl::StatusCode::kResourceExhausted
                                          : absl::StatusCode::kUnavailable,
          absl::StrCat(why->message(), " while waiting for ", ToString(tag)));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("no message from peer ", from, " for ", ToString(tag),
                     " before the deadline"));
  }
  std::string message = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) mailboxes_.erase(it);
  if (!state.open) {  // not through a transport, but keep the count right
    state.unopened_bytes -= message.size() + kMessageOverheadBytes;
    unopened_bytes_ -= message.size() + kMessageOverheadBytes;
  }
  return message;
}

void PeerService::CloseEpoch(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  if (--state.transports > 0) return;
  CloseLocked(epoch, state);
  // Below the oldest epoch still open, nothing will be received again.
  uint64_t oldest = max_opened_ + 1;
  for (const auto& [e, other] : epochs_) {
    if (other.open) oldest = std::min(oldest, e);
  }
  RetireEpochsBelowLocked(oldest);
}

void PeerService::CloseLocked(uint64_t epoch, EpochState& state) {
  unopened_bytes_ -= state.unopened_bytes;
  state = EpochState{.closed = true};
  absl::erase_if(mailboxes_,
                 [&](const auto& m) { return m.first.tag.epoch == epoch; });
}

bool PeerService::RetiredLocked(uint64_t epoch) const {
  if (epoch < min_epoch_) return true;
  auto it = epochs_.find(epoch);
  if (it != epochs_.end()) return it->second.closed;
  // Below the newest opened and never opened: it never will be.
  return epoch < max_opened_;
}

void PeerService::RetireEpochsBelowLocked(uint64_t epoch) {
  if (epoch <= min_epoch_) return;
  min_epoch_ = epoch;
  absl::erase_if(epochs_, [&](const auto& e) {
    if (e.first >= epoch) return false;
    unopened_bytes_ -= e.second.unopened_bytes;
    return true;
  });
  absl::erase_if(mailboxes_,
                 [&](const auto& m) { return m.first.tag.epoch < epoch; });
}

void PeerService::RetireOperation(uint64_t epoch, uint64_t operation) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  if (state.active.erase(operation) > 0) {
    // Usually among the newest.
    auto it = std::find(state.active_order.rbegin(), state.active_order.rend(),
                        operation);
    state.active_order.erase(std::next(it).base());
  }
  state.broken.erase(operation);
  ClaimLocked(state, operation);  // releases what it held
  state.claimed.erase(operation);
  if (!state.retired.insert(operation).second) return;
  state.retired_order.push_back(operation);
  if (state.retired_order.size() > kRetiredOperationsKept) {
    state.retired.erase(state.retired_order.front());
    state.retired_order.pop_front();
  }
  absl::erase_if(mailboxes_, [&](const auto& m) {
    return m.first.tag.epoch == epoch && m.first.tag.operation == operation;
  });
}

void PeerService::CountRefused() {
  absl::MutexLock lock(&mu_);
  ++stats_.streams_refused;
}

PeerService::Stats PeerService::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace gradmesh::transport
