#include "worker/transport/grpc/frame_codec.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gradmesh/v1/peer.pb.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "worker/transport/transport.h"

namespace gradmesh::transport {

namespace {

using ::google::protobuf::io::CodedInputStream;
using ::google::protobuf::io::CodedOutputStream;
using ::google::protobuf::io::StringOutputStream;

constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t Key(int field, uint32_t wire_type) {
  return (static_cast<uint32_t>(field) << 3) | wire_type;
}

// Releases the message reference a data slice holds.
void ReleaseMessage(void* holder) {
  delete static_cast<std::shared_ptr<const std::string>*>(holder);
}

}  // namespace

// A PeerSignal is at most 11 bytes.
constexpr size_t kMaxSignalBytes = 16;

grpc::ByteBuffer EncodeSignal(uint64_t frames_received) {
  v1::PeerSignal signal;
  signal.set_frames_received(frames_received);
  grpc::Slice slice(signal.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

std::optional<uint64_t> DecodeSignal(const grpc::ByteBuffer& buffer) {
  if (buffer.Length() > kMaxSignalBytes) return std::nullopt;
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return std::nullopt;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  v1::PeerSignal signal;
  if (!signal.ParseFromString(bytes)) return std::nullopt;
  return signal.frames_received();
}

grpc::ByteBuffer EncodeFrame(const FrameHeader& header,
                             const std::shared_ptr<const std::string>& message,
                             uint64_t offset, uint64_t length) {
  std::string head;
  {
    StringOutputStream stream(&head);
    CodedOutputStream out(&stream);
    // proto3 leaves zero scalars out, as the generated code would.
    auto field = [&](int number, uint64_t value) {
      if (value == 0) return;
      out.WriteVarint32(Key(number, kVarint));
      out.WriteVarint64(value);
    };
    field(1, header.epoch);
    field(2, header.operation);
    field(3, header.step);
    field(4, header.from_rank);
    field(5, header.message_bytes);
    field(6, header.offset);
    if (length > 0) {
      out.WriteVarint32(Key(7, kLengthDelimited));
      out.WriteVarint64(length);
    }
  }
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head);
  if (length > 0) {
    auto* holder = new std::shared_ptr<const std::string>(message);
    slices.emplace_back(const_cast<char*>(message->data() + offset), length,
                        &ReleaseMessage, holder);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

namespace {

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed frame: ", what));
}

// Header field `field` (1..6) := value; InvalidArgument past 32 bits for
// the step and the rank.
absl::Status SetHeaderField(int field, uint64_t value, FrameHeader* header) {
  if ((field == 3 || field == 4) && value > UINT32_MAX) {
    return Malformed(absl::StrCat("field ", field, " exceeds 32 bits"));
  }
  switch (field) {
    case 1:
      header->epoch = value;
      break;
    case 2:
      header->operation = value;
      break;
    case 3:
      header->step = static_cast<uint32_t>(value);
      break;
    case 4:
      header->from_rank = static_cast<uint32_t>(value);
      break;
    case 5:
      header->message_bytes = value;
      break;
    case 6:
      header->offset = value;
      break;
  }
  return absl::OkStatus();
}

// The data field, after its key: its length, then the bytes into what the
// sink gives. Only what is really there (and fits a chunk) reaches the sink.
absl::Status ReadData(CodedInputStream& in, const grpc::ByteBuffer& buffer,
                      const FrameHeader& header, const FrameSink& sink) {
  uint64_t size = 0;
  if (!in.ReadVarint64(&size)) return Malformed("data length");
  const uint64_t left = buffer.Length() - in.CurrentPosition();
  if (size > left || size > kMaxChunkBytes) {
    return Malformed(
        absl::StrCat("data of ", size, " bytes where ", left, " remain"));
  }
  GM_ASSIGN_OR_RETURN(std::string * out, sink(header, size));
  // Piece by piece from gRPC's read buffers: one copy, no zero fill.
  for (uint64_t pending = size; pending > 0;) {
    const void* data = nullptr;
    int available = 0;
    if (!in.GetDirectBufferPointer(&data, &available)) {
      return Malformed("data shorter than its length");
    }
    const int take = static_cast<int>(std::min<uint64_t>(pending, available));
    out->append(static_cast<const char*>(data), take);
    in.Skip(take);
    pending -= take;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeFrame(grpc::ByteBuffer* buffer, const FrameSink& sink) {
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  FrameHeader header;
  bool data_seen = false;
  while (true) {
    const uint32_t key = in.ReadTag();
    if (key == 0) break;  // end of the frame (or an invalid key 0)
    if (data_seen) return Malformed("a field after the data");
    const int field = static_cast<int>(key >> 3);
    if (field >= 1 && field <= 6) {
      uint64_t value = 0;
      if ((key & 7) != kVarint || !in.ReadVarint64(&value)) {
        return Malformed(absl::StrCat("field ", field));
      }
      GM_RETURN_IF_ERROR(SetHeaderField(field, value, &header));
    } else if (key == Key(7, kLengthDelimited)) {
      GM_RETURN_IF_ERROR(ReadData(in, *buffer, header, sink));
      data_seen = true;
    } else {
      return Malformed(absl::StrCat("unknown key ", key));
    }
  }
  if (!in.ConsumedEntireMessage() || reader.status().ok() == false) {
    return Malformed("trailing bytes");
  }
  if (!data_seen) GM_RETURN_IF_ERROR(sink(header, 0).status());
  return absl::OkStatus();
}

}  // namespace gradmesh::transport
