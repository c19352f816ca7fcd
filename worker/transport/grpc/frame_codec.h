// The wire form of gradmesh.v1.Frame (proto/gradmesh/v1/peer.proto), written
// and read by hand so that a chunk is copied once between the sender's
// message and the receiver's: the sender's frames reference its message
// (no copy), and the receiver appends each chunk's data straight from gRPC's
// read buffers to the message being assembled (no zero fill first). The bytes
// are exactly the protobuf encoding (fields in number order, data last), so
// generated stubs can still talk to the peer service.
#ifndef GRADMESH_WORKER_TRANSPORT_GRPC_FRAME_CODEC_H_
#define GRADMESH_WORKER_TRANSPORT_GRPC_FRAME_CODEC_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"

namespace gradmesh::transport {

// The full name of the Exchange method, for the generic stub and service.
inline constexpr char kExchangeMethod[] = "/gradmesh.v1.Peer/Exchange";

struct FrameHeader {
  uint64_t epoch = 0;
  uint64_t operation = 0;
  uint32_t step = 0;
  uint32_t from_rank = 0;
  uint64_t message_bytes = 0;
  uint64_t offset = 0;
};

// The frame carrying bytes [offset, offset + length) of *message; the buffer
// keeps `message` alive until gRPC has sent it.
grpc::ByteBuffer EncodeFrame(const FrameHeader& header,
                             const std::shared_ptr<const std::string>& message,
                             uint64_t offset, uint64_t length);

// The string a frame's `size` data bytes are appended to, or why the frame
// is refused.
using FrameSink = std::function<absl::StatusOr<std::string*>(const FrameHeader&,
                                                             uint64_t size)>;

// Parses a frame and appends its data to the string `sink` names.
// InvalidArgument for bytes that are not a Frame (unknown fields included, or
// data longer than kMaxChunkBytes or than the bytes present); the sink's error
// if it refuses. The sink never sees a size larger than the data really there.
absl::Status DecodeFrame(grpc::ByteBuffer* buffer, const FrameSink& sink);

// The metadata key by which a sender asks for acknowledgements: a receiver
// acknowledges only then, since a sender that never reads them would hold
// the call (gRPC opens the window for them only as they are read). A
// receiver that acknowledges sends it back in its initial metadata.
inline constexpr char kAcknowledgeKey[] = "gradmesh-acknowledge";

// A PeerSignal acknowledging `frames_received` frames of a stream.
grpc::ByteBuffer EncodeSignal(uint64_t frames_received);
// Its frames_received; nullopt for bytes that are not a PeerSignal.
std::optional<uint64_t> DecodeSignal(const grpc::ByteBuffer& buffer);

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_GRPC_FRAME_CODEC_H_
