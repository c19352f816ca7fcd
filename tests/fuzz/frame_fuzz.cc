// libFuzzer target for the peer frame codec: whatever bytes a peer sends,
// DecodeFrame refuses them or hands the sink a size no larger than the data
// present, appends exactly that much, and a decoded frame re-encodes to one
// that decodes to the same header and data.
//
// Input: 1 byte, the number of slices (1..8) the bytes arrive in, then the
// frame's bytes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "worker/transport/grpc/frame_codec.h"
#include "worker/transport/transport.h"

namespace {

using gradmesh::transport::DecodeFrame;
using gradmesh::transport::FrameHeader;

// Decodes `buffer`; the header and data when accepted.
absl::StatusOr<std::pair<FrameHeader, std::string>> Decode(
    grpc::ByteBuffer* buffer) {
  FrameHeader seen;
  std::string data;
  uint64_t announced = 0;
  absl::Status status =
      DecodeFrame(buffer, [&](const FrameHeader& header, uint64_t size) {
        GM_CHECK(size <= gradmesh::transport::kMaxChunkBytes) << size;
        seen = header;
        announced = size;
        return &data;
      });
  if (!status.ok()) return status;
  GM_CHECK(data.size() == announced) << data.size() << " vs " << announced;
  return std::make_pair(seen, std::move(data));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size < 1) return 0;
  const size_t pieces = 1 + bytes[0] % 8;
  const std::string frame(reinterpret_cast<const char*>(bytes) + 1, size - 1);
  std::vector<grpc::Slice> slices;
  const size_t step = std::max<size_t>(1, frame.size() / pieces);
  for (size_t at = 0; at < frame.size(); at += step) {
    const std::string part = frame.substr(at, step);
    slices.emplace_back(part.data(), part.size());
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  auto decoded = Decode(&buffer);
  if (!decoded.ok()) return 0;
  const auto& [header, data] = *decoded;
  const auto message = std::make_shared<const std::string>(data);
  grpc::ByteBuffer again =
      gradmesh::transport::EncodeFrame(header, message, 0, data.size());
  auto round_trip = Decode(&again);
  GM_CHECK_OK(round_trip.status());
  const FrameHeader& h = round_trip->first;
  GM_CHECK(h.epoch == header.epoch && h.operation == header.operation &&
           h.step == header.step && h.from_rank == header.from_rank &&
           h.message_bytes == header.message_bytes &&
           h.offset == header.offset);
  GM_CHECK(round_trip->second == data);
  return 0;
}
