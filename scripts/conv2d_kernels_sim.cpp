// Runs the CUDA conv2d kernels (kernels/cuda/conv2d.cu, turned into C++ by
// scripts/sim_conv2d_kernels.sh) on the host against towerlab's CPU backend:
//   conv2d_kernels_sim SMS [large]
// SMS is the SM count the launchers plan for (tile choice, split counts).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include "kernels/conv2d.h"
#include "towerlab.h"
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
void compare(const char* what, const char* name, const std::vector<float>& a,
             const std::vector<float>& b) {
  int bad = 0;
  double maxerr = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double e = std::abs(a[i] - b[i]);
    maxerr = std::max(maxerr, e);
    if (e > 2e-4 + 1e-4 * std::abs(b[i])) {
      if (bad < 3) std::printf("  %s %s [%zu]: sim %g cpu %g\n", name, what, i, a[i], b[i]);
      ++bad;
    }
  }
  std::printf("%-24s %-12s n=%zu maxerr=%.2e %s\n", name, what, a.size(), maxerr,
              bad ? "FAIL" : "ok");
  failures += bad != 0;
}
int main(int argc, char** argv) {
  sim_sms = argc > 1 ? std::atoi(argv[1]) : 8;
  const bool large = argc > 2 && std::string(argv[2]) == "large";
  auto P = [](std::int64_t sh, std::int64_t sw, std::int64_t ph, std::int64_t pw,
              std::int64_t dh = 1,
              std::int64_t dw = 1) { return Conv2dParams{sh, sw, ph, pw, dh, dw}; };
  std::vector<Case> cases = {
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
  Stream& cpu = default_stream(Device::cpu());
  unsigned seed = 1;
  for (const Case& c : cases) {
    Shape xs{c.N, c.C, c.H, c.W}, ws{c.K, c.C, c.R, c.S};
    Shape ys = conv2d_output_shape(xs, ws, c.p);
    Conv2dShape sh{c.N, c.C, c.H, c.W, c.K, c.R, c.S, ys[2], ys[3], c.p};
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
  std::printf("blocks simulated: %ld, failures: %d\n", simcuda::sim_blocks_run, failures);
  return failures != 0;
}
