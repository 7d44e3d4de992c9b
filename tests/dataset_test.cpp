// Fashion-MNIST loading (small synthetic files, and the real ones where Debian's
// dataset-fashion-mnist is installed) and the seeded Batcher.
#include "engine/dataset.h"

#include <array>
#include <cmath>
#include <map>
#include <set>

#include "file_test_util.h"
#include "models/fashion_net.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

std::string idx_bytes(const std::vector<std::uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  return out + data;
}

// A Fashion-MNIST directory with `n` training images (image i: every pixel 10 * i + 5;
// label (3 * i) % 10), gzip-compressed, and `n` plain test images.
void write_fake_fashion_mnist(const ScratchDir& dir, std::uint32_t n) {
  std::string pixels, labels;
  for (std::uint32_t i = 0; i < n; ++i) {
    pixels.append(28 * 28, static_cast<char>(10 * i + 5));
    labels.push_back(static_cast<char>((3 * i) % 10));
  }
  write_file(dir.file("train-images-idx3-ubyte.gz"), gzip_stored(idx_bytes({n, 28, 28}, pixels)));
  write_file(dir.file("train-labels-idx1-ubyte.gz"), gzip_stored(idx_bytes({n}, labels)));
  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes({n, 28, 28}, pixels));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({n}, labels));
}

TEST(FashionMnist, LoadsGzipAndPlainFilesWithEitherScaling) {
  ScratchDir dir;
  write_fake_fashion_mnist(dir, 5);
  for (Split split : {Split::Train, Split::Test}) {
    const FashionMnist data = load_fashion_mnist(dir.path().string(), split);
    ASSERT_EQ(data.size(), 5);
    EXPECT_EQ(data.images.shape(), (Shape{5, 1, 28, 28}));
    EXPECT_EQ(data.images.device(), Device::cpu());
    EXPECT_EQ(data.labels.to_host<float>(), (std::vector<float>{0, 3, 6, 9, 2}));
    EXPECT_EQ(data.raw_labels, (std::vector<std::uint8_t>{0, 3, 6, 9, 2}));
    const std::vector<float> pixels = data.images.to_host<float>();
    EXPECT_FLOAT_EQ(pixels[0], (5 / 255.0f - 0.2860f) / 0.3530f);
    EXPECT_FLOAT_EQ(pixels[4 * 784 + 783], (45 / 255.0f - 0.2860f) / 0.3530f);
  }
  const FashionMnist unit =
      load_fashion_mnist(dir.path().string(), Split::Train, PixelScale::UnitRange);
  EXPECT_FLOAT_EQ(unit.images.to_host<float>()[784], 15 / 255.0f);
}

TEST(FashionMnist, MissingFilesSayHowToInstallThem) {
  ScratchDir dir;
  const std::string d = dir.path().string();
  EXPECT_THROW_WITH(load_fashion_mnist(d, Split::Train), IoError,
                    "Fashion-MNIST not found in " + d +
                        ": install it with `sudo apt-get install dataset-fashion-mnist` (files go "
                        "to /usr/share/datasets/fashion-mnist) or pass --data DIR");
  write_fake_fashion_mnist(dir, 2);
  std::filesystem::remove(dir.path() / "t10k-labels-idx1-ubyte");
  EXPECT_THROW_WITH(load_fashion_mnist(d, Split::Test), IoError,
                    "looked for " + dir.file("t10k-labels-idx1-ubyte.gz"));
}

TEST(FashionMnist, RejectsInconsistentFiles) {
  ScratchDir dir;
  const std::string d = dir.path().string();
  write_fake_fashion_mnist(dir, 3);
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, std::string(2, '\1')));
  EXPECT_THROW_WITH(load_fashion_mnist(d, Split::Test), IoError,
                    "holds 3 images but " + dir.file("t10k-labels-idx1-ubyte") + " holds 2 labels");
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({3}, "\1\x0a\1"));
  EXPECT_THROW_WITH(load_fashion_mnist(d, Split::Test), IoError,
                    "label 1 is 10, outside the classes 0..9");
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({3, 27, 28}, std::string(3 * 27 * 28, 'x')));
  EXPECT_THROW_WITH(load_fashion_mnist(d, Split::Test), IoError,
                    "Fashion-MNIST images are [N,28,28], this file holds [3,27,28]");
  // A download cut short: the gzip stream ends inside the pixels.
  const std::string whole = gzip_stored(idx_bytes({3, 28, 28}, std::string(3 * 28 * 28, 'x')));
  write_file(dir.file("train-images-idx3-ubyte.gz"), whole.substr(0, whole.size() / 2));
  EXPECT_THROW_WITH(
      load_fashion_mnist(d, Split::Train), IoError,
      "IDX file " + dir.file("train-images-idx3-ubyte.gz") + ": the gzip stream is truncated");
  write_file(dir.file("train-images-idx3-ubyte.gz"), "\x1f\x8bnot really gzip");
  EXPECT_THROW_WITH(load_fashion_mnist(d, Split::Train), IoError,
                    "IDX file " + dir.file("train-images-idx3-ubyte.gz") + ": ");
}

TEST(FashionMnist, RealFilesWhenInstalled) {
  const std::string dir = models::kFashionMnistDir;
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const FashionMnist train = load_fashion_mnist(dir, Split::Train, PixelScale::UnitRange);
  const FashionMnist test = load_fashion_mnist(dir, Split::Test);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(train.raw_labels[0], 9);
  EXPECT_STREQ(fashion_mnist_class_name(train.raw_labels[0]), "Ankle boot");
  std::array<int, 10> train_counts{}, test_counts{};
  for (std::uint8_t label : train.raw_labels) ++train_counts.at(label);
  for (std::uint8_t label : test.raw_labels) ++test_counts.at(label);
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(train_counts[static_cast<std::size_t>(c)], 6000) << "class " << c;
    EXPECT_EQ(test_counts[static_cast<std::size_t>(c)], 1000) << "class " << c;
  }
  // The standardization constants are the training set's own statistics.
  const std::vector<float> pixels = train.images.to_host<float>();
  double sum = 0, sum_sq = 0;
  for (float p : pixels) sum += p, sum_sq += double{p} * p;
  const double mean = sum / static_cast<double>(pixels.size());
  const double std_dev = std::sqrt(sum_sq / static_cast<double>(pixels.size()) - mean * mean);
  EXPECT_NEAR(mean, kFashionMnistMean, 5e-4);
  EXPECT_NEAR(std_dev, kFashionMnistStd, 5e-4);
}

TEST(ShuffledIndices, IsAPermutationFixedBySeedAndEpoch) {
  const auto order = shuffled_indices(1000, 42, 0);
  std::vector<std::int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(shuffled_indices(1000, 42, 0), order);
  EXPECT_NE(shuffled_indices(1000, 42, 1), order);
  EXPECT_NE(shuffled_indices(1000, 43, 0), order);
  EXPECT_TRUE(shuffled_indices(0, 1, 0).empty());
  EXPECT_EQ(shuffled_indices(1, 1, 0), std::vector<std::int64_t>{0});
  // Pinned: std::mt19937_64 and our bounded draw are the same on every platform.
  EXPECT_EQ(shuffled_indices(10, 42, 0), (std::vector<std::int64_t>{2, 0, 4, 7, 8, 3, 5, 1, 9, 6}));
}

TEST(ShuffledIndices, EveryPermutationIsEquallyLikely) {
  // 24000 shuffles of 4 items: each of the 24 orders ~1000 times. An off-by-one in
  // Fisher-Yates makes some orders impossible or twice as likely.
  std::map<std::vector<std::int64_t>, int> counts;
  for (std::uint64_t seed = 0; seed < 24000; ++seed) ++counts[shuffled_indices(4, seed, 7)];
  EXPECT_EQ(counts.size(), 24u);
  for (const auto& [order, count] : counts) {
    EXPECT_GT(count, 850);
    EXPECT_LT(count, 1150);
  }
}

// Sample i of the fake data: image rows all equal to i, label i + 0.5.
std::pair<Tensor, Tensor> indexed_samples(std::int64_t n) {
  Tensor images = Tensor::empty({n, 1, 2, 3}, Device::cpu());
  Tensor labels = Tensor::empty({n}, Device::cpu());
  for (std::int64_t i = 0; i < n; ++i) {
    std::fill_n(images.data<float>() + 6 * i, 6, static_cast<float>(i));
    labels.data<float>()[i] = static_cast<float>(i) + 0.5f;
  }
  return {images, labels};
}

TEST(Batcher, CoversEveryIndexOncePerEpochAndKeepsTheLastBatch) {
  auto [images, labels] = indexed_samples(10);
  Batcher batcher(images, labels, 4, 123);
  EXPECT_EQ(batcher.batches_per_epoch(), 3);
  std::vector<std::vector<std::int64_t>> epochs;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    batcher.start_epoch(epoch);
    std::vector<std::int64_t> seen, sizes;
    for (Batch batch; batcher.next(batch);) {
      sizes.push_back(batch.size());
      ASSERT_EQ(batch.images.shape(), (Shape{batch.size(), 1, 2, 3}));
      ASSERT_EQ(batch.labels.shape(), (Shape{batch.size()}));
      const auto pixels = batch.images.to_host<float>();
      const auto ids = batch.labels.to_host<float>();
      for (std::int64_t j = 0; j < batch.size(); ++j) {
        const auto k = batch.indices[static_cast<std::size_t>(j)];
        EXPECT_EQ(pixels[static_cast<std::size_t>(6 * j + 5)], static_cast<float>(k));
        EXPECT_EQ(ids[static_cast<std::size_t>(j)], static_cast<float>(k) + 0.5f);
        seen.push_back(k);
      }
    }
    EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 4, 2}));
    EXPECT_EQ(seen, shuffled_indices(10, 123, epoch));
    std::vector<std::int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
    epochs.push_back(seen);
    Batch untouched;
    EXPECT_FALSE(batcher.next(untouched));
    EXPECT_FALSE(untouched.images.defined());
  }
  EXPECT_NE(epochs[0], epochs[1]);
  // Same seed, same epochs: the same batches (a resumed run sees what it would have).
  Batcher again(images, labels, 4, 123);
  again.start_epoch(2);
  Batch first;
  ASSERT_TRUE(again.next(first));
  EXPECT_EQ(first.indices, std::vector<std::int64_t>(epochs[2].begin(), epochs[2].begin() + 4));
}

TEST(Batcher, SequentialOrderAndOneBigBatch) {
  auto [images, labels] = indexed_samples(5);
  Batcher batcher(images, labels, 100, 1, Order::Sequential);
  Batch batch;
  ASSERT_TRUE(batcher.next(batch));
  EXPECT_EQ(batch.indices, (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(batcher.next(batch));
}

TEST(Batcher, RejectsBadArguments) {
  auto [images, labels] = indexed_samples(5);
  EXPECT_THROW_WITH(Batcher(images, labels, 0, 1), InvalidArgument,
                    "batch size must be positive, not 0");
  EXPECT_THROW_WITH(Batcher(images, labels.slice(0, 4), 2, 1), ShapeError,
                    "must have the same N; got [5,1,2,3] and [4]");
  EXPECT_THROW_WITH(Batcher(images, Tensor(), 2, 1), InvalidArgument, "must be defined");
  EXPECT_THROW_WITH(fashion_mnist_class_name(10), InvalidArgument, "classes 0..9, not 10");
}

}  // namespace
}  // namespace towerlab::testing
