// libFuzzer target for the block decoders: whatever the bytes, decoding
// returns a block that satisfies the invariants or an error, and a decoded
// block re-encodes to itself in every encoding.
//
// Input: 2 bytes range begin, 2 bytes range length, then tagged blocks.
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status_macros.h"
#include "worker/sparse/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradmesh::sparse;
  if (size < 4) return 0;
  uint16_t begin, length;
  std::memcpy(&begin, data, 2);
  std::memcpy(&length, data + 2, 2);
  const IndexRange range{begin, uint64_t{begin} + length};
  absl::string_view in(reinterpret_cast<const char*>(data) + 4, size - 4);
  while (!in.empty()) {
    auto block = DecodeBlock(&in, range);
    if (!block.ok()) break;
    GM_CHECK_OK(Validate(*block, range));
    for (int e = 0; e < kEncodingCount; ++e) {
      std::string bytes;
      EncodeBlock(*block, range, static_cast<Encoding>(e), ValueType::kFloat32,
                  &bytes);
      absl::string_view again(bytes);
      auto round_trip = DecodeBlock(&again, range);
      GM_CHECK_OK(round_trip.status());
      GM_CHECK(*round_trip == *block) << "encoding " << e;
    }
  }
  return 0;
}
