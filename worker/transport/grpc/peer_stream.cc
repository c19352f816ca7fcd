// PeerService, one incoming stream: reads frames, checks them against the
// stream and the message being assembled, delivers whole messages, and
// acknowledges what it has read.
#include <algorithm>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc/grpc_util.h"
#include "common/status_macros.h"
#include "worker/transport/grpc/frame_codec.h"
#include "worker/transport/grpc/peer_service.h"

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
// Acknowledges the frames read (a PeerSignal with their count), one write
// in flight, where the sender asks for it (kAcknowledgeKey), so that the
// sender can tell a link that drops its frames.
class PeerService::Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(PeerService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        acknowledges_(context->client_metadata().contains(kAcknowledgeKey)) {
    if (acknowledges_) {  // says so at once: the sender watches from then
      context_->AddInitialMetadata(kAcknowledgeKey, "1");
      absl::MutexLock lock(&write_mu_);
      StartSendInitialMetadata();
    }
    StartRead(&buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    absl::Status accepted =
        DecodeFrame(&buffer_, [this](const FrameHeader& header, uint64_t size) {
          return Place(header, size);
        });
    buffer_.Clear();
    if (accepted.ok()) {
      Acknowledge();
      ++frames_;
      if (!keep_) message_.clear();  // read into nothing
      if (received_ == message_bytes_) {
        if (keep_) {
          accepted = service_->Deliver(epoch_, from_, stream_, tag_,
                                       std::move(message_), frames_);
        } else {
          service_->Discarded(epoch_, frames_);
        }
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
    FinishOnce(ToGrpcStatus(accepted));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&write_mu_);
    writing_ = false;
    if (!ok) broken_write_ = true;  // no more acknowledgements
    SendAcknowledgementLocked();
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
      GM_ASSIGN_OR_RETURN(
          keep_, service_->NoteIncoming(epoch_, from_, stream_, tag.operation,
                                        header.message_bytes));
      message_bytes_ = header.message_bytes;
      received_ = 0;
      try {
        if (keep_) {
          message_.reserve(std::min(message_bytes_, kReservedMessageBytes));
        }
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

  // Counts a frame read, and acknowledges it unless an acknowledgement is
  // in flight (its completion sends the count then).
  void Acknowledge() {
    if (!acknowledges_) return;
    absl::MutexLock lock(&write_mu_);
    ++frames_read_;
    SendAcknowledgementLocked();
  }
  // StartWrite and Finish are called under write_mu_: never at once (both
  // send the initial metadata when it has not gone yet). A write in flight
  // at Finish completes before OnDone; gRPC runs no write reaction inline.
  void SendAcknowledgementLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (writing_ || finishing_ || broken_write_ ||
        acknowledged_ == frames_read_) {
      return;
    }
    writing_ = true;
    acknowledged_ = frames_read_;
    signal_ = EncodeSignal(acknowledged_);
    StartWrite(&signal_);
  }
  void FinishOnce(grpc::Status status) {
    absl::MutexLock lock(&write_mu_);
    if (finishing_) return;
    finishing_ = true;
    Finish(std::move(status));
  }

  PeerService* const service_;
  grpc::CallbackServerContext* const context_;
  const bool acknowledges_;
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
  bool keep_ = true;  // false: its epoch or operation is retired here
  std::string message_;
  // Acknowledgements; OnReadDone and OnWriteDone may run at once.
  absl::Mutex write_mu_;
  uint64_t frames_read_ ABSL_GUARDED_BY(write_mu_) = 0;
  uint64_t acknowledged_ ABSL_GUARDED_BY(write_mu_) = 0;
  grpc::ByteBuffer signal_ ABSL_GUARDED_BY(write_mu_);  // the one in flight
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool broken_write_ ABSL_GUARDED_BY(write_mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(write_mu_) = false;
};

grpc::ServerGenericBidiReactor* PeerService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  class Refuse final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refuse(grpc::Status status) { Finish(std::move(status)); }
    void OnDone() override { delete this; }
  };
  if (context->method() != kExchangeMethod) {
    return new Refuse(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, ""));
  }
  if (OverUnixSocket(*context)) {
    {
      absl::MutexLock lock(&mu_);
      ++stats_.streams_refused_identity;
    }
    return new Refuse(
        grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                     "peer streams are not taken over the SDK's unix socket"));
  }
  return new Reactor(this, context);
}

}  // namespace gradmesh::transport
