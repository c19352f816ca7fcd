// PeerService, who may speak: opening an epoch, the identity of incoming
// streams, and the limits on what epochs not opened yet may hold.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc/grpc_util.h"
#include "common/status_macros.h"
#include "worker/transport/grpc/peer_service.h"

namespace gradmesh::transport {

absl::Status PeerService::OpenEpoch(uint64_t epoch, int rank,
                                    std::vector<std::string> peers) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " is retired here (the newest opened is ",
                     max_opened_, ")"));
  }
  EpochState& state = StateLocked(epoch);
  max_opened_ = std::max(max_opened_, epoch);
  state.open = true;
  ++state.transports;
  state.rank = rank;
  state.peers = std::move(peers);
  unopened_bytes_ -= state.unopened_bytes;
  state.unopened_bytes = 0;
  MoveAssemblingToBudgetsLocked(state);
  VerifyHeldLocked(epoch, state);
  // Epochs below that were never opened never will be.
  for (auto& [e, other] : epochs_) {
    if (e < epoch && !other.open && !other.closed) CloseLocked(e, other);
  }
  return absl::OkStatus();
}

absl::Status PeerService::CheckSenderLocked(
    EpochState& state, int from, const std::vector<std::string>* names) {
  if (from >= static_cast<int>(state.peers.size()) || from == state.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stream claims rank ", from, ", not a peer of rank ",
                     state.rank, " in a group of ", state.peers.size()));
  }
  if (names == nullptr || NamesHost(*names, state.peers[from])) {
    return absl::OkStatus();
  }
  ++stats_.streams_refused_identity;
  return absl::PermissionDeniedError(absl::StrCat(
      "a stream claims rank ", from, " (", state.peers[from],
      "), but its certificate names [", absl::StrJoin(*names, ", "), "]"));
}

void PeerService::VerifyHeldLocked(uint64_t epoch, EpochState& state) {
  std::vector<uint64_t> passed;  // oldest stream first
  for (auto& [number, held] : state.unverified) {
    const absl::Status allowed =
        CheckSenderLocked(state, held.from, &held.names);
    if (allowed.ok()) {
      passed.push_back(number);
      uint64_t& newest = state.newest_in[held.from];
      newest = std::max(newest, number);
    } else {
      if (held.ended.has_value()) {
        // Counted here: no later frame of it will be.
        if (!absl::IsPermissionDenied(allowed)) ++stats_.streams_refused;
      } else {
        state.refused_streams[number] = allowed;
        // Its place among the rank's streams goes now, so that a silent
        // impostor does not lock the rank out; the charge of a message it
        // is still sending goes when its stream ends.
        --state.held[held.from].streams;
      }
    }
  }
  std::sort(passed.begin(), passed.end());
  for (uint64_t number : passed) {
    Unverified& held = state.unverified[number];
    for (auto& [tag, message] : held.messages) {
      if (state.retired.contains(tag.operation)) continue;
      NoteOperationLocked(state, tag.operation);
      mailboxes_[MessageKey{held.from, tag}].push_back(std::move(message));
    }
    if (held.ended.has_value()) {
      auto& [clean, why] = *held.ended;
      if (clean) {
        state.gone.try_emplace(held.from, std::move(why));
      } else {
        BreakLocked(state, held.from, number, state.newest_in[held.from], why);
      }
    }
  }
  state.unverified.clear();
  state.unverified_per_rank.clear();
}

absl::StatusOr<uint64_t> PeerService::IncomingStreamOpened(
    uint64_t epoch, int from, const std::vector<std::string>* names) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return 0;  // its frames are dropped
  if (!epochs_.contains(epoch)) {
    const size_t holding =
        std::count_if(epochs_.begin(), epochs_.end(), [](const auto& e) {
          return !e.second.open && e.second.unopened_bytes > 0;
        });
    if (holding >= kMaxUnopenedEpochs ||
        (max_opened_ > 0 && epoch > max_opened_ + kMaxEpochsAhead)) {
      ++stats_.streams_refused_unopened_epochs;
      return absl::ResourceExhaustedError(absl::StrCat(
          "refused a stream of epoch ", epoch, ": ", holding,
          " epochs not started here hold frames, the newest started is ",
          max_opened_));
    }
  }
  EpochState& state = StateLocked(epoch);
  if (state.open) {
    GM_RETURN_IF_ERROR(CheckSenderLocked(state, from, names));
  }
  Held& held = state.held[from];
  if (held.streams >= kMaxStreamsPerRank) {
    ++stats_.streams_refused_peer_budget;
    return absl::ResourceExhaustedError(
        absl::StrCat("refused a stream of epoch ", epoch, " from rank ", from,
                     ": ", held.streams, " of its streams run already"));
  }
  if (!state.open && names != nullptr) {
    // Held until the epoch opens: its names count against what epochs not
    // started may hold, and a rank may have only so many such streams.
    uint64_t charge = kMessageOverheadBytes;
    for (const std::string& name : *names) charge += name.size();
    if (state.unverified_per_rank[from] >= kMaxHeldStreamsPerRank ||
        charge > kMaxUnopenedBytes - unopened_bytes_) {
      ++stats_.streams_refused_unopened_bytes;
      return absl::ResourceExhaustedError(
          absl::StrCat("refused a stream of epoch ", epoch, " claiming rank ",
                       from, ": too much is held for epochs not started here"));
    }
    state.unopened_bytes += charge;
    unopened_bytes_ += charge;
    ++state.unverified_per_rank[from];
    const uint64_t number = state.next_number++;
    state.unverified[number] =
        Unverified{.from = from, .names = *names, .charge = charge};
    ++held.streams;
    return number;
  }
  const uint64_t number = state.next_number++;
  state.newest_in[from] = number;
  ++held.streams;
  return number;
}

}  // namespace gradmesh::transport
