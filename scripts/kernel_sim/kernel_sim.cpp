// Runs the CUDA launchers of the kernel families (kernels/cuda/*.cu turned into C++
// by rewrite.py, namespace towerlab::simcuda) on the host and compares every
// output with towerlab's CPU backend (the specification):
//   kernel_sim SMS [FAMILY | control-NAME]
// SMS is the SM count the launchers plan for (grid caps, reduction splits); FAMILY
// picks one family (default: all). The control-NAME programs are wrong on purpose
// and must fail: scripts/sim_kernels.sh checks that they do.
//
// "Device" memory is host memory of exactly the size asked for: the library's
// caching allocator is bypassed (linked with --wrap, see below), since a block
// carved from a 2 MiB segment would hide an overrun from AddressSanitizer.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>

// The families' headers are the rewritten copies (namespace simcuda), found first
// on the include path; towerlab.h would reach the originals beside it.
#include "engine/settings.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/cpu/batchnorm.h"
#include "kernels/cpu/bias.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/cpu/random.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/relu.h"
#include "kernels/cuda/batchnorm.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/pool2d.h"
#include "kernels/cuda/random.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/relu.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "kernels/pool2d.h"
#include "kernels/relu.h"

// --- exact-size device memory ----------------------------------------------------
// The link wraps towerlab::Allocator::allocate and ::deallocate (-Wl,--wrap), so
// every tensor and every launcher's scratch buffer is its own heap block.
extern "C" void* __wrap__ZN8towerlab9Allocator8allocateEmPv(void*, std::size_t bytes, void*) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0) throw std::bad_alloc();
  return p;
}
extern "C" void __wrap__ZN8towerlab9Allocator10deallocateEPv(void*, void* p) {
  std::free(p);
}

using namespace towerlab;
namespace sc = towerlab::simcuda;

namespace {

Stream& host() {
  return default_stream(Device::cpu());
}

std::vector<float> rnd(std::int64_t n, unsigned seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

Tensor tensor(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_host<float>(v, shape, host());
}
Tensor tensor(std::int64_t n, unsigned seed, float lo = -1, float hi = 1) {
  return tensor(rnd(n, seed, lo, hi), {n});
}
// Two identical tensors: one for the CPU reference, one for the simulated kernel.
std::pair<Tensor, Tensor> twin(const std::vector<float>& v, const Shape& shape) {
  return {tensor(v, shape), tensor(v, shape)};
}

int failures = 0, checks = 0;

// sim agrees with cpu within atol + rtol*|cpu|; NaN must meet NaN.
void compare(const std::string& name, const Tensor& sim, const Tensor& cpu, double atol = 1e-6,
             double rtol = 1e-5) {
  const auto a = sim.to_host<float>(), b = cpu.to_host<float>();
  int bad = 0;
  double maxerr = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool nan_a = std::isnan(a[i]), nan_b = std::isnan(b[i]);
    const double e = nan_a || nan_b ? 0.0 : std::abs(double(a[i]) - double(b[i]));
    maxerr = std::max(maxerr, e);
    if (nan_a != nan_b || e > atol + rtol * std::abs(double(b[i]))) {
      if (bad < 3) std::printf("  %s [%zu]: sim %.9g cpu %.9g\n", name.c_str(), i, a[i], b[i]);
      ++bad;
    }
  }
  ++checks;
  failures += bad != 0;
  if (bad != 0 || std::getenv("SIM_VERBOSE") != nullptr) {
    std::printf("%-48s n=%-7zu maxerr=%.2e %s\n", name.c_str(), a.size(), maxerr,
                bad ? "FAIL" : "ok");
  }
}
void compare_index(const std::string& name, std::int64_t sim, std::int64_t cpu) {
  ++checks;
  if (sim != cpu) {
    std::printf("%-48s sim %lld cpu %lld FAIL\n", name.c_str(), static_cast<long long>(sim),
                static_cast<long long>(cpu));
    ++failures;
  }
}

// Sizes: empty, one, around a warp, past a block, and, when planned for one SM (a
// grid of 32 blocks of 256), past the grid twice over, so grid-stride loops wrap.
// (With more SMs that size only costs time: it fits in one pass of the grid.)
std::vector<std::int64_t> sizes() {
  std::vector<std::int64_t> n = {0, 1, 31, 33, 257};
  if (sim_sms == 1) n.push_back(2 * 32 * 256 + 77);
  return n;
}

std::string tag(const char* what, std::int64_t n) {
  return std::string(what) + " n=" + std::to_string(n);
}

// --- families ----------------------------------------------------------------------

void relu() {
  for (std::int64_t n : sizes()) {
    auto xv = rnd(n, 1);
    if (n > 3) xv[3] = NAN;
    Tensor x = tensor(xv, {n});
    auto [y1, y2] = twin(rnd(n, 2), {n});
    cpu::relu_forward(y1, x);
    sc::relu_forward(y2, x, host());
    compare(tag("relu_forward", n), y2, y1);
    Tensor gy = tensor(n, 3);
    for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
      // Sentinel: the gradient's old values show whether it accumulated or assigned.
      auto [g1, g2] = twin(rnd(n, 4), {n});
      cpu::relu_backward(g1, gy, y1, write);
      sc::relu_backward(g2, gy, y1, host(), write);
      compare(tag(write == GradWrite::Assign ? "relu_backward assign" : "relu_backward", n), g2,
              g1);
    }
  }
}

void elementwise() {
  for (std::int64_t n : sizes()) {
    Tensor a = tensor(n, 5), b = tensor(n, 6), s = tensor(1, 7);
    auto [f1, f2] = twin(rnd(n, 8), {n});
    cpu::fill(f1, 0.375);
    sc::fill(f2, 0.375f, host());
    compare(tag("fill", n), f2, f1);
    sc::copy(f2, a, host());
    compare(tag("copy", n), f2, a, 0, 0);
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul}) {
      auto [o1, o2] = twin(rnd(n, 9), {n});
      cpu::binary(op, o1, a, b);
      sc::binary(op, o2, a, b, host());
      compare(tag("binary", n) + " op=" + std::to_string(int(op)), o2, o1);
      auto [i1, i2] = twin(a.to_host<float>(), {n});  // out aliasing a
      cpu::binary(op, i1, i1, b);
      sc::binary(op, i2, i2, b, host());
      compare(tag("binary in place", n), i2, i1);
    }
    auto [o1, o2] = twin(rnd(n, 10), {n});
    cpu::scale(o1, a, -1.5);
    sc::scale(o2, a, -1.5f, host());
    compare(tag("scale", n), o2, o1);
    cpu::axpy(o1, 0.25, b);
    sc::axpy(o2, 0.25f, b, host());
    compare(tag("axpy", n), o2, o1);
    cpu::axpy_scalar(o1, 2.0, s);
    sc::axpy_scalar(o2, 2.0f, s, host());
    compare(tag("axpy_scalar", n), o2, o1);
  }
}

void random_fill() {
  for (std::int64_t n : sizes()) {
    for (Distribution d : {Distribution::Uniform, Distribution::Normal}) {
      auto [x1, x2] = twin(rnd(n, 11), {n});
      cpu::random(x1, d, 1234, 7, -0.5f, 2.0f);
      sc::random(x2, d, 1234, 7, -0.5f, 2.0f, host());
      compare(tag(d == Distribution::Uniform ? "random uniform" : "random normal", n), x2, x1, 0,
              0);
    }
  }
}

void reduce() {
  for (std::int64_t n : sizes()) {
    Tensor x = tensor(n, 12);
    auto [o1, o2] = twin({9.0f}, {1});
    cpu::sum(o1, x, 1.0);
    sc::sum(o2, x, 1.0f, host());
    compare(tag("sum", n), o2, o1, 1e-5, 1e-5);
    cpu::sum(o1, x, 1.0 / std::max<std::int64_t>(n, 1));
    sc::sum(o2, x, 1.0f / static_cast<float>(std::max<std::int64_t>(n, 1)), host());
    compare(tag("sum scaled", n), o2, o1, 1e-6, 1e-5);
    compare_index(tag("first_nonfinite none", n), sc::first_nonfinite(x, host()),
                  cpu::first_nonfinite(x));
    if (n == 0) continue;
    for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
      auto v = rnd(n, 13);
      v[static_cast<std::size_t>(at)] = at % 2 ? INFINITY : NAN;
      if (at + 7 < n) v[static_cast<std::size_t>(at + 7)] = NAN;  // a later one must lose
      Tensor y = tensor(v, {n});
      compare_index(tag("first_nonfinite", n) + " at=" + std::to_string(at),
                    sc::first_nonfinite(y, host()), cpu::first_nonfinite(y));
    }
  }
}

void loss() {
  for (std::int64_t n : sizes()) {
    Tensor p = tensor(n, 14), t = tensor(n, 15);
    auto [l1, l2] = twin({5.0f}, {1});
    cpu::squared_error_sum(l1, p, t, 0.5);
    sc::squared_error_sum(l2, p, t, 0.5f, host());
    compare(tag("squared_error_sum", n), l2, l1, 1e-5, 1e-5);
    cpu::square_sum(l1, p, 0.25);
    sc::square_sum(l2, p, 0.25f, host());
    compare(tag("square_sum", n), l2, l1, 1e-5, 1e-5);
    Tensor gl = tensor(std::vector<float>{1.5f}, {1});
    auto [gp1, gp2] = twin(rnd(n, 16), {n});
    auto [gt1, gt2] = twin(rnd(n, 17), {n});
    cpu::mse_backward(gp1, gt1, gl, p, t, 0.5);
    sc::mse_backward(gp2, gt2, gl, p, t, 0.5f, host());
    compare(tag("mse_backward grad_pred", n), gp2, gp1);
    compare(tag("mse_backward grad_target", n), gt2, gt1);
    cpu::mse_backward(Tensor(), gt1, gl, p, t, 0.5);
    sc::mse_backward(Tensor(), gt2, gl, p, t, 0.5f, host());
    compare(tag("mse_backward target only", n), gt2, gt1);
    cpu::l2_loss_backward(gp1, gl, p, 0.01);
    sc::l2_loss_backward(gp2, gl, p, 0.01f, host());
    compare(tag("l2_loss_backward", n), gp2, gp1);
  }
  // Cross-entropy: one warp per row; K below, at and past the warp, rows past a
  // block's 8 warps and (32 blocks of 8 warps with SMS = 1) past the grid.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{0, 10},  {1, 1},   {1, 10},  {9, 31},
                                                          {33, 32}, {17, 33}, {5, 100}, {300, 3}};
  for (auto [rows, K] : shapes) {
    const std::string shape = " [" + std::to_string(rows) + "," + std::to_string(K) + "]";
    Tensor logits = tensor(rnd(rows * K, 18, -4, 4), {rows, K});
    std::vector<float> lv(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) lv[static_cast<std::size_t>(i)] = float((i * 7) % K);
    Tensor labels = tensor(lv, {rows});
    compare_index("first_invalid_label none" + shape, sc::first_invalid_label(labels, K, host()),
                  cpu::first_invalid_label(labels, K));
    if (rows > 4) {  // not class ids (the dispatcher stops before the loss kernels see them)
      auto bad = lv;
      bad[4] = 0.5f;
      bad[rows - 1] = static_cast<float>(K);
      Tensor bad_labels = tensor(bad, {rows});
      compare_index("first_invalid_label" + shape, sc::first_invalid_label(bad_labels, K, host()),
                    cpu::first_invalid_label(bad_labels, K));
    }
    auto [l1, l2] = twin({5.0f}, {1});
    auto [pr1, pr2] = twin(rnd(rows * K, 19), {rows, K});
    auto [pd1, pd2] = twin(rnd(rows, 20), {rows});
    cpu::softmax_cross_entropy_forward(l1, pr1, pd1, logits, labels, 0.125);
    sc::softmax_cross_entropy_forward(l2, pr2, pd2, logits, labels, 0.125f, host());
    compare("cross_entropy loss" + shape, l2, l1, 1e-5, 1e-5);
    compare("cross_entropy probs" + shape, pr2, pr1, 1e-6, 1e-5);
    compare("cross_entropy predictions" + shape, pd2, pd1, 0, 0);
    cpu::softmax_cross_entropy_forward(l1, Tensor(), Tensor(), logits, labels, 1.0);
    sc::softmax_cross_entropy_forward(l2, Tensor(), Tensor(), logits, labels, 1.0f, host());
    compare("cross_entropy loss only" + shape, l2, l1, 1e-5, 1e-5);
    Tensor gl = tensor(std::vector<float>{0.75f}, {1});
    auto [g1, g2] = twin(rnd(rows * K, 21), {rows, K});
    cpu::softmax_cross_entropy_backward(g1, gl, logits, labels, 0.5);
    sc::softmax_cross_entropy_backward(g2, gl, logits, labels, 0.5f, host());
    compare("cross_entropy backward" + shape, g2, g1, 1e-6, 1e-5);
    // From the probs of the forward above: the same gradient without the second softmax.
    auto [gp1, gp2] = twin(rnd(rows * K, 22), {rows, K});
    cpu::softmax_cross_entropy_backward_from_probs(gp1, gl, pr1, labels, 0.5);
    sc::softmax_cross_entropy_backward_from_probs(gp2, gl, pr2, labels, 0.5f, host());
    compare("cross_entropy backward from probs" + shape, gp2, gp1, 1e-6, 1e-5);
  }
}

void optimizer() {
  for (std::int64_t n : sizes()) {
    // offset 0: 16-byte aligned, the float4 path; offset 1: the scalar path.
    for (std::int64_t offset : {0, 1}) {
      const std::string at = tag("", n) + (offset ? " unaligned" : "");
      auto buffers = [&](unsigned seed) {
        auto [a, b] = twin(rnd(n + offset, seed, 0.1f, 1.0f), {n + offset});
        return std::make_pair(a.view(offset, {n}), b.view(offset, {n}));
      };
      Tensor g = tensor(n, 22);
      {
        auto [p1, p2] = buffers(23);
        auto [v1, v2] = buffers(24);
        SgdParams sgd{0.1, 0.9, 0.01, true};
        cpu::sgd_update(p1, g, v1, sgd);
        sc::sgd_update(p2, g, v2, sgd, host());
        compare("sgd nesterov param" + at, p2, p1);
        compare("sgd nesterov velocity" + at, v2, v1);
        cpu::sgd_update(p1, g, Tensor(), SgdParams{0.1, 0, 0.01, false});
        sc::sgd_update(p2, g, Tensor(), SgdParams{0.1, 0, 0.01, false}, host());
        compare("sgd plain param" + at, p2, p1);
      }
      for (bool centered : {false, true}) {
        auto [p1, p2] = buffers(25);
        auto [ms1, ms2] = buffers(26);
        auto [mo1, mo2] = buffers(27);
        auto [mg1, mg2] = buffers(28);
        RmspropParams rms{0.01, 0.9, 0.5, 1e-7, centered};
        cpu::rmsprop_update(p1, g, ms1, mo1, centered ? mg1 : Tensor(), rms);
        sc::rmsprop_update(p2, g, ms2, mo2, centered ? mg2 : Tensor(), rms, host());
        const std::string which = centered ? "rmsprop centered" : "rmsprop";
        compare(which + " param" + at, p2, p1, 1e-6, 1e-5);
        compare(which + " moment" + at, mo2, mo1, 1e-6, 1e-5);
        if (centered) compare(which + " mean_grad" + at, mg2, mg1);
      }
      {
        auto [p1, p2] = buffers(29);
        auto [m1, m2] = buffers(30);
        auto [v1, v2] = buffers(31);
        const AdamStep step{
            0.9, 0.999, 1e-8, 0.01, 0.999, 0.001 / (1 - 0.9 * 0.9), std::sqrt(1 - 0.999 * 0.999)};
        cpu::adam_update(p1, g, m1, v1, step);
        sc::adam_update(p2, g, m2, v2, step, host());
        compare("adam param" + at, p2, p1, 1e-6, 1e-5);
        compare("adam v" + at, v2, v1, 1e-7, 1e-5);
      }
    }
  }
}

void pool2d() {
  struct Case {
    std::int64_t N, C, H, W;
    Pool2dParams p;
  };
  const Case cases[] = {
      {1, 1, 1, 1, Pool2dParams::square(1, 1)},        {2, 3, 4, 4, Pool2dParams::square(2, 2)},
      {1, 2, 7, 5, Pool2dParams::square(2, 2)},         // ragged: the last row/column dropped
      {2, 1, 9, 8, Pool2dParams::square(3, 2, 1)},      // overlapping, padded
      {1, 3, 6, 11, Pool2dParams{3, 2, 1, 3, 1, 0}},    // stride 1 rows, 3 columns
      {3, 5, 13, 13, Pool2dParams::square(3, 1, 1)},    // every input under 9 windows
      {2, 33, 17, 19, Pool2dParams{2, 3, 2, 2, 0, 1}},  // more outputs than a grid at SMS = 1
  };
  for (const Case& c : cases) {
    const Shape xs{c.N, c.C, c.H, c.W};
    const Shape ys = pool2d_output_shape(xs, c.p);
    const std::string shape = " x" + to_string(xs) + " y" + to_string(ys);
    auto xv = rnd(numel_of(xs), 32);
    if (xv.size() > 5) xv[5] = NAN;
    for (std::size_t i = 7; i + 1 < xv.size(); i += 29) xv[i + 1] = xv[i];  // ties
    Tensor x = tensor(xv, xs), gy = tensor(rnd(numel_of(ys), 33), ys);
    auto [y1, y2] = twin(rnd(numel_of(ys), 34), ys);
    auto [g1, g2] = twin(rnd(numel_of(xs), 35), xs);
    cpu::max_pool2d_forward(y1, x, c.p);
    sc::max_pool2d_forward(y2, x, c.p, host());
    compare("max_pool2d_forward" + shape, y2, y1, 0, 0);
    cpu::max_pool2d_backward(g1, gy, x, c.p);
    sc::max_pool2d_backward(g2, gy, x, c.p, host());
    compare("max_pool2d_backward" + shape, g2, g1);
    auto [a1, a2] = twin(rnd(numel_of(ys), 36), ys);
    cpu::max_pool2d_forward_with_argmax(y1, a1, x, c.p);
    sc::max_pool2d_forward_with_argmax(y2, a2, x, c.p, host());
    compare("max_pool2d_forward_with_argmax y" + shape, y2, y1, 0, 0);
    compare("max_pool2d_forward_with_argmax argmax" + shape, a2, a1, 0, 0);
    for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
      auto [gf1, gf2] = twin(rnd(numel_of(xs), 37), xs);
      cpu::max_pool2d_backward_from_argmax(gf1, gy, a1, write);
      sc::max_pool2d_backward_from_argmax(gf2, gy, a1, c.p, host(), write);
      compare(std::string("max_pool2d_backward_from_argmax") +
                  (write == GradWrite::Assign ? " assign" : "") + shape,
              gf2, gf1);
    }
    cpu::avg_pool2d_forward(y1, x, c.p);
    sc::avg_pool2d_forward(y2, x, c.p, host());
    compare("avg_pool2d_forward" + shape, y2, y1);
    cpu::avg_pool2d_backward(g1, gy, c.p);
    sc::avg_pool2d_backward(g2, gy, c.p, host());
    compare("avg_pool2d_backward" + shape, g2, g1);
  }
}

// [N, C, S] shapes for the per-channel families: C = 1, ragged S, S = 1, many
// channels, and per-channel counts past 2048 (8 values per thread of a 256-thread
// block), where a reduction splits each channel over several blocks (per_channel.cuh's
// splits_for): [1,1,5000] takes 3 splits, bound by the work; [1,5,4097] takes 2
// when planned for 1 SM (bound by the SM count) and 3 for 8 or 132. Chunks are
// ragged: the last block of a channel gets fewer values.
struct NCS {
  std::int64_t N, C, S;
};
const NCS kChannelShapes[] = {{1, 1, 1},  {2, 1, 5},   {3, 4, 7},    {2, 3, 1},
                              {5, 2, 33}, {2, 33, 40}, {1, 1, 5000}, {1, 5, 4097}};

std::string ncs(const NCS& d) {
  return " [" + std::to_string(d.N) + "," + std::to_string(d.C) + "," + std::to_string(d.S) + "]";
}

void bias() {
  for (const NCS& d : kChannelShapes) {
    const std::int64_t n = d.N * d.C * d.S;
    Tensor x = tensor(rnd(n, 36), {n}), b = tensor(d.C, 37);
    auto [y1, y2] = twin(rnd(n, 38), {n});
    cpu::bias_add_forward(y1, x, b, d.N, d.C, d.S);
    sc::bias_add_forward(y2, x, b, d.N, d.C, d.S, host());
    compare("bias_add_forward" + ncs(d), y2, y1);
    auto [gb1, gb2] = twin(rnd(d.C, 39), {d.C});
    cpu::bias_add_backward(gb1, x, d.N, d.C, d.S);
    sc::bias_add_backward(gb2, x, d.N, d.C, d.S, host());
    compare("bias_add_backward" + ncs(d), gb2, gb1, 1e-4, 1e-5);
    auto [yr1, yr2] = twin(rnd(n, 40), {n});
    cpu::bias_add_relu_forward(yr1, x, b, d.N, d.C, d.S);
    sc::bias_add_relu_forward(yr2, x, b, d.N, d.C, d.S, host());
    compare("bias_add_relu_forward" + ncs(d), yr2, yr1, 0, 0);
    Tensor gy = tensor(n, 41);
    for (bool with_grad_x : {true, false}) {
      const std::string what = with_grad_x ? " grad_x" : " no grad_x";
      auto [gx1, gx2] = twin(rnd(n, 42), {n});
      cpu::bias_add_relu_backward(with_grad_x ? gx1 : Tensor(), gb1, gy, yr1, d.N, d.C, d.S);
      sc::bias_add_relu_backward(with_grad_x ? gx2 : Tensor(), gb2, gy, yr1, d.N, d.C, d.S, host());
      compare("bias_add_relu_backward grad_bias" + what + ncs(d), gb2, gb1, 1e-4, 1e-5);
      compare("bias_add_relu_backward grad_x" + what + ncs(d), gx2, gx1, 0, 0);
    }
  }
}

// Each entry point with both activations: the ReLU forms clamp y and mask grad_y by
// the forward's y > 0, which the backwards recompute from x, gamma and beta (with
// beta in [-1, 1) and gamma in [0.5, 1.5), a good share of y is clamped).
void batchnorm() {
  for (const NCS& d : kChannelShapes) {
    const std::int64_t n = d.N * d.C * d.S, C = d.C, count = d.N * d.S;
    if (count < 2) continue;           // the dispatcher rejects training statistics of one value
    auto xv = rnd(n, 40, 2.0f, 5.0f);  // a mean far from 0: the shifted sums matter
    BatchNormArgs a;                   // the CPU's arguments; `s` below, the simulator's
    a.N = d.N;
    a.C = C;
    a.S = d.S;
    a.x = tensor(xv, {n});
    a.gamma = tensor(C, 41, 0.5f, 1.5f);
    a.beta = tensor(C, 42);
    a.count = count;
    a.eps = 1e-5;
    a.momentum = 0.9;
    BatchNormArgs s = a;
    std::tie(a.mean, s.mean) = twin(rnd(C, 43), {C});
    std::tie(a.m2, s.m2) = twin(rnd(C, 44), {C});
    cpu::batchnorm_stats(a);
    sc::batchnorm_stats(s, host());
    compare("batchnorm_stats mean" + ncs(d), s.mean, a.mean, 1e-5, 1e-5);
    compare("batchnorm_stats m2" + ncs(d), s.m2, a.m2, 1e-4, 1e-4);
    s.mean = a.mean;  // the CPU's statistics feed both from here on
    s.m2 = a.m2;
    {
      Tensor mean_b = tensor(C, 45), m2_b = tensor(C, 46, 0.0f, 3.0f);
      auto [ma1, ma2] = twin(a.mean.to_host<float>(), {C});
      auto [va1, va2] = twin(a.m2.to_host<float>(), {C});
      cpu::batchnorm_merge_stats(ma1, va1, count, mean_b, m2_b, 7);
      sc::batchnorm_merge_stats(ma2, va2, count, mean_b, m2_b, 7, host());
      compare("batchnorm_merge_stats mean" + ncs(d), ma2, ma1, 1e-6, 1e-5);
      compare("batchnorm_merge_stats m2" + ncs(d), va2, va1, 1e-5, 1e-5);
    }
    for (Activation act : {Activation::None, Activation::ReLU}) {
      a.activation = s.activation = act;
      const std::string relu = act == Activation::ReLU ? " relu" : "";
      std::tie(a.y, s.y) = twin(rnd(n, 47), {n});
      std::tie(a.inv_std, s.inv_std) = twin(rnd(C, 48), {C});
      for (bool moving : {true, false}) {
        const std::string what = relu + (moving ? " moving" : " no moving");
        std::tie(a.moving_mean, s.moving_mean) = twin(rnd(C, 49), {C});
        std::tie(a.moving_var, s.moving_var) = twin(rnd(C, 50, 0.5f, 2.0f), {C});
        if (!moving) a.moving_mean = a.moving_var = s.moving_mean = s.moving_var = Tensor();
        cpu::batchnorm_forward_from_stats(a);
        sc::batchnorm_forward_from_stats(s, host());
        compare("batchnorm_forward_from_stats y" + what + ncs(d), s.y, a.y, 1e-5, 1e-5);
        compare("batchnorm_forward_from_stats inv_std" + what + ncs(d), s.inv_std, a.inv_std, 1e-6,
                1e-5);
        if (moving) {
          compare("batchnorm_forward_from_stats moving_var" + what + ncs(d), s.moving_var,
                  a.moving_var, 1e-6, 1e-5);
        }
      }
      {  // inference, in place: y aliases x
        BatchNormArgs ai = a, si = s;
        std::tie(ai.x, si.x) = twin(xv, {n});
        ai.y = ai.x;
        si.y = si.x;
        ai.moving_mean = si.moving_mean = tensor(C, 49);
        ai.moving_var = si.moving_var = tensor(C, 50, 0.5f, 2.0f);
        ai.eps = si.eps = 1e-3;
        cpu::batchnorm_forward_inference(ai);
        sc::batchnorm_forward_inference(si, host());
        compare("batchnorm_forward_inference in place" + relu + ncs(d), si.y, ai.y, 1e-5, 1e-5);
      }
      s.inv_std = a.inv_std;  // the CPU's, as the statistics above
      a.grad_y = s.grad_y = tensor(n, 51);
      std::tie(a.sum_grad_y, s.sum_grad_y) = twin(rnd(C, 52), {C});
      std::tie(a.sum_grad_y_xhat, s.sum_grad_y_xhat) = twin(rnd(C, 53), {C});
      cpu::batchnorm_backward_reduce(a);
      sc::batchnorm_backward_reduce(s, host());
      compare("batchnorm_backward_reduce sum_grad_y" + relu + ncs(d), s.sum_grad_y, a.sum_grad_y,
              1e-4, 1e-5);
      compare("batchnorm_backward_reduce sum_grad_y_xhat" + relu + ncs(d), s.sum_grad_y_xhat,
              a.sum_grad_y_xhat, 1e-4, 1e-4);
      s.sum_grad_y = a.sum_grad_y;
      s.sum_grad_y_xhat = a.sum_grad_y_xhat;
      for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
        a.grad_x_write = s.grad_x_write = write;
        std::tie(a.grad_x, s.grad_x) = twin(rnd(n, 54), {n});
        cpu::batchnorm_backward_apply(a);
        sc::batchnorm_backward_apply(s, host());
        compare(std::string("batchnorm_backward_apply") +
                    (write == GradWrite::Assign ? " assign" : "") + relu + ncs(d),
                s.grad_x, a.grad_x, 1e-5, 1e-5);
      }
    }
  }
}

// --- controls: wrong on purpose, each must make its run fail ---------------------------

constexpr unsigned kControlBlock = 64;

// launch.cuh's block_sum, twice in a row (the second call reuses its shared memory).
// Passes as written; scripts/sim_kernels.sh also builds it with block_sum's first
// barrier removed, and ThreadSanitizer must then report the race on warp_sums.
__global__ void control_block_sum_kernel(float* out) {
  const float v = static_cast<float>(threadIdx.x);
  const float a = sc::block_sum<kControlBlock>(v);
  const float b = sc::block_sum<kControlBlock>(2 * v);
  if (threadIdx.x == 0) out[blockIdx.x] = a + b;
}

// Reverses a tile through shared memory with the barrier between the write and the
// read missing: a data race ThreadSanitizer must report.
__global__ void control_missing_barrier_kernel(float* out) {
  __shared__ float tile[kControlBlock];
  tile[threadIdx.x] = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = tile[kControlBlock - 1 - threadIdx.x];
}

// Lanes of one warp trade values through shared memory with no __syncwarp: a lane
// may read its partner's slot before the partner wrote it (on sm_70+ lanes are not
// in lockstep). ThreadSanitizer must report it.
__global__ void control_missing_syncwarp_kernel(float* out) {
  __shared__ float slots[32];
  const unsigned lane = threadIdx.x % 32;
  if (threadIdx.x < 32) {
    slots[lane] = static_cast<float>(lane);
    out[lane] = slots[lane ^ 1];
  }
}

// A grid-stride loop that runs one element past the end of a tensor: since device
// memory here is exact-size heap blocks, AddressSanitizer must report the write.
__global__ void control_out_of_bounds_kernel(float* x, std::int64_t n) {
  for (std::int64_t i = threadIdx.x; i <= n; i += blockDim.x) x[i] = 1.0f;
}

// Half the warp has returned when the other half shuffles with the full mask.
__global__ void control_shuffle_exited_kernel(float* out) {
  if (threadIdx.x % 32 >= 16) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}

// The full-mask shuffle sits in a branch half the warp does not take (those lanes
// wait at the block barrier instead): a hang on the device, a report here.
__global__ void control_shuffle_divergent_kernel(float* out) {
  float v = 1.0f;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

// A lane reads from a lane outside the mask: an undefined value on the device.
__global__ void control_shuffle_outside_mask_kernel(float* out) {
  float v = 1.0f;
  if (threadIdx.x % 32 < 16) v = __shfl_down_sync(0x0000ffffu, v, 8);
  out[threadIdx.x] = v;
}

bool control(const std::string& name) {
  std::vector<float> out(2 * kControlBlock, 0.0f);
  if (name == "control-block-sum") {
    sim_launch(2, kControlBlock, control_block_sum_kernel, out.data());
    const float expected = 3.0f * kControlBlock * (kControlBlock - 1) / 2;  // sum v + sum 2v
    std::printf("control-block-sum: %g and %g, expected %g\n", out[0], out[1], expected);
    return out[0] == expected && out[1] == expected;
  }
  if (name == "control-out-of-bounds") {
    Tensor x = Tensor::zeros({33}, host());
    sim_launch(1, kControlBlock, control_out_of_bounds_kernel, x.data<float>(), std::int64_t{33});
  } else if (name == "control-missing-barrier") {
    sim_launch(1, kControlBlock, control_missing_barrier_kernel, out.data());
  } else if (name == "control-missing-syncwarp") {
    sim_launch(1, kControlBlock, control_missing_syncwarp_kernel, out.data());
  } else if (name == "control-shuffle-exited") {
    sim_launch(1, kControlBlock, control_shuffle_exited_kernel, out.data());
  } else if (name == "control-shuffle-divergent") {
    sim_launch(1, kControlBlock, control_shuffle_divergent_kernel, out.data());
  } else if (name == "control-shuffle-outside-mask") {
    sim_launch(1, kControlBlock, control_shuffle_outside_mask_kernel, out.data());
  } else {
    std::fprintf(stderr, "unknown control %s\n", name.c_str());
    return false;
  }
  std::printf("%s: ran to the end\n", name.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  sim_sms = argc > 1 ? std::atoi(argv[1]) : 8;
  // The CPU references run on the calling thread. This program is instrumented, but
  // the libtowerlab.a it links is not: ThreadSanitizer would not see the host pool's
  // synchronization (inline atomics in uninstrumented code), yet it intercepts the
  // memset a pool worker calls (the assign-mode fill of max_pool2d_backward_from_argmax)
  // and reported it racing with this thread's read of the result. The pool itself is
  // checked where the whole library is instrumented: the suite's ThreadSanitizer stage
  // runs the ThreadPool* tests, those kernels included.
  towerlab::set_num_threads(1);
  const std::string only = argc > 2 ? argv[2] : "all";
  if (only.rfind("control-", 0) == 0) return control(only) ? 0 : 1;
  const std::pair<const char*, void (*)()> families[] = {
      {"relu", relu},           {"elementwise", elementwise},
      {"random", random_fill},  {"reduce", reduce},
      {"loss", loss},           {"optimizer", optimizer},
      {"pool2d", pool2d},       {"bias", bias},
      {"batchnorm", batchnorm},
  };
  bool known = false;
  for (auto [name, run] : families) {
    if (only != "all" && only != name) continue;
    known = true;
    const long blocks = sim_blocks_run;
    const int before = failures, checks_before = checks;
    run();
    std::printf("%-12s %4d checks, %3d failed, %6ld blocks (planned for %d SMs)\n", name,
                checks - checks_before, failures - before, sim_blocks_run - blocks, sim_sms);
  }
  if (!known) {
    std::fprintf(stderr, "unknown family %s\n", only.c_str());
    return 2;
  }
  return failures != 0;
}
