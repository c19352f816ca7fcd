#include "worker/transport/grpc/peer_service.h"

#include <algorithm>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc/grpc_util.h"
#include "common/status_macros.h"
#include "worker/transport/grpc/frame_codec.h"

namespace gradmesh::transport {

namespace {
// Larger messages than any gradient block set could need are refused.
constexpr uint64_t kMaxMessageBytes = uint64_t{16} << 30;
// Ranks above this are refused at once (a world is far smaller).
constexpr uint32_t kMaxRank = 1 << 20;
// Room reserved for a message when its first frame arrives (untouched until
// data comes), so that assembling it never moves what has arrived; larger
// messages grow past this as their data comes.
constexpr uint64_t kReservedMessageBytes = uint64_t{256} << 20;
grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace

// One incoming stream: reads frames, checks them, reassembles messages.
class PeerService::Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(PeerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    StartRead(&buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    absl::Status accepted =
        DecodeFrame(&buffer_, [this](const FrameHeader& header, uint64_t size) {
          return Place(header, size);
        });
    buffer_.Clear();
    if (accepted.ok()) {
      ++frames_;
      if (received_ == message_bytes_) {
        accepted = service_->Deliver(epoch_, from_, stream_, tag_,
                                     std::move(message_), frames_);
        message_ = std::string();
        frames_ = 0;
      }
    }
    if (accepted.ok()) {
      StartRead(&buffer_);
      return;
    }
    // Over the limits and impostors are counted apart.
    if (!absl::IsResourceExhausted(accepted) &&
        !absl::IsPermissionDenied(accepted)) {
      service_->CountRefused();
    }
    refused_ = accepted;
    Finish(ToGrpcStatus(accepted));
  }

  void OnDone() override {
    if (identified_) {
      const bool clean = refused_.ok() && !context_->IsCancelled();
      absl::Status why =
          !refused_.ok() ? absl::UnavailableError(absl::StrCat(
                               "the stream from peer ", from_,
                               " was refused: ", refused_.message()))
          : clean        ? absl::UnavailableError(
                               absl::StrCat("peer ", from_, " closed its stream"))
                  : absl::UnavailableError(
                        absl::StrCat("the stream from peer ", from_, " broke"));
      service_->StreamEnded(epoch_, from_, stream_, clean, std::move(why));
    }
    delete this;
  }

 private:
  // Checks a frame against the stream and the message being assembled, and
  // says where its data goes.
  absl::StatusOr<std::string*> Place(const FrameHeader& header, uint64_t size) {
    if (!identified_) {
      if (header.from_rank > kMaxRank) {
        return absl::InvalidArgumentError(
            absl::StrCat("a stream claims rank ", header.from_rank));
      }
      const std::shared_ptr<const grpc::AuthContext> auth =
          context_->auth_context();
      std::optional<std::vector<std::string>> names;
      if (auth != nullptr && OverTls(*auth)) {
        names = CertificateNames(*auth);
      }
      GM_ASSIGN_OR_RETURN(stream_,
                          service_->IncomingStreamOpened(
                              header.epoch, static_cast<int>(header.from_rank),
                              names ? &*names : nullptr));
      identified_ = true;
      epoch_ = header.epoch;
      from_ = static_cast<int>(header.from_rank);
    } else if (header.epoch != epoch_ ||
               static_cast<int>(header.from_rank) != from_) {
      return absl::InvalidArgumentError(
          absl::StrCat("a stream of epoch ", epoch_, " from rank ", from_,
                       " carried a frame of epoch ", header.epoch,
                       " from rank ", header.from_rank));
    }
    const Tag tag{header.epoch, header.operation, header.step};
    if (frames_ == 0) {
      if (header.message_bytes > kMaxMessageBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("peer ", from_, " announced a message of ",
                         header.message_bytes, " bytes"));
      }
      tag_ = tag;
      GM_RETURN_IF_ERROR(
          service_->NoteIncoming(epoch_, stream_, tag.operation));
      message_bytes_ = header.message_bytes;
      received_ = 0;
      try {
        message_.reserve(std::min(message_bytes_, kReservedMessageBytes));
      } catch (const std::bad_alloc&) {
        // Not now (memory limits): the message grows as its data comes.
      }
    }
    if (!(tag == tag_) || header.message_bytes != message_bytes_ ||
        header.offset != received_ || size > message_bytes_ - received_) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer ", from_, " sent a frame out of sequence (",
                       ToString(tag), ", offset ", header.offset, ", ", size,
                       " of ", header.message_bytes, " bytes)"));
    }
    // Grows with the data (DecodeFrame passes only sizes really received),
    // so a false length costs no more than untouched reserved pages.
    received_ += size;
    return &message_;
  }

  PeerService* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer buffer_;
  bool identified_ = false;
  uint64_t stream_ = 0;  // its number (IncomingStreamOpened)
  uint64_t epoch_ = 0;
  int from_ = -1;
  absl::Status refused_;
  // The message being assembled.
  Tag tag_;
  uint64_t message_bytes_ = 0;
  uint64_t received_ = 0;
  uint64_t frames_ = 0;
  std::string message_;
};

grpc::ServerGenericBidiReactor* PeerService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  if (context->method() != kExchangeMethod) {
    class Unimplemented final : public grpc::ServerGenericBidiReactor {
     public:
      Unimplemented() {
        Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, ""));
      }
      void OnDone() override { delete this; }
    };
    return new Unimplemented;
  }
  return new Reactor(this, context);
}

PeerService::EpochState& PeerService::StateLocked(uint64_t epoch) {
  return epochs_[epoch];
}

void PeerService::OpenEpoch(uint64_t epoch, int rank,
                            std::vector<std::string> peers) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  max_opened_ = std::max(max_opened_, epoch);
  state.open = true;
  state.rank = rank;
  state.peers = std::move(peers);
  unopened_bytes_ -= state.unopened_bytes;
  state.unopened_bytes = 0;
  VerifyHeldLocked(epoch, state);
  // Epochs below that were never opened never will be.
  for (auto& [e, other] : epochs_) {
    if (e < epoch && !other.open && !other.closed) CloseLocked(e, other);
  }
}

void PeerService::CloseEpoch(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  CloseLocked(epoch, StateLocked(epoch));
  // Below the oldest epoch still open, nothing will be received again.
  uint64_t oldest = max_opened_ + 1;
  for (const auto& [e, state] : epochs_) {
    if (state.open) oldest = std::min(oldest, e);
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
  return it != epochs_.end() && it->second.closed;
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
    return number;
  }
  const uint64_t number = state.next_number++;
  state.newest_in[from] = number;
  return number;
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
    stats_.frames_dropped_retired_operation += frames;
    return absl::OkStatus();
  }
  if (!state.open) {
    const uint64_t cost = message.size() + kMessageOverheadBytes;
    if (cost > kMaxUnopenedBytes - unopened_bytes_) {
      ++stats_.streams_refused_unopened_bytes;
      return absl::ResourceExhaustedError(
          absl::StrCat("over ", kMaxUnopenedBytes,
                       " bytes held for epochs not started "
                       "here; refused a message of epoch ",
                       epoch));
    }
    state.unopened_bytes += cost;
    unopened_bytes_ += cost;
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

void PeerService::StreamEnded(uint64_t epoch, int from, uint64_t stream,
                              bool clean, absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  EpochState& state = StateLocked(epoch);
  if (state.refused_streams.erase(stream) > 0) return;  // spoke for no one
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

void PeerService::CountRefused() {
  absl::MutexLock lock(&mu_);
  ++stats_.streams_refused;
}

absl::Status PeerService::NoteIncoming(uint64_t epoch, uint64_t stream,
                                       uint64_t operation) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return absl::OkStatus();
  EpochState& state = StateLocked(epoch);
  if (auto refused = state.refused_streams.find(stream);
      refused != state.refused_streams.end()) {
    return refused->second;
  }
  if (!state.unverified.contains(stream)) {
    NoteOperationLocked(state, operation);
  }
  return absl::OkStatus();
}

void PeerService::NoteOperation(uint64_t epoch, uint64_t operation) {
  absl::MutexLock lock(&mu_);
  if (RetiredLocked(epoch)) return;
  NoteOperationLocked(StateLocked(epoch), operation);
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

absl::StatusOr<std::string> PeerService::Receive(uint64_t epoch, int from,
                                                 const Tag& tag,
                                                 absl::Time deadline) {
  const MessageKey key{from, tag};
  absl::MutexLock lock(&mu_);
  if (epoch >= min_epoch_)
    NoteOperationLocked(StateLocked(epoch), tag.operation);
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
      return absl::UnavailableError(
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

PeerService::Stats PeerService::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace gradmesh::transport
