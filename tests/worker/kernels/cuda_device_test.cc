// GPU tests skip cleanly where no device is present.
#include "worker/kernels/cuda_device.h"

#include "gtest/gtest.h"

namespace gradmesh::kernels {
namespace {

TEST(CudaDeviceTest, DescribesTheDeviceOrItsAbsence) {
  const std::string description = CudaDeviceDescription();
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << description;
  }
  EXPECT_NE(description.find("sm_"), std::string::npos) << description;
}

}  // namespace
}  // namespace gradmesh::kernels
