// How a backward kernel writes a gradient.
//   Accumulate  grad[i] += contribution   (every backward's default)
//   Assign      grad[i]  = contribution   without reading grad: for a gradient
//               buffer the tape hands out unwritten (Tape::grad_target), which a
//               kernel that writes every element may overwrite instead of having it
//               zero-filled first.
// Both give the same values: adding to a zero gives the contribution itself.
#pragma once

namespace towerlab {

enum class GradWrite { Accumulate, Assign };

}  // namespace towerlab
