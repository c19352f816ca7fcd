// PeerService, what one peer may hold: its streams, its messages in
// assembly, and its messages of operations not started here.
#include <deque>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/steady_clock.h"
#include "worker/transport/grpc/peer_service.h"

namespace gradmesh::transport {

absl::Status PeerService::ChargeLocked(uint64_t epoch, EpochState& state,
                                       int from, uint64_t stream,
                                       uint64_t bytes) {
  const uint64_t cost = bytes + kMessageOverheadBytes;
  if (!state.open) {
    if (cost > kMaxUnopenedBytes - unopened_bytes_) {
      ++stats_.streams_refused_unopened_bytes;
      return absl::ResourceExhaustedError(absl::StrCat(
          "over ", kMaxUnopenedBytes,
          " bytes held for epochs not started here; refused a message of ",
          bytes, " bytes of epoch ", epoch));
    }
    state.unopened_bytes += cost;
    unopened_bytes_ += cost;
    state.assembling[stream] = {.from = from, .bytes = cost, .unopened = true};
    return absl::OkStatus();
  }
  Held& held = state.held[from];
  // held.bytes may pass the budget by messages that were assembling when
  // their epoch opened.
  auto fits = [&] {
    return held.bytes <= max_held_bytes_per_peer_ &&
           cost <= max_held_bytes_per_peer_ - held.bytes;
  };
  while (!fits() && DropOldestUnclaimedLocked(epoch, state, from)) {
  }
  if (!fits()) {
    ++stats_.streams_refused_peer_budget;
    return absl::ResourceExhaustedError(absl::StrCat(
        "peer ", from, " announced a message of ", bytes, " bytes with ",
        held.bytes, " held already; a peer may hold ", max_held_bytes_per_peer_,
        " bytes here"));
  }
  held.bytes += cost;
  state.assembling[stream] = {.from = from, .bytes = cost};
  return absl::OkStatus();
}

void PeerService::ReleaseLocked(EpochState& state, uint64_t stream) {
  auto it = state.assembling.find(stream);
  if (it == state.assembling.end()) return;
  const Assembling& a = it->second;
  if (a.unopened) {
    state.unopened_bytes -= a.bytes;
    unopened_bytes_ -= a.bytes;
  } else {
    state.held[a.from].bytes -= a.bytes;
  }
  state.assembling.erase(it);
}

void PeerService::HoldUnclaimedLocked(EpochState& state, int from,
                                      uint64_t operation, uint64_t bytes) {
  if (state.claimed.contains(operation)) return;
  Held& held = state.held[from];
  auto [charged, fresh] = state.unclaimed[operation].try_emplace(from, 0);
  if (!state.unclaimed_since.contains(operation)) {
    state.unclaimed_since.emplace(operation, SteadyNow());
  }
  if (fresh) {
    held.unclaimed_order.push_back(operation);
    ++held.live;
    TrimOrderLocked(state, from, held);
  }
  // Over the budget only by what ChargeLocked let in while it assembled.
  const uint64_t cost = bytes + kMessageOverheadBytes;
  charged->second += cost;
  held.bytes += cost;
}

std::optional<absl::Time> PeerService::UnclaimedSince(
    uint64_t epoch, uint64_t operation) const {
  absl::MutexLock lock(&mu_);
  auto state = epochs_.find(epoch);
  if (state == epochs_.end()) return std::nullopt;
  auto since = state->second.unclaimed_since.find(operation);
  if (since == state->second.unclaimed_since.end()) return std::nullopt;
  return since->second;
}

void PeerService::ClaimLocked(EpochState& state, uint64_t operation) {
  if (state.retired.contains(operation)) return;
  state.claimed.insert(operation);
  auto it = state.unclaimed.find(operation);
  if (it == state.unclaimed.end()) return;
  const absl::flat_hash_map<int, uint64_t> senders = std::move(it->second);
  state.unclaimed.erase(it);
  state.unclaimed_since.erase(operation);
  for (const auto& [from, bytes] : senders) {
    Held& held = state.held[from];
    held.bytes -= bytes;
    --held.live;
    TrimOrderLocked(state, from, held);
  }
}

void PeerService::TrimOrderLocked(EpochState& state, int from, Held& held) {
  auto stale = [&](uint64_t operation) {
    auto it = state.unclaimed.find(operation);
    return it == state.unclaimed.end() || !it->second.contains(from);
  };
  std::deque<uint64_t>& order = held.unclaimed_order;
  while (!order.empty() && stale(order.front())) order.pop_front();
  if (order.size() > 2 * held.live + 64) std::erase_if(order, stale);
}

bool PeerService::DropOldestUnclaimedLocked(uint64_t epoch, EpochState& state,
                                            int from) {
  std::deque<uint64_t>& order = state.held[from].unclaimed_order;
  while (!order.empty()) {
    const uint64_t operation = order.front();
    order.pop_front();
    auto it = state.unclaimed.find(operation);
    if (it == state.unclaimed.end()) continue;
    auto sender = it->second.find(from);
    if (sender == it->second.end()) continue;
    state.held[from].bytes -= sender->second;
    --state.held[from].live;
    it->second.erase(sender);
    if (it->second.empty()) {
      state.unclaimed.erase(it);
      state.unclaimed_since.erase(operation);
    }
    absl::erase_if(mailboxes_, [&](const auto& m) {
      const bool dropped = m.first.from == from && m.first.tag.epoch == epoch &&
                           m.first.tag.operation == operation;
      if (dropped) stats_.messages_dropped_unclaimed += m.second.size();
      return dropped;
    });
    state.broken[operation].insert_or_assign(
        from, absl::ResourceExhaustedError(absl::StrCat(
                  "peer ", from,
                  "'s messages of an operation not started "
                  "here were dropped: over the ",
                  max_held_bytes_per_peer_, " bytes a peer may hold")));
    return true;
  }
  return false;
}

void PeerService::MoveAssemblingToBudgetsLocked(EpochState& state) {
  for (auto& [stream, a] : state.assembling) {
    if (!a.unopened) continue;
    // Its unopened charge went with the epoch's; the budget takes it on.
    a.unopened = false;
    state.held[a.from].bytes += a.bytes;
  }
}

}  // namespace gradmesh::transport
