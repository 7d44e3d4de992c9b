// The uniform number that decides whether dropout keeps element e (contract in
// kernels/dropout.h): the reference, the CPU backend and the CUDA kernel all call
// this one function, so the masks agree bit for bit. Host and device code.
#pragma once

#include <cstdint>

#include "../engine/philox.h"

namespace towerlab {

// Word e % 4 of Philox's draw e / 4: four elements share one ten-round draw.
TL_HOST_DEVICE inline float dropout_unit(std::uint64_t seed, std::uint64_t subsequence,
                                         std::uint64_t e) {
  const philox::Uint4 r = philox::draw(seed, subsequence, e / 4);
  const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
  return philox::to_unit_float(words[e % 4]);
}

}  // namespace towerlab
