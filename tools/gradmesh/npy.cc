#include "tools/gradmesh/npy.h"

#include <bit>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace gradmesh::tools {
namespace {

static_assert(std::endian::native == std::endian::little);

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Returns the text of the header dictionary's value for `key`, up to the next
// top-level comma or closing brace.
absl::StatusOr<std::string> DictValue(absl::string_view header,
                                      absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("header lacks ", quoted));
  }
  at = header.find(':', at + quoted.size());
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("header: no value for ", key));
  }
  size_t end = at + 1;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  return std::string(
      absl::StripAsciiWhitespace(header.substr(at + 1, end - at - 1)));
}

absl::StatusOr<std::vector<uint64_t>> ParseShape(absl::string_view text) {
  if (!absl::ConsumePrefix(&text, "(") || !absl::ConsumeSuffix(&text, ")")) {
    return absl::InvalidArgumentError(absl::StrCat("bad shape ", text));
  }
  std::vector<uint64_t> shape;
  for (absl::string_view part :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint64_t dim;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad shape entry '", part, "'"));
    }
    shape.push_back(dim);
  }
  return shape;
}

// Reads the magic, the version and the header dict of `in`; sets
// *data_offset to where the data starts.
absl::StatusOr<std::string> ReadHeader(std::ifstream& in,
                                       const std::string& path,
                                       uint64_t* data_offset) {
  char preamble[kMagicSize + 2];
  if (!in.read(preamble, sizeof(preamble)) ||
      std::memcmp(preamble, kMagic, kMagicSize) != 0) {
    return Bad(path, "not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(preamble[kMagicSize]);
  uint64_t header_size = 0;
  uint64_t length_bytes = 0;
  if (major == 1) {
    uint16_t len;
    in.read(reinterpret_cast<char*>(&len), sizeof(len));
    header_size = len;
    length_bytes = 2;
  } else if (major == 2 || major == 3) {
    uint32_t len;
    in.read(reinterpret_cast<char*>(&len), sizeof(len));
    header_size = len;
    length_bytes = 4;
  } else {
    return Bad(path, absl::StrCat("unsupported .npy version ", major));
  }
  if (!in || header_size > (1u << 20)) return Bad(path, "bad header length");
  std::string header(header_size, '\0');
  if (!in.read(header.data(), header.size())) {
    return Bad(path, "truncated header");
  }
  *data_offset = kMagicSize + 2 + length_bytes + header_size;
  return header;
}

// The shape the header describes: little-endian float32, [n] or [T, n],
// C order (or one row).
absl::StatusOr<std::vector<uint64_t>> ParseHeader(const std::string& header,
                                                  const std::string& path) {
  auto descr = DictValue(header, "descr");
  auto fortran = DictValue(header, "fortran_order");
  auto shape_text = DictValue(header, "shape");
  for (const auto* part : {&descr, &fortran, &shape_text}) {
    if (!part->ok()) return Bad(path, part->status().message());
  }
  if (*descr != "'<f4'") {
    return Bad(path, absl::StrCat("dtype ", *descr,
                                  " is not little-endian float32 ('<f4')"));
  }
  auto shape = ParseShape(*shape_text);
  if (!shape.ok()) return Bad(path, shape.status().message());
  if (shape->empty() || shape->size() > 2) {
    return Bad(path, absl::StrCat("shape (", absl::StrJoin(*shape, ", "),
                                  ") is neither [n] nor [T, n]"));
  }
  if (*fortran != "False" && shape->size() == 2 && (*shape)[0] > 1) {
    return Bad(path, "Fortran-ordered arrays are not supported");
  }
  return shape;
}

}  // namespace

absl::StatusOr<NpyReader> NpyReader::Open(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  NpyReader reader;
  reader.path_ = path;
  reader.in_.open(path, std::ios::binary);
  if (!reader.in_) return Bad(path, "cannot be opened");
  GM_ASSIGN_OR_RETURN(const std::string header,
                      ReadHeader(reader.in_, path, &reader.data_offset_));
  GM_ASSIGN_OR_RETURN(reader.shape_, ParseHeader(header, path));
  uint64_t values = 1;
  for (uint64_t dim : reader.shape_) {
    if (__builtin_mul_overflow(values, dim, &values) ||
        values > (uint64_t{1} << 60)) {
      return Bad(path, "shape is too large");
    }
  }
  if (file_size != reader.data_offset_ + values * sizeof(float)) {
    return Bad(
        path,
        absl::StrCat("file holds ", file_size - reader.data_offset_,
                     " data bytes; shape (", absl::StrJoin(reader.shape_, ", "),
                     ") needs ", values * sizeof(float)));
  }
  return reader;
}

absl::Status NpyReader::ReadRow(uint64_t row, absl::Span<float> out) {
  if (row >= rows() || out.size() != columns()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": row ", row, " of ",
                                                   rows(), " with ", out.size(),
                                                   " values requested"));
  }
  in_.seekg(static_cast<std::streamoff>(data_offset_ +
                                        row * columns() * sizeof(float)));
  if (!in_.read(reinterpret_cast<char*>(out.data()),
                static_cast<std::streamsize>(out.size() * sizeof(float)))) {
    return absl::DataLossError(
        absl::StrCat(path_, ": read of row ", row, " failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<NpyWriter> NpyWriter::Create(const std::string& path,
                                            std::vector<uint64_t> shape) {
  NpyWriter writer;
  writer.path_ = path;
  writer.expected_ = 1;
  for (uint64_t dim : shape) writer.expected_ *= dim;
  std::string dict = absl::StrCat(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (",
      absl::StrJoin(shape, ", "), shape.size() == 1 ? ",), }" : "), }");
  // Pad with spaces so that the data starts on a 64-byte boundary.
  const size_t unpadded = kMagicSize + 2 + 2 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  writer.out_.open(path, std::ios::binary | std::ios::trunc);
  if (!writer.out_) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot be created"));
  }
  const uint16_t len = static_cast<uint16_t>(dict.size());
  writer.out_.write(kMagic, kMagicSize);
  writer.out_.put(1);
  writer.out_.put(0);
  writer.out_.write(reinterpret_cast<const char*>(&len), sizeof(len));
  writer.out_ << dict;
  if (!writer.out_)
    return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return writer;
}

absl::Status NpyWriter::Append(absl::Span<const float> values) {
  out_.write(reinterpret_cast<const char*>(values.data()),
             static_cast<std::streamsize>(values.size() * sizeof(float)));
  written_ += values.size();
  if (!out_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

absl::Status NpyWriter::Close() {
  out_.close();
  if (!out_) return absl::DataLossError(absl::StrCat(path_, ": close failed"));
  if (written_ != expected_) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": ", written_, " values written, shape needs ", expected_));
  }
  return absl::OkStatus();
}

}  // namespace gradmesh::tools
