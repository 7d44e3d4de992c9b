// The process-wide choice between Winograd and im2col for the CPU's float32 conv2d
// (Conv2dAlgorithm, engine/settings.h): the setting, read first from the
// environment, the scope that sets it for tests and benchmarks, and which shapes
// Winograd takes (kernels/cpu/winograd.h). CUDA's Winograd reads the same setting
// and winograd_applies (kernels/cuda/conv2d_winograd.cu).
#include <atomic>
#include <cstdint>

#include "engine/settings.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/winograd.h"

namespace towerlab::cpu {

namespace {

// The environment may pin the algorithm (TOWERLAB_CONV2D_ALGORITHM=auto|im2col|
// winograd); an unknown name warns once and leaves Auto (engine/settings.h).
Conv2dAlgorithm initial_algorithm() {
  const auto wanted =
      detail::environment_choice("TOWERLAB_CONV2D_ALGORITHM", {"auto", "im2col", "winograd"});
  if (wanted == "im2col") return Conv2dAlgorithm::Im2col;
  if (wanted == "winograd") return Conv2dAlgorithm::Winograd;
  return Conv2dAlgorithm::Auto;
}

std::atomic<Conv2dAlgorithm>& selected_algorithm() {
  static std::atomic<Conv2dAlgorithm> algorithm{initial_algorithm()};
  return algorithm;
}

// Auto takes Winograd for the forward and the backward-data from this many input
// and output channels on. Below, the transforms (linear in C + K per tile) cost
// more than the GEMM saves (linear in C * K): FashionNet's first layer (C = 1)
// runs several times faster with im2col. On FashionNet's second layer the
// backward-data measured faster than im2col + col2im, whose columns of x the weight
// gradient shares (bench/results/winograd.md; docs/kernels.md, "Measured choices").
// The choice depends on
// the shape alone, never on the ISA, so that every ISA gives the same bits.
constexpr std::int64_t kMinAutoChannels = 16;

// Auto's tile for the forward and backward-data: F(4x4, 3x3) from this many input
// and output channels on, F(2x2, 3x3) below, where the fused steps of
// kernels/cpu/winograd_fused.cpp run ResNet-20's 16-channel layers about as fast as
// the larger tile's GEMMs of 16 deep, with F(2x2)'s tighter rounding
// (bench/results/winograd4_cpu_5011002.md).
constexpr std::int64_t kMinF4x4Channels = 32;

// The environment may pin the tile too (TOWERLAB_WINOGRAD_TILE=auto|f2x2|f4x4),
// for comparing the two in a whole program.
WinogradTile initial_tile() {
  const auto wanted =
      detail::environment_choice("TOWERLAB_WINOGRAD_TILE", {"auto", "f2x2", "f4x4"});
  if (wanted == "f2x2") return WinogradTile::F2x2;
  if (wanted == "f4x4") return WinogradTile::F4x4;
  return WinogradTile::Auto;
}

std::atomic<WinogradTile>& selected_tile() {
  static std::atomic<WinogradTile> tile{initial_tile()};
  return tile;
}

}  // namespace

ScopedConv2dAlgorithm::ScopedConv2dAlgorithm(Conv2dAlgorithm algorithm)
    : previous_(selected_algorithm().exchange(algorithm)) {}

ScopedConv2dAlgorithm::~ScopedConv2dAlgorithm() {
  selected_algorithm().store(previous_);
}

ScopedWinogradTile::ScopedWinogradTile(WinogradTile tile)
    : previous_(selected_tile().exchange(tile)) {}

ScopedWinogradTile::~ScopedWinogradTile() {
  selected_tile().store(previous_);
}

bool f4x4_chosen(const Conv2dShape& s) {
  switch (selected_tile().load()) {
    case WinogradTile::F2x2:
      return false;
    case WinogradTile::F4x4:
      return true;
    case WinogradTile::Auto:
      break;
  }
  return s.C >= kMinF4x4Channels && s.K >= kMinF4x4Channels;
}

bool winograd_applies(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return s.R == 3 && s.S == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && p.pad_h >= 0 && p.pad_h <= 1 && p.pad_w >= 0 && p.pad_w <= 1;
}

bool winograd_chosen(const Conv2dShape& s) {
  switch (conv2d_algorithm()) {
    case Conv2dAlgorithm::Im2col:
      return false;
    case Conv2dAlgorithm::Winograd:
      return winograd_applies(s);
    case Conv2dAlgorithm::Auto:
      break;
  }
  return winograd_applies(s) && s.C >= kMinAutoChannels && s.K >= kMinAutoChannels;
}

}  // namespace towerlab::cpu

namespace towerlab {

void set_conv2d_algorithm(Conv2dAlgorithm algorithm) {
  cpu::selected_algorithm().store(algorithm);
}

Conv2dAlgorithm conv2d_algorithm() {
  return cpu::selected_algorithm().load();
}

}  // namespace towerlab
