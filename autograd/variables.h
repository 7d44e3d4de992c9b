// Variables created by name, in the manner of tf.get_variable.
//
// A VariableSet is the declaration of a model's variables: names ("conv1/weight"),
// shapes, initializers and whether each is trained. Layers declare their variables
// into it when they are constructed; asking for a name again returns the same
// declaration (and must agree on the shape), which is how every tower shares one
// set of variables.
//
// A VariableStore is one copy of a set on one device. All trainable values live in
// one flat buffer, all their gradients in a second flat buffer of the same layout,
// and non-trainable state (batch-norm moving statistics) in a third. Each variable
// is a view into these, so one all-reduce moves every gradient, one fused kernel
// updates every parameter, and one copy broadcasts the master values to a replica.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

// How a variable's first values are drawn. Fans come from the shape: a conv
// weight [K,C,R,S] has fan_in C*R*S and fan_out K*R*S; a linear weight [O,I] has
// fan_in I and fan_out O; a vector has both equal to its length.
struct Initializer {
  enum class Kind {
    Zeros,
    Ones,
    Constant,
    Uniform,
    Normal,
    HeNormal,
    HeUniform,
    GlorotNormal,
    GlorotUniform
  };
  Kind kind = Kind::Zeros;
  float a = 0.0f;  // Constant: the value; Uniform: low; Normal: mean
  float b = 0.0f;  // Uniform: high; Normal: stddev

  static Initializer zeros() { return {Kind::Zeros}; }
  static Initializer ones() { return {Kind::Ones}; }
  static Initializer constant(float value) { return {Kind::Constant, value}; }
  static Initializer uniform(float low, float high) { return {Kind::Uniform, low, high}; }
  static Initializer normal(float mean, float stddev) { return {Kind::Normal, mean, stddev}; }
  static Initializer he_normal() { return {Kind::HeNormal}; }          // N(0, 2/fan_in)
  static Initializer he_uniform() { return {Kind::HeUniform}; }        // U(+-sqrt(6/fan_in))
  static Initializer glorot_normal() { return {Kind::GlorotNormal}; }  // N(0, 2/(fan_in+fan_out))
  static Initializer glorot_uniform() {
    return {Kind::GlorotUniform};
  }  // U(+-sqrt(6/(fan_in+fan_out)))
};

struct VariableSpec {
  std::string name;
  Shape shape;
  Initializer init;
  bool trainable = true;
  std::int64_t offset = 0;  // elements into the flat buffer of its kind
  std::int64_t numel() const { return numel_of(shape); }
};

class VariableSet {
 public:
  // Declares `name`, or returns the existing declaration. Throws ShapeError if the
  // name exists with another shape or trainability, InvalidArgument for an empty name.
  const VariableSpec& get(const std::string& name, const Shape& shape, Initializer init,
                          bool trainable = true);
  // The declaration of `name`, or nullptr.
  const VariableSpec* find(const std::string& name) const;
  // The declaration of `name`; throws InvalidArgument listing close names if absent.
  const VariableSpec& at(const std::string& name) const;
  // In declaration order. A deque: references returned by get() stay valid.
  const std::deque<VariableSpec>& specs() const { return specs_; }
  std::int64_t trainable_numel() const { return trainable_numel_; }
  std::int64_t state_numel() const { return state_numel_; }

 private:
  std::deque<VariableSpec> specs_;
  std::map<std::string, std::size_t> index_;
  std::int64_t trainable_numel_ = 0;
  std::int64_t state_numel_ = 0;
};

class VariableStore {
 public:
  // Allocates the flat buffers on the stream's device (values uninitialized until
  // initialize() or copy_from()). `with_grads` = false for a store that is never
  // differentiated (an inference copy: it runs a model in an inference pass only,
  // see infer() in autograd/layers.h). float64 (CPU only) serves gradient checks.
  VariableStore(const VariableSet& set, const Stream& stream, bool with_grads = true,
                DType dtype = DType::Float32);

  // Draws every variable from its initializer with the Philox generator: the
  // subsequence is a hash of the variable's name, so the same seed gives the same
  // values on every device and whatever the declaration order.
  void initialize(std::uint64_t seed, const Stream& stream);
  // Copies values and state from another store of the same set (any device).
  void copy_from(const VariableStore& other, const Stream& stream);
  void zero_grad(const Stream& stream);

  // Views of one variable (gradients exist for trainable variables only).
  Tensor value(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // False for an inference copy (made with with_grads = false).
  bool has_grads() const { return grads_.defined(); }

  // The working copy of a mixed-precision tower (docs/precision.md): the trainable
  // values rounded to a 16-bit dtype, in a fourth flat buffer of the values' layout,
  // which the GEMM-class ops (ag::matmul, ag::linear, ag::conv2d) read instead of
  // the values when the tape computes in that dtype. set_working_dtype allocates it
  // (float32: none, the default); round_working rounds every value into it, one cast
  // kernel on `stream` (to nearest even, kernels/cast.h), and must run before a pass
  // reads the copy (the Trainer does it at the start of each tower's pass). The
  // values stay as they are: batch norm's scale and offset, biases and the
  // optimizer read them.
  void set_working_dtype(DType dtype, const Stream& stream);
  void round_working(const Stream& stream);

  // Replicas that share one memory (the Trainer's CPU towers and their host master,
  // docs/trainer.md): makes this store's trainable values views of `other`'s, and
  // its working copy `other`'s where both have one of the same dtype, so that
  // whatever is written into `other`'s is this store's at once, with no copy. The
  // gradients and the state (moving statistics) stay this store's own. Both stores
  // hold the same set, on one device, in one dtype (InvalidArgument otherwise).
  void share_values(const VariableStore& other);
  // Exchanges this store's flat gradient with `other`'s, buffer for buffer: O(1),
  // nothing copied. The Trainer's host master takes its CPU towers' averaged
  // gradient so in one memory, where tower 0's backward overwrites whatever buffer it
  // holds. Both stores hold gradients of the same set, on one device, in one dtype
  // (InvalidArgument otherwise).
  void swap_grads(VariableStore& other);
  // Whether this store's trainable values are `other`'s memory.
  bool shares_values_with(const VariableStore& other) const {
    return values_.raw_data() == other.values_.raw_data();
  }
  bool has_working() const { return working_.defined(); }
  // One variable's rounded value (undefined without a working copy).
  Tensor working(const std::string& name) const;
  const Tensor& flat_working() const { return working_; }

  const Tensor& flat_values() const { return values_; }
  const Tensor& flat_grads() const { return grads_; }
  const Tensor& flat_state() const { return state_; }
  const VariableSet& set() const { return *set_; }
  Device device() const { return device_; }

 private:
  const VariableSet* set_;
  Device device_;
  Tensor values_;
  Tensor grads_;
  Tensor state_;
  Tensor working_;
};

// The 64-bit FNV-1a hash of a name: the Philox subsequence of a variable.
std::uint64_t name_hash(const std::string& name);

}  // namespace towerlab
