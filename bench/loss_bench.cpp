// Softmax cross-entropy (and MSE) against the memory bandwidth they are bound by:
// the bytes/s of each kernel beside a copy of the logits in the same run (memcpy on
// the CPU, device-to-device cudaMemcpy on CUDA). Sizes: FashionNet's logits
// [128,10] (launch-bound on a GPU: a few microseconds whatever the kernel does) and
// [4096,1000] (an ImageNet-sized head, 16 MB, where the bandwidth shows).
// Bytes counted: forward reads the logits and labels (4NK + 4N); backward reads the
// logits and labels and reads and writes grad_logits (12NK + 4N); MSE reads two
// tensors (8n) and its backward reads three and writes one (16n); the copy 8NK.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include "kernels/loss.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

// Times fn (bench::time_calls) and reports `bytes` per call.
template <typename Fn>
void run(benchmark::State& state, const Stream& stream, std::int64_t bytes, Fn&& fn) {
  bench::time_calls(state, stream, fn);
  state.SetBytesProcessed(state.iterations() * bytes);
}

// Logits in [-5, 5) and labels spread over the classes, as a trained head sees them.
struct Batch {
  Tensor logits, labels;
  Batch(std::int64_t rows, std::int64_t classes, const Stream& stream) {
    std::vector<float> x(static_cast<std::size_t>(rows * classes)),
        y(static_cast<std::size_t>(rows));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>((i * 7919) % 1000) / 100 - 5;
    for (std::size_t n = 0; n < y.size(); ++n) y[n] = static_cast<float>((n * 31) % classes);
    logits = Tensor::from_host<float>(x, {rows, classes}, stream);
    labels = Tensor::from_host<float>(y, {rows}, stream);
  }
};

void BM_CrossEntropyForward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t rows = state.range(0), classes = state.range(1);
  Batch batch(rows, classes, stream);
  Tensor loss = Tensor::zeros({1}, stream);
  run(state, stream, 4 * rows * classes + 4 * rows, [&] {
    softmax_cross_entropy_forward(loss, Tensor(), Tensor(), batch.logits, batch.labels,
                                  Reduction::Mean, stream);
  });
}

void BM_CrossEntropyBackward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t rows = state.range(0), classes = state.range(1);
  Batch batch(rows, classes, stream);
  Tensor grad = bench::random_tensor({rows, classes}, stream, 3);
  Tensor grad_loss = Tensor::from_host<float>(std::vector<float>{1.0f}, {1}, stream);
  run(state, stream, 12 * rows * classes + 4 * rows, [&] {
    softmax_cross_entropy_backward(grad, grad_loss, batch.logits, batch.labels, Reduction::Mean,
                                   stream);
  });
}

// The loss and its gradient (a training step of the loss): the forward writing
// the probabilities and the backward reading them (the exps taken once), or the
// forward alone and a backward that recomputes the softmax. Bytes counted for both:
// the recomputing pair's (forward, backward).
void BM_CrossEntropyStep(benchmark::State& state, Device device, bool from_probs) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t rows = state.range(0), classes = state.range(1);
  Batch batch(rows, classes, stream);
  Tensor loss = Tensor::zeros({1}, stream), probs = Tensor::empty({rows, classes}, stream);
  Tensor grad = bench::random_tensor({rows, classes}, stream, 3);
  Tensor grad_loss = Tensor::from_host<float>(std::vector<float>{1.0f}, {1}, stream);
  run(state, stream, 16 * rows * classes + 8 * rows, [&] {
    if (from_probs) {
      softmax_cross_entropy_forward(loss, probs, Tensor(), batch.logits, batch.labels,
                                    Reduction::Mean, stream);
      softmax_cross_entropy_backward_from_probs(grad, grad_loss, probs, batch.labels,
                                                Reduction::Mean, stream);
    } else {
      softmax_cross_entropy_forward(loss, Tensor(), Tensor(), batch.logits, batch.labels,
                                    Reduction::Mean, stream);
      softmax_cross_entropy_backward(grad, grad_loss, batch.logits, batch.labels, Reduction::Mean,
                                     stream);
    }
  });
}

void BM_MseForward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor pred = bench::random_tensor({n}, stream, 1), target = bench::random_tensor({n}, stream, 2);
  Tensor loss = Tensor::zeros({1}, stream);
  run(state, stream, 8 * n, [&] { mse_forward(loss, pred, target, Reduction::Mean, stream); });
}

void BM_MseBackward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor pred = bench::random_tensor({n}, stream, 1), target = bench::random_tensor({n}, stream, 2);
  Tensor grad = bench::random_tensor({n}, stream, 3);
  Tensor grad_loss = Tensor::from_host<float>(std::vector<float>{1.0f}, {1}, stream);
  run(state, stream, 16 * n,
      [&] { mse_backward(grad, Tensor(), grad_loss, pred, target, Reduction::Mean, stream); });
}

// The reference: a copy of rows * classes floats (8 bytes per element).
void BM_CopyReference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0) * state.range(1);
  Tensor a = Tensor::zeros({n}, stream), b = Tensor::zeros({n}, stream);
  bench::time_copy_reference(state, b, a, stream);
  state.SetBytesProcessed(state.iterations() * 8 * n);
}

}  // namespace

BENCHMARK_CAPTURE(BM_CrossEntropyForward, cpu, Device::cpu())->Args({128, 10})->Args({4096, 1000});
BENCHMARK_CAPTURE(BM_CrossEntropyBackward, cpu, Device::cpu())->Args({128, 10})->Args({4096, 1000});
BENCHMARK_CAPTURE(BM_CrossEntropyStep, cpu_from_probs, Device::cpu(), true)
    ->Args({128, 10})
    ->Args({4096, 1000});
BENCHMARK_CAPTURE(BM_CrossEntropyStep, cpu_recompute, Device::cpu(), false)
    ->Args({128, 10})
    ->Args({4096, 1000});
BENCHMARK_CAPTURE(BM_MseForward, cpu, Device::cpu())->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_MseBackward, cpu, Device::cpu())->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_CopyReference, cpu, Device::cpu())
    ->Args({128, 10})
    ->Args({4096, 1000})
    ->Args({1 << 22, 1});

BENCHMARK_CAPTURE(BM_CrossEntropyForward, cuda, Device::cuda(0))
    ->Args({128, 10})
    ->Args({4096, 1000})
    ->Args({32768, 1000})
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_CrossEntropyBackward, cuda, Device::cuda(0))
    ->Args({128, 10})
    ->Args({4096, 1000})
    ->Args({32768, 1000})
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_CrossEntropyStep, cuda_from_probs, Device::cuda(0), true)
    ->Args({128, 10})
    ->Args({4096, 1000})
    ->Args({32768, 1000})
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_CrossEntropyStep, cuda_recompute, Device::cuda(0), false)
    ->Args({128, 10})
    ->Args({4096, 1000})
    ->Args({32768, 1000})
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_MseForward, cuda, Device::cuda(0))->Arg(1 << 24)->UseManualTime();
BENCHMARK_CAPTURE(BM_MseBackward, cuda, Device::cuda(0))->Arg(1 << 24)->UseManualTime();
BENCHMARK_CAPTURE(BM_CopyReference, cuda, Device::cuda(0))
    ->Args({128, 10})
    ->Args({4096, 1000})
    ->Args({32768, 1000})
    ->Args({1 << 24, 1})
    ->UseManualTime();
