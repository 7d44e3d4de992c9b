// The error family: one base type, typed subclasses, messages built only on failure.
#include "test_util.h"

namespace towerlab::testing {
namespace {

TEST(Error, HierarchyLetsCallersCatchBroadlyOrNarrowly) {
  EXPECT_THROW(throw ShapeError("x"), InvalidArgument);
  EXPECT_THROW(throw DeviceError("x"), InvalidArgument);
  EXPECT_THROW(throw OutOfMemory("x"), Error);
  EXPECT_THROW(throw CudaError("x"), Error);
  EXPECT_THROW(throw IoError("x"), Error);
  EXPECT_THROW(throw NotSupported("x"), std::runtime_error);
}

TEST(Error, CheckBuildsTheMessageOnlyOnFailure) {
  int evaluations = 0;
  auto expensive = [&] {
    ++evaluations;
    return std::string("detail");
  };
  TL_CHECK(1 + 1 == 2, InvalidArgument, "never " << expensive());
  EXPECT_EQ(evaluations, 0);
  EXPECT_THROW_WITH(TL_CHECK(1 + 1 == 3, ShapeError, "op: got " << 3 << " with " << expensive()),
                    ShapeError, "op: got 3 with detail");
  EXPECT_EQ(evaluations, 1);
}

TEST(Error, CudaErrorsNameTheCallDeviceFileAndLine) {
  EXPECT_THROW_WITH(detail::throw_cuda_error("cudaMalloc(&p, n)", "cudaErrorMemoryAllocation", 1,
                                             "engine/allocator.cpp", 42),
                    CudaError,
                    "cudaMalloc(&p, n) failed on cuda:1 with cudaErrorMemoryAllocation at "
                    "engine/allocator.cpp:42");
  EXPECT_THROW_WITH(detail::throw_cuda_error("cudaGetDevice(&d)", "cudaErrorNoDevice", -1,
                                             "engine/device.cpp", 7),
                    CudaError, "cudaGetDevice(&d) failed with cudaErrorNoDevice at");
}

// The FILE of a CUDA error's "at FILE:LINE" is __FILE__, which the build maps to the
// path in the source tree whatever the build folder and whether ccache named the
// source from there (CMakeLists.txt, "paths in the objects").
TEST(Error, SourceFilesAreNamedFromTheTree) {
  EXPECT_STREQ(__FILE__, "tests/error_test.cpp");
}

}  // namespace
}  // namespace towerlab::testing
