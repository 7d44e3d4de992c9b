#include "engine/dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

#include "engine/error.h"
#include "engine/idx.h"

namespace towerlab {

const char* fashion_mnist_class_name(int label) {
  static constexpr const char* kNames[10] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                             "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                             "Bag",         "Ankle boot"};
  TL_CHECK(0 <= label && label < 10, InvalidArgument,
           "Fashion-MNIST has classes 0..9, not " << label);
  return kNames[label];
}

namespace {

constexpr std::int64_t kSide = 28;

// <dir>/<base>.gz, else <dir>/<base>; the install hint when neither exists.
std::string find_data_file(const std::string& dir, const std::string& base) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  for (const std::string& name : {base + ".gz", base}) {
    const fs::path candidate = fs::path(dir) / name;
    if (fs::exists(candidate, ignored)) return candidate.string();
  }
  TL_THROW(IoError, "Fashion-MNIST not found in "
                        << dir
                        << ": install it with `sudo apt-get install dataset-fashion-mnist` (files "
                           "go to /usr/share/datasets/fashion-mnist) or pass --data DIR (looked "
                           "for "
                        << (fs::path(dir) / (base + ".gz")).string() << ")");
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound): rejection keeps the draw unbiased; the accepted range is the
// largest multiple of `bound` that fits, so fewer than half the draws are ever rejected.
std::uint64_t bounded_draw(std::mt19937_64& gen, std::uint64_t bound) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t accept_below = kMax - kMax % bound;
  for (;;) {
    const std::uint64_t r = gen();
    if (r < accept_below) return r % bound;
  }
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir, Split split, PixelScale scale) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string images_path = find_data_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_data_file(dir, prefix + "-labels-idx1-ubyte");
  const IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);

  TL_CHECK(images.dims.size() == 3 && images.dims[1] == kSide && images.dims[2] == kSide, IoError,
           "IDX file " << images_path << ": Fashion-MNIST images are [N,28,28], this file holds "
                       << to_string(images.dims));
  TL_CHECK(labels.dims.size() == 1, IoError,
           "IDX file " << labels_path << ": Fashion-MNIST labels are [N], this file holds "
                       << to_string(labels.dims));
  const std::int64_t n = images.dims[0];
  TL_CHECK(labels.dims[0] == n, IoError,
           "Fashion-MNIST in " << dir << ": " << images_path << " holds " << n << " images but "
                               << labels_path << " holds " << labels.dims[0] << " labels");
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    TL_CHECK(labels.data[i] < 10, IoError,
             "IDX file " << labels_path << ": label " << i << " is " << int{labels.data[i]}
                         << ", outside the classes 0..9");
  }

  FashionMnist out;
  out.images = Tensor::empty({n, 1, kSide, kSide}, Device::cpu());
  float* pixels = out.images.data<float>();  // [N,1,28,28]
  const bool standardize = scale == PixelScale::Standardized;
  for (std::size_t i = 0; i < images.data.size(); ++i) {
    const float unit = static_cast<float>(images.data[i]) / 255.0f;
    pixels[i] = standardize ? (unit - kFashionMnistMean) / kFashionMnistStd : unit;
  }
  out.labels = Tensor::empty({n}, Device::cpu());
  float* ids = out.labels.data<float>();  // [N]
  for (std::int64_t i = 0; i < n; ++i) ids[i] = static_cast<float>(labels.data[i]);
  out.raw_labels = std::move(labels.data);
  return out;
}

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed,
                                           std::uint64_t epoch) {
  TL_CHECK(n >= 0, InvalidArgument, "shuffled_indices: n is " << n);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // One generator per (seed, epoch), so epoch k does not depend on epochs 0..k-1.
  std::mt19937_64 gen(splitmix64(splitmix64(seed) ^ epoch));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(bounded_draw(gen, static_cast<std::uint64_t>(i) + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

Batcher::Batcher(Tensor images, Tensor labels, std::int64_t batch_size, std::uint64_t seed,
                 Order order)
    : images_(std::move(images)),
      labels_(std::move(labels)),
      batch_size_(batch_size),
      seed_(seed),
      order_kind_(order) {
  TL_CHECK(images_.defined() && labels_.defined(), InvalidArgument,
           "Batcher: images and labels must be defined tensors");
  TL_CHECK(batch_size_ > 0, InvalidArgument,
           "Batcher: batch size must be positive, not " << batch_size_);
  TL_CHECK(images_.device().is_cpu() && labels_.device().is_cpu(), InvalidArgument,
           "Batcher: images and labels live on the host; got " << images_.describe() << " and "
                                                               << labels_.describe());
  TL_CHECK(images_.dtype() == DType::Float32 && labels_.dtype() == DType::Float32, ShapeError,
           "Batcher: images and labels must be float32; got " << images_.describe() << " and "
                                                              << labels_.describe());
  TL_CHECK(images_.dim() >= 1 && labels_.dim() == 1 && labels_.size(0) == images_.size(0),
           ShapeError,
           "Batcher: images [N,...] and labels [N] must have the same N; got "
               << images_.shape_str() << " and " << labels_.shape_str());
  start_epoch(0);
}

void Batcher::start_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  if (order_kind_ == Order::Shuffled) {
    order_ = shuffled_indices(size(), seed_, epoch);
  } else {
    order_.resize(static_cast<std::size_t>(size()));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
  }
}

bool Batcher::next(Batch& batch) {
  const std::int64_t n = size();
  if (position_ >= n) return false;
  const std::int64_t b = std::min(batch_size_, n - position_);
  Shape shape = images_.shape();
  shape[0] = b;
  const std::int64_t row = n == 0 ? 0 : images_.numel() / n;  // elements per sample
  Batch out;
  out.images = Tensor::empty(shape, Device::cpu());
  out.labels = Tensor::empty({b}, Device::cpu());
  out.indices.assign(order_.begin() + position_, order_.begin() + position_ + b);
  const float* src_images = images_.data<float>();  // [N, ...]
  const float* src_labels = labels_.data<float>();  // [N]
  float* dst_images = out.images.data<float>();     // [B, ...]
  float* dst_labels = out.labels.data<float>();     // [B]
  for (std::int64_t i = 0; i < b; ++i) {
    const std::int64_t k = out.indices[static_cast<std::size_t>(i)];
    std::memcpy(dst_images + i * row, src_images + k * row, static_cast<std::size_t>(row) * 4);
    dst_labels[i] = src_labels[k];
  }
  position_ += b;
  batch = std::move(out);
  return true;
}

}  // namespace towerlab
