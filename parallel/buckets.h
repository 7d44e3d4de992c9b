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
//
// BucketReducer is the whole mechanism as the Trainer uses it: the readiness, one
// communication stream per tower with the ring over them, the events that order a
// bucket's ring after the backward that wrote it, and the reducer thread's loop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../autograd/tape.h"
#include "../autograd/variables.h"
#include "../engine/stream.h"

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

class ProcessGroup;
class Ring;
class Trace;

// One bucketed step, in the order the Trainer calls it:
//   start_step()                                    before the towers start
//   watch(i, tape)                                  tower i, after its forward
//   tower_done(i) or tower_failed()                 tower i, after its backward
//   reduce(...)                                     the reducer thread, meanwhile
//   join()                                          after every thread is back
// On a GPU a bucket's ring runs on the towers' communication streams, each waiting
// for the event its tower recorded when the bucket's gradients were written, so
// the reduction overlaps the rest of the backward on the towers' own streams.
// What a bucket's ring does: the whole all-reduce, or its reduce-scatter alone,
// which leaves each tower its own slice's sum for a sharded master
// (parallel/sharded_master.h; whole-buffer chunks, so the same bits).
enum class BucketReduction { AllReduce, ReduceScatter };

class BucketReducer {
 public:
  // `buckets` (more than one) over the flat gradients of towers on `tower_streams`.
  // `contributions`: what the buckets' ring carries (Ring's, parallel/ring_allreduce.h).
  BucketReducer(std::vector<Bucket> buckets, const std::vector<const Stream*>& tower_streams,
                BucketReduction reduction = BucketReduction::AllReduce,
                DType contributions = DType::Float32);
  ~BucketReducer();

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Every bucket pending on every tower again.
  void start_step();
  // Tower i's tape reports each complete gradient from now on (backward()); the
  // trainable variables its forward pass never used are complete already (zeros).
  // The caller takes the listener off the tape before the step ends.
  void watch(std::size_t tower, Tape& tape);
  // Tower i's backward is over: its buckets not yet complete are (an empty tower,
  // variables with no gradient).
  void tower_done(std::size_t tower);
  // A tower failed: reduce() returns without reducing the buckets it waits for.
  void tower_failed();
  // The reducer thread's loop: each bucket, in order, once every tower has it,
  // all-reduced among the towers (a range of `grads`, the towers' flat gradients,
  // with their chunk boundaries), then, with `group`, across the processes: staged
  // through `staging` (the host buffer whose first elements mirror the flat
  // gradient) in one allreduce_sum framed by that buffer. `step` names the calls;
  // with `trace`, each bucket is a span on row `trace_row`.
  void reduce(const std::vector<Tensor>& grads, const std::string& step, ProcessGroup* group,
              const Tensor& staging, Trace* trace, int trace_row);
  // The towers' streams wait for the buckets' streams (the next step's zeroing of
  // the gradients must not meet a bucket's ring). Called whatever happened.
  void join();

 private:
  // Tower i has bucket b (b < 0: nothing): an event on its stream, then the reducer told.
  void ready(std::size_t tower, int bucket);

  struct Listener;
  std::vector<Bucket> buckets_;
  BucketReduction reduction_;
  std::vector<const Stream*> tower_streams_;
  BucketReadiness readiness_;
  std::vector<std::unique_ptr<Stream>> comm_streams_;  // per tower: the buckets' ring
  std::unique_ptr<Ring> ring_;                         // over comm_streams_
  std::vector<std::vector<Event>> ready_events_;       // [tower][bucket], on tower streams
  std::vector<Event> comm_done_;                       // per tower, on its comm stream
  std::vector<std::unique_ptr<Listener>> listeners_;   // per tower
};

}  // namespace towerlab
