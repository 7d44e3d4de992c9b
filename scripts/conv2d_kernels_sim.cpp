// Runs the CUDA conv2d kernels (kernels/cuda/conv2d.cu, turned into C++ by
// scripts/sim_conv2d_kernels.sh) on the host against towerlab's CPU backend:
//   conv2d_kernels_sim SMS [large]
// SMS is the SM count the launchers plan for (tile choice, split counts).
// Every pass runs on odd shapes; backward-weight also runs alone on FashionNet's
// layers (the split-over-images path), twice for determinism, and once with a
// partial sum tampered with, which the comparison must catch.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "kernels/cpu/conv2d.h"
#include "towerlab.h"
// After towerlab.h: the shim's macros stand in for CUDA's keywords.
#include "cuda_sim_shim.h"
namespace towerlab::simcuda {
void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dShape&,
                    const Stream&);
void conv2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                     const Tensor&, const Conv2dShape&, const Stream&);
long sim_blocks_run = 0;
}  // namespace towerlab::simcuda
int sim_sms = 8;
using namespace towerlab;
struct Case {
  const char* name;
  std::int64_t N, C, H, W, K, R, S;
  Conv2dParams p;
  bool bias;
};
std::vector<float> rnd(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
int failures = 0;
// Elements of a (simulated) outside atol + rtol*|b| of b (CPU); prints the first few.
int mismatches(const char* what, const char* name, const std::vector<float>& a,
               const std::vector<float>& b, double atol = 2e-4, bool quiet = false) {
  int bad = 0;
  double maxerr = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double e = std::abs(a[i] - b[i]);
    maxerr = std::max(maxerr, e);
    if (!(e <= atol + 1e-4 * std::abs(b[i]))) {
      if (bad < 3 && !quiet)
        std::printf("  %s %s [%zu]: sim %g cpu %g\n", name, what, i, a[i], b[i]);
      ++bad;
    }
  }
  if (!quiet) {
    std::printf("%-24s %-12s n=%zu maxerr=%.2e %s\n", name, what, a.size(), maxerr,
                bad ? "FAIL" : "ok");
  }
  return bad;
}
void compare(const char* what, const char* name, const std::vector<float>& a,
             const std::vector<float>& b, double atol = 2e-4) {
  failures += mismatches(what, name, a, b, atol) != 0;
}

// A case's shapes: x [N,C,H,W], weight [K,C,R,S], y [N,K,P,Q], and the kernels' view of them.
struct Shapes {
  Shape x, w, y;
  Conv2dShape conv;
};
Shapes shapes_of(const Case& c) {
  Shape xs{c.N, c.C, c.H, c.W}, ws{c.K, c.C, c.R, c.S};
  Shape ys = conv2d_output_shape(xs, ws, c.p);
  return {xs, ws, ys, Conv2dShape{c.N, c.C, c.H, c.W, c.K, c.R, c.S, ys[2], ys[3], c.p}};
}

// Every pass of one case against the CPU backend.
void all_passes(const Case& c, unsigned& seed) {
  Stream& cpu = default_stream(Device::cpu());
  const auto [xs, ws, ys, sh] = shapes_of(c);
  Tensor x = Tensor::from_host<float>(rnd(numel_of(xs), ++seed), xs, cpu);
  Tensor w = Tensor::from_host<float>(rnd(numel_of(ws), ++seed), ws, cpu);
  Tensor b = c.bias ? Tensor::from_host<float>(rnd(c.K, ++seed), {c.K}, cpu) : Tensor();
  Tensor gy = Tensor::from_host<float>(rnd(numel_of(ys), ++seed), ys, cpu);
  Tensor y1 = Tensor::zeros(ys, cpu), y2 = Tensor::zeros(ys, cpu);
  conv2d_forward(y1, x, w, b, c.p, cpu);
  simcuda::conv2d_forward(y2, x, w, b, sh, cpu);
  compare("forward", c.name, y2.to_host<float>(), y1.to_host<float>());
  auto sx = rnd(numel_of(xs), 99), sw = rnd(numel_of(ws), 98), sb = rnd(c.K, 97);
  Tensor gx1 = Tensor::from_host<float>(sx, xs, cpu), gx2 = Tensor::from_host<float>(sx, xs, cpu);
  Tensor gw1 = Tensor::from_host<float>(sw, ws, cpu), gw2 = Tensor::from_host<float>(sw, ws, cpu);
  Tensor gb1 = Tensor::from_host<float>(sb, {c.K}, cpu),
         gb2 = Tensor::from_host<float>(sb, {c.K}, cpu);
  conv2d_backward(gx1, gw1, gb1, gy, x, w, c.p, cpu);
  simcuda::conv2d_backward(gx2, gw2, gb2, gy, x, w, sh, cpu);
  compare("grad_x", c.name, gx2.to_host<float>(), gx1.to_host<float>());
  compare("grad_weight", c.name, gw2.to_host<float>(), gw1.to_host<float>());
  compare("grad_bias", c.name, gb2.to_host<float>(), gb1.to_host<float>());
}

// Backward-weight alone into a sentinel-filled grad_weight: against the CPU, the
// split count it ran with (grid z of its GEMM launch), the same bits on a second
// run, and a tampered partial that the comparison must catch when it split.
void backward_weight_checks(const Case& c, unsigned& seed) {
  using simcuda::sim_grids;
  Stream& cpu = default_stream(Device::cpu());
  const auto [xs, ws, ys, sh] = shapes_of(c);
  Tensor x = Tensor::from_host<float>(rnd(numel_of(xs), ++seed), xs, cpu);
  Tensor w = Tensor::from_host<float>(rnd(numel_of(ws), ++seed), ws, cpu);
  Tensor gy = Tensor::from_host<float>(rnd(numel_of(ys), ++seed), ys, cpu);
  const auto sentinel = rnd(numel_of(ws), 98);
  Tensor expected = Tensor::from_host<float>(sentinel, ws, cpu);
  conv2d_backward(Tensor(), expected, Tensor(), gy, x, w, c.p, cpu);
  auto run = [&] {
    Tensor gw = Tensor::from_host<float>(sentinel, ws, cpu);
    sim_grids.clear();
    simcuda::conv2d_backward(Tensor(), gw, Tensor(), gy, x, w, sh, cpu);
    return gw.to_host<float>();
  };
  // Sums of N*P*Q products (up to 4*10^5 here) in a different order than the CPU's.
  const double atol = 2e-4 + 1e-8 * static_cast<double>(c.N * ys[2] * ys[3]);
  const auto first = run();
  const unsigned splits = sim_grids.front().z;
  std::printf("%-24s backward-weight: %u split%s, %zu launch%s\n", c.name, splits,
              splits == 1 ? "" : "s", sim_grids.size(), sim_grids.size() == 1 ? "" : "es");
  compare("grad_weight", c.name, first, expected.to_host<float>(), atol);
  if (splits == 1) return;
  const auto second = run();
  const bool same = std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0;
  std::printf("%-24s grad_weight  second run: %s\n", c.name, same ? "same bits" : "DIFFERENT BITS");
  failures += !same;
  // Control: one partial of the last split off by 1 after the GEMM launch.
  simcuda::sim_after_launch = [](std::size_t launch) {
    if (launch != 0) return;
    float* partial = static_cast<float*>(simcuda::sim_last_scratch);
    partial[simcuda::sim_last_scratch_bytes / sizeof(float) - 1] += 1.0f;
  };
  const auto tampered = run();
  simcuda::sim_after_launch = nullptr;
  const bool caught =
      mismatches("grad_weight", c.name, tampered, expected.to_host<float>(), atol, true) != 0;
  std::printf("%-24s grad_weight  control (one partial +1): %s\n", c.name,
              caught ? "caught" : "NOT CAUGHT");
  failures += !caught;
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when piped to a log
  sim_sms = argc > 1 ? std::atoi(argv[1]) : 8;
  const bool large = argc > 2 && std::string(argv[2]) == "large";
  auto P = [](std::int64_t sh, std::int64_t sw, std::int64_t ph, std::int64_t pw,
              std::int64_t dh = 1,
              std::int64_t dw = 1) { return Conv2dParams{sh, sw, ph, pw, dh, dw}; };
  const std::vector<Case> cases = {
      {"1x1", 3, 4, 5, 7, 5, 1, 1, P(1, 1, 0, 0), true},
      {"1x1_stride2_pad1", 2, 3, 6, 5, 4, 1, 1, P(2, 2, 1, 1), false},
      {"5x5_pad2", 1, 3, 11, 9, 7, 5, 5, P(1, 1, 2, 2), true},
      {"3x3_stride2_ragged", 3, 3, 10, 9, 5, 3, 3, P(2, 2, 1, 1), true},
      {"3x5_stride2x1_pad0x2", 2, 2, 9, 7, 3, 3, 5, P(2, 1, 0, 2), true},
      {"3x3_dilation2", 2, 3, 9, 8, 5, 3, 3, P(1, 1, 2, 2, 2, 2), true},
      {"3x3_stride3_dilation2", 1, 2, 13, 11, 3, 3, 3, P(3, 3, 1, 0, 2, 2), true},
      {"C1_K32", 3, 1, 28, 28, 32, 3, 3, P(1, 1, 1, 1), true},
      {"K_prime_13", 3, 2, 7, 7, 13, 3, 3, P(1, 1, 1, 1), true},
      {"tiles_ragged", 5, 19, 17, 17, 67, 3, 3, P(1, 1, 1, 1), true},
      {"C32_K64_14x14", 2, 32, 14, 14, 64, 3, 3, P(1, 1, 1, 1), true},
      {"C67_K130_stride2", 2, 67, 9, 9, 130, 3, 3, P(2, 2, 1, 1), true},
      {"C20_K40_big", 4, 20, 30, 30, 40, 3, 3, P(1, 1, 1, 1), true},
  };
  // Backward-weight alone: FashionNet's first layer (1 -> 32, 28x28, no bias) at
  // the batches a tower sees, a batch that does not divide into the splits, tiny
  // images (each split must hold several), and one image too short to split.
  std::vector<Case> weight_cases = {
      {"fashion1_b128", 128, 1, 28, 28, 32, 3, 3, P(1, 1, 1, 1), false},
      {"fashion1_b512", 512, 1, 28, 28, 32, 3, 3, P(1, 1, 1, 1), false},
      {"fashion1_b37", 37, 1, 28, 28, 32, 3, 3, P(1, 1, 1, 1), false},
      {"C5_K70_2x2_b200", 200, 5, 2, 2, 70, 1, 1, P(1, 1, 0, 0), false},
      {"unsplit_b1_5x5", 1, 3, 11, 9, 7, 5, 5, P(1, 1, 2, 2), false},
  };
  if (large)
    weight_cases.push_back({"fashion2_b128", 128, 32, 14, 14, 64, 3, 3, P(1, 1, 1, 1), false});
  unsigned seed = 1;
  for (const Case& c : cases) all_passes(c, seed);
  for (const Case& c : weight_cases) backward_weight_checks(c, seed);
  std::printf("blocks simulated: %ld, failures: %d\n", simcuda::sim_blocks_run, failures);
  return failures != 0;
}
