#include "worker/transport/grpc/grpc_transport.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/steady_clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "worker/transport/grpc/frame_codec.h"

namespace gradmesh::transport {

// The outgoing stream to one peer. Invariant: a write is in flight exactly
// when queue_ is non-empty and the stream is not broken; its frame is
// queue_.front(). The transport owns its streams and destroys them after
// done_ is set, on its own thread: a stream may hold the last reference to
// its channel, and releasing that on a gRPC callback thread tears down the
// completion queue that thread is still polling (a crash in gRPC).
class GrpcTransport::Stream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static std::shared_ptr<Stream> Open(std::shared_ptr<grpc::Channel> channel,
                                      PeerService* service, uint64_t epoch,
                                      int peer) {
    std::shared_ptr<Stream> stream(
        new Stream(std::move(channel), service, epoch, peer));
    stream->context_.AddMetadata(kAcknowledgeKey, "1");
    stream->stub_->PrepareBidiStreamingCall(&stream->context_, kExchangeMethod,
                                            grpc::StubOptions(), stream.get());
    stream->StartRead(&stream->signal_);
    stream->AddHold();  // writes start outside reactions
    stream->StartCall();
    return stream;
  }

  absl::Status Enqueue(std::vector<grpc::ByteBuffer> frames) {
    grpc::ByteBuffer* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      GM_RETURN_IF_ERROR(broken_);
      if (closing_ || hold_released_) {
        return absl::UnavailableError(
            absl::StrCat("the stream to peer ", peer_, " is closed"));
      }
      const bool idle = queue_.empty();
      sent_ += frames.size();
      for (grpc::ByteBuffer& frame : frames) queue_.push_back(std::move(frame));
      unacknowledged_.push_back({.frames_end = sent_, .queued = SteadyNow()});
      // Bounded whatever the receiver does: the oldest time stays.
      if (unacknowledged_.size() > kSendsTracked) {
        const absl::Time oldest = unacknowledged_.front().queued;
        unacknowledged_.pop_front();
        unacknowledged_.front().queued = oldest;
      }
      if (idle) {
        first = &queue_.front();
        // Keeps the call alive until StartWrite, whatever Cancel does
        // meanwhile (the main hold is still held here).
        AddHold();
      }
    }
    if (first != nullptr) {
      StartWrite(first);
      RemoveHold();
    }
    return absl::OkStatus();
  }

  // Ends the stream once the queue has drained.
  void Close() {
    bool writes_done = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (hold_released_) return;
      closing_ = true;
      if (!broken_.ok()) {
        release = true;
      } else if (queue_.empty() && !writes_done_) {
        writes_done = writes_done_ = true;
      }
    }
    if (writes_done) StartWritesDone();
    if (writes_done || release) ReleaseHold();
  }

  void Cancel() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      if (broken_.ok()) {
        broken_ = absl::UnavailableError(
            absl::StrCat("the stream to peer ", peer_, " was cancelled"));
        broken_at_ = SteadyNow();
      }
    }
    context_.TryCancel();
    ReleaseHold();
  }

  // Since when frames have waited with no progress: since the oldest frame
  // the receiver has not acknowledged was queued, or the last
  // acknowledgement came, whichever is later (a write completes once gRPC
  // has the bytes, delivered or not). nullopt when every frame is
  // acknowledged, the stream is broken, or its receiver said it does not
  // acknowledge.
  std::optional<absl::Time> WaitingSince() {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok() || !acknowledging_ || unacknowledged_.empty()) {
      return std::nullopt;
    }
    return std::max(acknowledged_at_, unacknowledged_.front().queued);
  }

  // Whether the receiver answered (sent its initial metadata).
  bool Answered() {
    absl::MutexLock lock(&mu_);
    return answered_;
  }

  // When the stream was opened and when it broke, if it broke before the
  // receiver answered: a refused connection.
  std::optional<Refusals> Refused() {
    absl::MutexLock lock(&mu_);
    if (broken_.ok() || answered_) return std::nullopt;
    return Refusals{.first = opened_, .last = broken_at_, .count = 1};
  }

  // Whether messages can still be queued (not broken, closing or closed).
  bool open() {
    absl::MutexLock lock(&mu_);
    return broken_.ok() && !closing_ && !hold_released_;
  }

  int peer() const { return peer_; }

  // Its late callbacks no longer reach the service (which may be gone).
  void Detach() {
    absl::MutexLock lock(&mu_);
    detached_ = true;
  }

  bool WaitDone(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
    return done_;
  }

  void OnWriteDone(bool ok) override {
    grpc::ByteBuffer* next = nullptr;
    bool writes_done = false;
    bool release = false;
    absl::Status broken;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        if (broken_.ok()) {
          broken_ = absl::UnavailableError(
              absl::StrCat("the stream to peer ", peer_, " broke"));
          broken_at_ = SteadyNow();
        }
        if (!detached_) broken = broken_;
        queue_.clear();
        unacknowledged_.clear();
        release = closing_;  // Close is waiting for the queue to drain
      } else {
        queue_.pop_front();
        if (!queue_.empty()) {
          next = &queue_.front();
        } else if (closing_ && !writes_done_) {
          writes_done = writes_done_ = true;
        }
      }
    }
    if (!broken.ok()) service_->PeerBroke(epoch_, peer_, number_, broken);
    if (release) ReleaseHold();
    if (next != nullptr) StartWrite(next);
    if (writes_done) {
      StartWritesDone();
      ReleaseHold();
    }
  }

  // A receiver whose answer does not say it acknowledges is not watched.
  // An older worker sends no answer until the stream ends, so until then
  // it is watched as one that acknowledges, and named once frames wait.
  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok) return;
    const bool acknowledging =
        context_.GetServerInitialMetadata().contains(kAcknowledgeKey);
    absl::MutexLock lock(&mu_);
    acknowledging_ = acknowledging;
    answered_ = true;
  }

  // The receiver sends acknowledgements; a finished read means the stream
  // ended, which before Close is the peer going away.
  void OnReadDone(bool ok) override {
    if (ok) {
      Acknowledged(DecodeSignal(signal_));
      StartRead(&signal_);
      return;
    }
    absl::Status broken;
    {
      absl::MutexLock lock(&mu_);
      if (!closing_ && broken_.ok()) {
        broken_ = absl::UnavailableError(
            absl::StrCat("peer ", peer_, " ended the stream"));
        broken_at_ = SteadyNow();
        broken = broken_;
      }
    }
    if (!broken.ok()) service_->PeerBroke(epoch_, peer_, number_, broken);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status broken;
    {
      absl::MutexLock lock(&mu_);
      if (!closing_ && !status.ok()) {
        broken = absl::UnavailableError(absl::StrCat(
            "the stream to peer ", peer_, " failed: ", status.error_message()));
      }
    }
    if (!broken.ok()) service_->PeerBroke(epoch_, peer_, number_, broken);
    // Last: once done_ is set the transport may destroy this.
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

 private:
  Stream(std::shared_ptr<grpc::Channel> channel, PeerService* service,
         uint64_t epoch, int peer)
      : stub_(std::make_unique<grpc::GenericStub>(std::move(channel))),
        service_(service),
        epoch_(epoch),
        peer_(peer),
        number_(service->OutgoingStreamOpened(epoch, peer)) {}

  // The receiver has read `frames` frames (nullopt: not a PeerSignal,
  // ignored).
  void Acknowledged(std::optional<uint64_t> frames) {
    if (!frames.has_value()) return;
    absl::MutexLock lock(&mu_);
    // Only progress counts: a repeated count, one going back or one past
    // what was sent moves nothing.
    if (*frames <= acknowledged_ || *frames > sent_) return;
    acknowledged_ = *frames;
    while (!unacknowledged_.empty() &&
           unacknowledged_.front().frames_end <= acknowledged_) {
      unacknowledged_.pop_front();
    }
    acknowledged_at_ = SteadyNow();
  }

  void ReleaseHold() {
    {
      absl::MutexLock lock(&mu_);
      if (hold_released_) return;
      hold_released_ = true;
    }
    RemoveHold();
  }

  std::unique_ptr<grpc::GenericStub> stub_;
  PeerService* const service_;
  const uint64_t epoch_;
  const int peer_;
  const uint64_t number_;  // PeerService's stream number
  const absl::Time opened_ = SteadyNow();
  grpc::ClientContext context_;
  grpc::ByteBuffer signal_;  // the receiver's acknowledgements

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  // An Enqueue not acknowledged in full: the count of frames sent once it
  // is, and when it was queued.
  struct Queued {
    uint64_t frames_end = 0;
    absl::Time queued;
  };
  // Until the receiver's initial metadata says otherwise (a link dead from
  // the start is watched too).
  bool acknowledging_ ABSL_GUARDED_BY(mu_) = true;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  // Frames queued and acknowledged so far; the Enqueues not acknowledged in
  // full, oldest first; when the last acknowledgement came (InfinitePast:
  // none yet).
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t acknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Queued> unacknowledged_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kSendsTracked = 4096;
  absl::Time acknowledged_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  absl::Time broken_at_ ABSL_GUARDED_BY(mu_);  // when broken_ was set
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool detached_ ABSL_GUARDED_BY(mu_) = false;  // Detach()
};

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(
    GrpcTransportOptions options) {
  GM_CHECK(options.service != nullptr && options.channels != nullptr);
  if (options.rank < 0 ||
      options.rank >= static_cast<int>(options.peers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " outside a group of ", options.peers.size()));
  }
  if (options.chunk_bytes < 1 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size ", options.chunk_bytes, " is not in [1, ",
                     kMaxChunkBytes, "]"));
  }
  GM_RETURN_IF_ERROR(
      options.service->OpenEpoch(options.epoch, options.rank, options.peers));
  return std::unique_ptr<GrpcTransport>(new GrpcTransport(std::move(options)));
}

GrpcTransport::GrpcTransport(GrpcTransportOptions options)
    : options_(std::move(options)) {
  streams_.resize(options_.peers.size());
  refusals_.resize(options_.peers.size());
  counters_.bytes_sent_to.assign(options_.peers.size(), 0);
  counters_.bytes_received_from.assign(options_.peers.size(), 0);
}

GrpcTransport::~GrpcTransport() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    for (auto& s : streams_) {
      if (s != nullptr) streams.push_back(std::move(s));
    }
    for (auto& s : broken_streams_) streams.push_back(std::move(s));
  }
  for (auto& s : streams) s->Close();
  // A peer that stopped reading cannot hold the process: cancel stragglers.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::vector<std::shared_ptr<Stream>> stragglers;
  for (auto& s : streams) {
    if (!s->WaitDone(deadline)) stragglers.push_back(s);
  }
  for (auto& s : stragglers) s->Cancel();
  const absl::Time cancelled = absl::Now() + absl::Seconds(30);
  for (auto& s : stragglers) {
    if (s->WaitDone(cancelled)) continue;
    // gRPC never ended the cancelled call. The stream is left behind,
    // detached from the service, rather than hang the view change or
    // shutdown that destroys this transport; a leak checker names it.
    s->Detach();
    std::fprintf(stderr,
                 "gradmesh: the stream to peer %d of epoch %llu had not ended "
                 "30 s after it was cancelled; it is left behind\n",
                 s->peer(), static_cast<unsigned long long>(options_.epoch));
    new std::shared_ptr<Stream>(std::move(s));
  }
  options_.service->CloseEpoch(options_.epoch);
  // The streams, and with them perhaps the channels, are destroyed here.
}

absl::Status GrpcTransport::Send(int peer, const Tag& tag,
                                 std::string payload) {
  GM_CHECK(peer >= 0 && peer < size() && peer != rank()) << "peer " << peer;
  GM_CHECK(tag.epoch == options_.epoch)
      << "tag of epoch " << tag.epoch << " on epoch " << options_.epoch;
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    GM_RETURN_IF_ERROR(aborted_);
    std::shared_ptr<Stream>& current = streams_[peer];
    if (current != nullptr && !current->open()) {
      // Broken (its operations in flight have failed): later ones get a new
      // stream. The old one is cancelled, so that gRPC ends its call, and
      // destroyed once done, here, off gRPC's threads. A stream that broke
      // unanswered extends the peer's run of refusals; one answered ends it.
      const std::optional<Refusals> refused = current->Refused();
      refusals_[peer] =
          refused.has_value() ? refusals_[peer].Then(*refused) : Refusals{};
      current->Cancel();
      std::erase_if(broken_streams_, [](const std::shared_ptr<Stream>& s) {
        return s->WaitDone(absl::InfinitePast());
      });
      broken_streams_.push_back(std::move(current));
    }
    if (current == nullptr) {
      current = Stream::Open(options_.channels(options_.peers[peer]),
                             options_.service, options_.epoch, peer);
    }
    stream = current;
  }
  options_.service->NoteOperation(options_.epoch, tag.operation);
  const uint64_t bytes = payload.size();
  // The frames reference the message: no copy on this side.
  const auto message = std::make_shared<const std::string>(std::move(payload));
  std::vector<grpc::ByteBuffer> frames;
  uint64_t offset = 0;
  do {
    const uint64_t length = std::min(options_.chunk_bytes, bytes - offset);
    frames.push_back(EncodeFrame({.epoch = tag.epoch,
                                  .operation = tag.operation,
                                  .step = tag.step,
                                  .from_rank = static_cast<uint32_t>(rank()),
                                  .message_bytes = bytes,
                                  .offset = offset},
                                 message, offset, length));
    offset += length;
  } while (offset < bytes);
  GM_RETURN_IF_ERROR(stream->Enqueue(std::move(frames)));
  absl::MutexLock lock(&mu_);
  ++counters_.messages_sent;
  counters_.bytes_sent += bytes;
  counters_.bytes_sent_to[peer] += bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::string> GrpcTransport::Recv(int peer, const Tag& tag,
                                                absl::Time deadline) {
  GM_CHECK(peer >= 0 && peer < size() && peer != rank()) << "peer " << peer;
  GM_CHECK(tag.epoch == options_.epoch)
      << "tag of epoch " << tag.epoch << " on epoch " << options_.epoch;
  {
    absl::MutexLock lock(&mu_);
    GM_RETURN_IF_ERROR(aborted_);
  }
  GM_ASSIGN_OR_RETURN(
      std::string message,
      options_.service->Receive(options_.epoch, peer, tag, deadline));
  absl::MutexLock lock(&mu_);
  ++counters_.messages_received;
  counters_.bytes_received += message.size();
  counters_.bytes_received_from[peer] += message.size();
  return message;
}

void GrpcTransport::Abort(const absl::Status& status) {
  GM_CHECK(!status.ok());
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return;
    aborted_ = status;
    for (auto& s : streams_) {
      if (s != nullptr) streams.push_back(s);
    }
  }
  options_.service->AbortEpoch(options_.epoch, status);
  for (auto& s : streams) s->Cancel();
}

void GrpcTransport::EndOperation(uint64_t epoch, uint64_t operation) {
  GM_CHECK(epoch == options_.epoch)
      << "operation of epoch " << epoch << " on epoch " << options_.epoch;
  options_.service->RetireOperation(epoch, operation);
}

std::optional<absl::Time> GrpcTransport::UnclaimedSince(
    uint64_t epoch, uint64_t operation) const {
  return options_.service->UnclaimedSince(epoch, operation);
}

std::vector<int> GrpcTransport::StalledPeers(absl::Duration timeout,
                                             absl::Time now) const {
  std::vector<std::pair<int, std::shared_ptr<Stream>>> streams;
  std::vector<Refusals> refusals;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return {};  // its streams were cancelled here
    for (int peer = 0; peer < size(); ++peer) {
      if (streams_[peer] != nullptr) streams.emplace_back(peer, streams_[peer]);
    }
    refusals = refusals_;
  }
  std::vector<int> stalled;
  for (const auto& [peer, stream] : streams) {
    const std::optional<absl::Time> since = stream->WaitingSince();
    // The current stream extends the run if refused too, ends it if
    // answered, and leaves it as it is while it waits for an answer.
    Refusals refused = refusals[peer];
    if (const std::optional<Refusals> r = stream->Refused()) {
      refused = refused.Then(*r);
    } else if (stream->Answered()) {
      refused = {};
    }
    if ((since.has_value() && now - *since >= timeout) ||
        refused.Name(timeout, now)) {
      stalled.push_back(peer);
    }
  }
  return stalled;
}

Counters GrpcTransport::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace gradmesh::transport
