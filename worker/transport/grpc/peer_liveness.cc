// PeerService, which operations a broken or closed stream fails: the
// operations in flight, the streams' numbers, breaks and aborts.
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/transport/grpc/peer_service.h"

namespace gradmesh::transport {

void PeerService::StreamEnded(uint64_t epoch, int from, uint64_t stream,
                              bool clean, absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  ReleaseLocked(state, stream);
  // Spoke for no one: its place went at its refusal.
  if (state.refused_streams.erase(stream) > 0) return;
  if (auto held = state.held.find(from); held != state.held.end()) {
    Held& h = held->second;
    --h.streams;
    if (h.streams == 0 && h.bytes == 0) state.held.erase(held);
  }
  if (auto held = state.unverified.find(stream);
      held != state.unverified.end()) {
    if (!held->second.messages.empty()) {
      held->second.ended.emplace(clean, std::move(why));
      return;
    }
    // Nothing to hand over: forget it (a stream that carried nothing says
    // nothing worth keeping until the epoch opens).
    state.unopened_bytes -= held->second.charge;
    unopened_bytes_ -= held->second.charge;
    --state.unverified_per_rank[held->second.from];
    state.unverified.erase(held);
    return;
  }
  if (clean) {
    state.gone.try_emplace(from, std::move(why));
    return;
  }
  BreakLocked(state, from, stream, state.newest_in[from], why);
}

absl::StatusOr<bool> PeerService::NoteIncoming(uint64_t epoch, int from,
                                               uint64_t stream,
                                               uint64_t operation,
                                               uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return false;
  EpochState& state = StateLocked(epoch);
  if (auto refused = state.refused_streams.find(stream);
      refused != state.refused_streams.end()) {
    return refused->second;
  }
  if (state.retired.contains(operation)) return false;
  GM_RETURN_IF_ERROR(ChargeLocked(epoch, state, from, stream, bytes));
  if (!state.unverified.contains(stream)) {
    NoteOperationLocked(state, operation);
  }
  return true;
}

void PeerService::Discarded(uint64_t epoch, uint64_t frames) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) {
    stats_.frames_dropped_old_epoch += frames;
  } else {
    stats_.frames_dropped_retired_operation += frames;
  }
}

void PeerService::NoteOperation(uint64_t epoch, uint64_t operation) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  NoteOperationLocked(state, operation);
  ClaimLocked(state, operation);
}

void PeerService::NoteOperationLocked(EpochState& state, uint64_t operation) {
  if (state.retired.contains(operation) ||
      !state.active.try_emplace(operation, state.next_number).second) {
    return;
  }
  ++state.next_number;
  state.active_order.push_back(operation);
  if (state.active_order.size() > kRetiredOperationsKept) {
    state.active.erase(state.active_order.front());
    state.broken.erase(state.active_order.front());
    state.active_order.pop_front();
  }
}

uint64_t PeerService::OutgoingStreamOpened(uint64_t epoch, int peer) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return 0;
  EpochState& state = StateLocked(epoch);
  const uint64_t number = state.next_number++;
  state.newest_out[peer] = number;
  return number;
}

void PeerService::PeerBroke(uint64_t epoch, int peer, uint64_t stream,
                            const absl::Status& status) {
  GM_CHECK(!status.ok());
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  BreakLocked(state, peer, stream, state.newest_out[peer], status);
}

void PeerService::BreakLocked(EpochState& state, int peer, uint64_t stream,
                              uint64_t newest, const absl::Status& status) {
  // A newer stream replaced this one: operations noted since use that one.
  const uint64_t before =
      newest > stream ? newest : std::numeric_limits<uint64_t>::max();
  for (const auto& [operation, noted] : state.active) {
    if (noted < before) state.broken[operation].try_emplace(peer, status);
  }
}

void PeerService::AbortEpoch(uint64_t epoch, const absl::Status& status) {
  GM_CHECK(!status.ok());
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  if (state.aborted.ok()) state.aborted = status;
}

}  // namespace gradmesh::transport
