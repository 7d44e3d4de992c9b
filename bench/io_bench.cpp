// File formats against the limits they are bound by, on the host:
//   save_safetensors  vs  write() + fsync() of the same bytes to one file (the disk);
//                         the atomic save adds a rename and a directory fsync
//   load_safetensors  vs  pread() of the same file into one buffer (the page cache)
//   Batcher           vs  memcpy of the same bytes (a gather of random rows cannot beat it)
//   read_idx          the real gzip'ed training images: zlib's inflate is the limit
// Files go to $TMPDIR (or /tmp): the numbers are that file system's. Wall-clock time
// (fsync waits without using the CPU).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "engine/dataset.h"
#include "engine/idx.h"
#include "engine/safetensors.h"
#include "models/fashion_net.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

std::string scratch_file(const char* name) {
  const char* tmp = std::getenv("TMPDIR");
  return (std::filesystem::path(tmp ? tmp : "/tmp") / name).string();
}

Tensor host_tensor(std::int64_t n) {
  return Tensor::zeros({n}, Device::cpu());
}

void BM_SaveSafetensors(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const Tensor t = host_tensor(n);
  const std::string path = scratch_file("towerlab_bench.safetensors");
  for (auto _ : state) save_safetensors(path, {{"w", t}});
  std::filesystem::remove(path);
  state.SetBytesProcessed(state.iterations() * n * 4);
}

void BM_WriteFsyncReference(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const Tensor t = host_tensor(n);
  const std::string path = scratch_file("towerlab_bench.raw");
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char* p = static_cast<const char*>(t.raw_data());
    for (std::size_t left = t.nbytes(); left > 0;) {
      const ssize_t w = ::write(fd, p, left);
      if (w <= 0) break;
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    ::fsync(fd);
    ::close(fd);
  }
  std::filesystem::remove(path);
  state.SetBytesProcessed(state.iterations() * n * 4);
}

void BM_LoadSafetensors(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const std::string path = scratch_file("towerlab_bench_load.safetensors");
  save_safetensors(path, {{"w", host_tensor(n)}});
  for (auto _ : state) benchmark::DoNotOptimize(load_safetensors(path, Device::cpu()));
  std::filesystem::remove(path);
  state.SetBytesProcessed(state.iterations() * n * 4);
}

void BM_PreadReference(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const std::string path = scratch_file("towerlab_bench_pread.safetensors");
  save_safetensors(path, {{"w", host_tensor(n)}});
  std::vector<char> buffer(static_cast<std::size_t>(n) * 4);
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    std::size_t got = 0;
    while (got < buffer.size()) {
      const ssize_t r =
          ::pread(fd, buffer.data() + got, buffer.size() - got, static_cast<off_t>(got));
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    ::close(fd);
    benchmark::DoNotOptimize(buffer.data());
  }
  std::filesystem::remove(path);
  state.SetBytesProcessed(state.iterations() * n * 4);
}

// One epoch of FashionNet-sized batches (128 images of 1x28x28) over N samples.
void BM_BatcherEpoch(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor images = Tensor::zeros({n, 1, 28, 28}, Device::cpu());
  Tensor labels = Tensor::zeros({n}, Device::cpu());
  Batcher batcher(images, labels, 128, 1);
  std::uint64_t epoch = 0;
  for (auto _ : state) {
    batcher.start_epoch(epoch++);
    for (Batch batch; batcher.next(batch);) benchmark::DoNotOptimize(batch.images.raw_data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 784 * 4);
}

void BM_MemcpyReference(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<float> from(static_cast<std::size_t>(n) * 784), to(from.size());
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size() * 4);
    benchmark::DoNotOptimize(to.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 784 * 4);
}

void BM_ReadIdxFashionMnistTrain(benchmark::State& state) {
  const std::string path = std::string(models::kFashionMnistDir) + "/train-images-idx3-ubyte.gz";
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("Fashion-MNIST not installed");
    return;
  }
  std::size_t bytes = 0;
  for (auto _ : state) bytes = read_idx(path).data.size();
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
}

}  // namespace

BENCHMARK(BM_SaveSafetensors)
    ->Name("cpu/save_safetensors")
    ->Arg(1 << 20)
    ->Arg(16 << 20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_WriteFsyncReference)
    ->Name("cpu/write_fsync_reference")
    ->Arg(1 << 20)
    ->Arg(16 << 20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_LoadSafetensors)
    ->Name("cpu/load_safetensors")
    ->Arg(1 << 20)
    ->Arg(16 << 20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_PreadReference)
    ->Name("cpu/pread_reference")
    ->Arg(1 << 20)
    ->Arg(16 << 20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_BatcherEpoch)
    ->Name("cpu/batcher_epoch_b128")
    ->Arg(60000)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MemcpyReference)
    ->Name("cpu/memcpy_reference")
    ->Arg(60000)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_ReadIdxFashionMnistTrain)
    ->Name("cpu/read_idx_fashion_mnist_train")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
