// main() for test binaries that use gRPC: runs the tests, checks for leaks
// where LeakSanitizer is linked in, then ends the process without running
// static destructors. gRPC 1.51 tears its callback completion queue down
// from static destructors while its own "nexting" thread may still use it;
// at exit that can double-free (seen under AddressSanitizer, where it then
// deadlocks the sanitizer's report). Everything the tests own is destroyed
// by the time RUN_ALL_TESTS returns.
#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"

extern "C" int __lsan_do_recoverable_leak_check() __attribute__((weak));

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
  if (&__lsan_do_recoverable_leak_check != nullptr &&
      __lsan_do_recoverable_leak_check() != 0) {
    result = 1;
  }
  std::fflush(nullptr);
  std::_Exit(result);
}
