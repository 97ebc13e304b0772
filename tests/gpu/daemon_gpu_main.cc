// daemon_gpu_test's main: exits 77 ("no GPU: skipped") where no device exists, which CTest maps
// to SKIPPED; --gtest_list_tests lists the tests anywhere.
#include <cstdio>

#include "client/gpu/client_gpu.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // (--gtest_list_tests lists them anywhere: no test runs.)
  if (!GTEST_FLAG_GET(list_tests) && tier::client::gpu::GpuDeviceCount() == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
