// libFuzzer's entry point for one target of fuzz/targets.h, chosen at compile time
// (TOWERLAB_FUZZ_TARGET, e.g. safetensors): fuzz/CMakeLists.txt builds one binary
// per target from this file. Run them with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  towerlab::fuzz::TOWERLAB_FUZZ_TARGET(data, size);
  return 0;
}
