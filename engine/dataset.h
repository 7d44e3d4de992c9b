// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017): 28x28 grey images of clothing in
// ten classes, 60000 for training and 10000 for testing, in the IDX format. And a
// Batcher that walks any (images, labels) pair in seeded shuffled batches.
//
//   FashionMnist train = load_fashion_mnist(dir, Split::Train);  // dir holds the .gz files
//   Batcher batcher(train.images, train.labels, 128, /*seed=*/42);
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     batcher.start_epoch(epoch);
//     for (Batch batch; batcher.next(batch);) { ... batch.images [B,1,28,28] ... }
//   }
//
// Letters: N images in the split, B images in a batch (the last batch of an epoch may
// be smaller: nothing is dropped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor.h"

namespace towerlab {

// Statistics of the training images scaled to [0,1] (the values torchvision users
// quote), used by PixelScale::Standardized.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

enum class Split { Train, Test };

enum class PixelScale {
  Standardized,  // (pixel / 255 - 0.2860) / 0.3530: mean ~0 and std ~1 over the training set
  UnitRange,     // pixel / 255, in [0, 1]
};

struct FashionMnist {
  Tensor images;  // float32 [N,1,28,28] on the CPU
  Tensor labels;  // float32 [N] on the CPU: class ids 0..9, as losses take them
  std::vector<std::uint8_t> raw_labels;  // [N]: the same ids as bytes
  std::int64_t size() const { return static_cast<std::int64_t>(raw_labels.size()); }
};

// "T-shirt/top", "Trouser", ..., "Ankle boot" for ids 0..9; throws InvalidArgument otherwise.
const char* fashion_mnist_class_name(int label);

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, gzip-compressed (".gz") or
// not. Throws IoError when the files are missing, with how to install them:
//   "Fashion-MNIST not found in DIR: install it with `sudo apt-get install
//    dataset-fashion-mnist` (files go to /usr/share/datasets/fashion-mnist) or pass --data DIR"
// and when they are malformed (see read_idx) or inconsistent (image and label counts
// differ, images not 28x28, a label outside 0..9).
FashionMnist load_fashion_mnist(const std::string& dir, Split split,
                                PixelScale scale = PixelScale::Standardized);

// A permutation of 0..n-1 that is a pure function of (seed, epoch): Fisher-Yates
// driven by std::mt19937_64 (whose output the C++ standard fixes) with an unbiased
// bounded draw of our own (std::uniform_int_distribution differs between standard
// libraries), so every platform gets the same order and an interrupted run can
// resume at any epoch.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::uint64_t epoch);

enum class Order { Shuffled, Sequential };

struct Batch {
  Tensor images;                      // float32 [B, ...] on the CPU
  Tensor labels;                      // float32 [B] on the CPU
  std::vector<std::int64_t> indices;  // [B]: which samples, for tracing a prediction back
  std::int64_t size() const { return static_cast<std::int64_t>(indices.size()); }
};

// Walks images [N, ...] and labels [N] (float32, on the CPU) in batches of
// `batch_size`, ceil(N / batch_size) batches an epoch, every sample exactly once.
// Each batch is a fresh copy, so it may be handed to another thread or device while
// the next one is gathered.
class Batcher {
 public:
  Batcher(Tensor images, Tensor labels, std::int64_t batch_size, std::uint64_t seed,
          Order order = Order::Shuffled);

  // Starts epoch `epoch` (the constructor starts epoch 0): shuffled_indices(N, seed,
  // epoch), or 0..N-1 in order.
  void start_epoch(std::uint64_t epoch);
  // The next batch of the current epoch; false (and `batch` untouched) once it is over.
  bool next(Batch& batch);

  std::int64_t size() const { return images_.size(0); }
  std::int64_t batch_size() const { return batch_size_; }
  std::int64_t batches_per_epoch() const { return (size() + batch_size_ - 1) / batch_size_; }
  std::uint64_t epoch() const { return epoch_; }
  const std::vector<std::int64_t>& epoch_order() const { return order_; }

 private:
  Tensor images_;
  Tensor labels_;
  std::int64_t batch_size_;
  std::uint64_t seed_;
  Order order_kind_;
  std::uint64_t epoch_ = 0;
  std::vector<std::int64_t> order_;
  std::int64_t position_ = 0;
};

}  // namespace towerlab
