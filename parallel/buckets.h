// Gradient buckets: the flat gradient cut into contiguous ranges that are
// all-reduced one after another while the backward pass is still running, as
// PyTorch's DistributedDataParallel does, so that the reduction of the last
// layers' gradients overlaps the backward of the first layers.
//
// The order is fixed and the same on every tower and every process: the trainable
// variables in reverse declaration order (the backward reaches the last layers
// first), a bucket closed as soon as it holds at least `bucket_bytes` bytes. The
// flat gradient lays the variables out in declaration order, so each bucket is one
// range [begin, end) of it. bucket_bytes <= 0, or at least the whole gradient,
// gives one bucket: the unbucketed reduction.
//
// Exactness. A bucket is not reduced as a short buffer of its own: the ring sums
// chunk k starting at member k, so the order of an element's sum depends on the
// chunk it falls in. Both rings (the towers' in parallel/ring_allreduce.h, the
// processes' behind ProcessGroup) reduce a bucket as a range of the whole buffer,
// with the whole buffer's chunk boundaries, so every element is summed in the same
// order as in one unbucketed reduction: bucketed and unbucketed steps give the
// same bits, for any number of towers and processes.
//
// BucketReadiness is the meeting point of one step: each tower's thread marks a
// bucket ready when the last of its variables' gradients is complete (the tape's
// GradientListener says when), and the reducer waits, bucket by bucket in the
// fixed order, until every tower has it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/variables.h"

namespace towerlab {

struct Bucket {
  std::int64_t begin = 0, end = 0;     // elements of the flat gradient
  std::vector<std::string> variables;  // in reverse declaration order
  std::int64_t bytes() const { return (end - begin) * std::int64_t(sizeof(float)); }
};

// The buckets of `set`'s trainable variables, in the order they are reduced.
std::vector<Bucket> make_buckets(const VariableSet& set, std::int64_t bucket_bytes);

class BucketReadiness {
 public:
  BucketReadiness(const std::vector<Bucket>& buckets, std::size_t towers);

  // Every bucket pending on every tower again (before a step's towers start).
  void start_step();
  // Tower `tower`'s gradient of `name` is complete. Returns the bucket this
  // completes for the tower, or -1. Called on the tower's own thread only.
  int gradient_ready(std::size_t tower, const std::string& name);
  // Every bucket of `tower` not yet complete is, at once: its remaining gradients
  // are zeros or final (an empty tower, variables its forward pass never used).
  // Returns the buckets this completes, in order.
  std::vector<int> complete_all(std::size_t tower);
  // Tells the reducer that one more tower has `bucket` (after that tower has made
  // the bucket's gradient available to it: on a GPU, recorded an event).
  void publish(int bucket);
  // A tower failed: the reducer stops waiting.
  void abort();
  // Blocks until every tower has published bucket `b` (true) or abort() (false).
  bool wait(int bucket);

 private:
  const std::vector<Bucket>& buckets_;
  std::map<std::string, int> bucket_of_;
  std::vector<std::vector<std::int64_t>> pending_;  // [tower][bucket]: variables left
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> towers_ready_;  // per bucket: towers that published it
  bool aborted_ = false;
};

}  // namespace towerlab
