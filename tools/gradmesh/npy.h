// Reading and writing float32 arrays in NumPy's .npy format (versions 1-3).
//
// Only what replay needs: little-endian float32 ('<f4'), C order, 1-D or 2-D.
// The reader checks the header and the file size before any data is read, and
// reads row by row so that large files never sit in memory whole.
//
// Not thread-safe; one object per file.
#ifndef GRADMESH_TOOLS_GRADMESH_NPY_H_
#define GRADMESH_TOOLS_GRADMESH_NPY_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace gradmesh::tools {

class NpyReader {
 public:
  // InvalidArgument (naming the file) for anything but a well-formed float32
  // array of 1 or 2 dimensions; NotFound if the file is missing.
  static absl::StatusOr<NpyReader> Open(const std::string& path);

  const std::vector<uint64_t>& shape() const { return shape_; }
  uint64_t rows() const { return shape_.size() == 1 ? 1 : shape_[0]; }
  uint64_t columns() const { return shape_.back(); }

  // Reads row `row` into `out` (out.size() == columns()).
  absl::Status ReadRow(uint64_t row, absl::Span<float> out);

 private:
  NpyReader() = default;

  std::string path_;
  std::ifstream in_;
  uint64_t data_offset_ = 0;
  std::vector<uint64_t> shape_;
};

class NpyWriter {
 public:
  // Creates `path` (truncating) for a float32 array of `shape`.
  static absl::StatusOr<NpyWriter> Create(const std::string& path,
                                          std::vector<uint64_t> shape);

  // Appends values in C order.
  absl::Status Append(absl::Span<const float> values);

  // FailedPrecondition unless exactly product(shape) values were appended.
  absl::Status Close();

 private:
  NpyWriter() = default;

  std::string path_;
  std::ofstream out_;
  uint64_t expected_ = 0;
  uint64_t written_ = 0;
};

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_NPY_H_
