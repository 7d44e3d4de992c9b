// Layers: small objects that declare their variables by name when constructed
// (into a VariableSet, the tf.get_variable way) and run their forward pass on a
// Context (a tower's tape and its copy of the variables). A layer holds no tensors
// and no per-tower state, so one model object serves every tower at once.
//
//   VariableSet vars;
//   Sequential net;
//   net.add<Conv2d>(vars, "conv1", 1, 32, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
//   net.add<BatchNorm>(vars, "bn1", 32, 0.99, 1e-3, Activation::ReLU,  // fused with ReLU
//                      Pool2dParams::square(2, 2));                   // and a max pool
//   ...
//   Var logits = net(Context{tape, store, /*training=*/true}, input);
//   Tensor predicted = infer(net, store, input, stream);  // inference, no tape kept
//
// Composition. A Sequential is a chain. A model that branches is a layer that calls
// other layers: each op they run records its backward on the tape, so a composite
// layer has no backward code of its own. Residual is the branch most models need,
// y = relu(body(x) + shortcut(x)), with each part a Sequential:
//
//   const Conv2dParams down{.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
//   const Conv2dParams same{.pad_h = 1, .pad_w = 1};
//   Sequential body, projection;
//   body.add<Conv2d>(vars, "block1/conv1", 16, 32, 3, down, /*bias=*/false);
//   body.add<BatchNorm>(vars, "block1/bn1", 32, 0.99, 1e-3, Activation::ReLU);
//   body.add<Conv2d>(vars, "block1/conv2", 32, 32, 3, same, false);
//   body.add<BatchNorm>(vars, "block1/bn2", 32);
//   projection.add<Conv2d>(vars, "block1/shortcut/conv", 16, 32, 1,
//                          Conv2dParams{.stride_h = 2, .stride_w = 2}, false);
//   projection.add<BatchNorm>(vars, "block1/shortcut/bn", 32);
//   net.add<Residual>("block1", std::move(body), std::move(projection));
//   // net.add<Residual>("block2", std::move(body2)) adds x itself: the identity shortcut.
//
// Any other graph (attention's three projections, a two-headed output) is a class
// derived from Layer that holds its parts as members and calls them in forward():
//
//   class TwoHeads : public Layer {
//     Linear a_, b_;
//    public:
//     TwoHeads(VariableSet& vars, const std::string& name)
//         : a_(vars, name + "/a", 64, 10), b_(vars, name + "/b", 64, 10) {}
//     Var forward(const Context& ctx, const Var& x) const override {
//       return ag::add(a_(ctx, x), b_(ctx, x));
//     }
//     std::string describe() const override { return "TwoHeads"; }
//   };
//
// Variables are named by the strings the layers are given: a scope is a prefix with
// a slash ("stage2/block1/conv1/weight"), so that checkpoints, the placement log and
// tools/torch_convert.py see one flat list of hierarchical names. A Dropout's name
// keys its masks: give each one in a model its own (a scope reads best).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "context.h"
#include "nn.h"
#include "ops.h"

namespace towerlab {

class Layer {
 public:
  virtual ~Layer() = default;
  virtual Var forward(const Context& ctx, const Var& x) const = 0;
  // "conv1: Conv2d 1->32 3x3 stride 1 pad 1": for model summaries and placement logs.
  virtual std::string describe() const = 0;
  Var operator()(const Context& ctx, const Var& x) const { return forward(ctx, x); }
};

// Declares <name>/weight [K,C/G,R,S] (He normal) and <name>/bias [K] (zeros), with G =
// params.groups (1: a dense convolution; in_channels: depthwise), which must divide
// both channel counts (InvalidArgument otherwise).
class Conv2d : public Layer {
 public:
  Conv2d(VariableSet& vars, std::string name, std::int64_t in_channels, std::int64_t out_channels,
         std::int64_t kernel, Conv2dParams params = {}, bool bias = true);
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;

 private:
  std::string name_;
  std::int64_t in_, out_, kernel_;
  Conv2dParams params_;
  bool bias_;
};

// Declares <name>/weight [O,I] (He normal for ReLU networks) and <name>/bias [O] (zeros).
// The activation is fused into the bias add (kernels/bias.h).
class Linear : public Layer {
 public:
  Linear(VariableSet& vars, std::string name, std::int64_t in_features, std::int64_t out_features,
         bool bias = true, Activation activation = Activation::None);
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;

 private:
  std::string name_;
  std::int64_t in_, out_;
  bool bias_;
  Activation activation_;
};

// Declares <name>/weight [V,D] (normal, mean 0 and standard deviation 1, as
// torch.nn.Embedding). Its input is the ids [...] (a constant of integral values in
// the weight's dtype, kernels/embedding.h); its output [..., D] their rows.
class Embedding : public Layer {
 public:
  Embedding(VariableSet& vars, std::string name, std::int64_t num_embeddings, std::int64_t dim);
  Var forward(const Context& ctx, const Var& ids) const override;
  std::string describe() const override;  // "tok: Embedding 1000x64"

 private:
  std::string name_;
  std::int64_t num_embeddings_, dim_;
};

// Declares <name>/gamma (ones) and <name>/beta (zeros), trainable, and the
// non-trainable <name>/moving_mean (zeros) and <name>/moving_variance (ones).
// momentum is TensorFlow's decay (the weight of the old moving value). The
// activation is fused into batch norm's kernels, forward and backward
// (kernels/batchnorm.h), and so is a max pool after it when one is given
// (ag::batchnorm_max_pool2d; synchronized batch norm composes the pool instead).
class BatchNorm : public Layer {
 public:
  BatchNorm(VariableSet& vars, std::string name, std::int64_t channels, double momentum = 0.99,
            double eps = 1e-3, Activation activation = Activation::None,
            std::optional<Pool2dParams> max_pool = std::nullopt);
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;

 private:
  std::string name_;
  std::int64_t channels_;
  double momentum_, eps_;
  Activation activation_;
  std::optional<Pool2dParams> max_pool_;
};

class ReLU : public Layer {
 public:
  Var forward(const Context&, const Var& x) const override { return ag::relu(x); }
  std::string describe() const override { return "ReLU"; }
};

class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(Pool2dParams params = {}) : params_(params) {}
  Var forward(const Context&, const Var& x) const override { return ag::max_pool2d(x, params_); }
  std::string describe() const override;

 private:
  Pool2dParams params_;
};

class AvgPool2d : public Layer {
 public:
  explicit AvgPool2d(Pool2dParams params = {}) : params_(params) {}
  Var forward(const Context&, const Var& x) const override { return ag::avg_pool2d(x, params_); }
  std::string describe() const override;

 private:
  Pool2dParams params_;
};

// Dropout with probability p in training, the identity in evaluation; the mask is
// drawn from the pass's Context.dropout_key(name), so `name` must be unique in the
// model (it is not a variable; a scope like "block1/dropout" reads best).
class Dropout : public Layer {
 public:
  Dropout(std::string name, double p);
  Var forward(const Context& ctx, const Var& x) const override {
    return ag::dropout(x, p_, ctx.dropout_key(name_), ctx.training);
  }
  std::string describe() const override;  // "block1/dropout: Dropout p 0.1"

 private:
  std::string name_;
  double p_;
};

// x [N,C,H,W] -> [N,C], each channel's mean (ag::global_avg_pool2d).
class GlobalAvgPool2d : public Layer {
 public:
  Var forward(const Context&, const Var& x) const override { return ag::global_avg_pool2d(x); }
  std::string describe() const override { return "GlobalAvgPool2d"; }
};

// One of kernels/activation.h's activations as a layer of a Sequential:
//   net.add<ActivationLayer>(ActivationOp::gelu(GeluApproximate::Tanh));
class ActivationLayer : public Layer {
 public:
  explicit ActivationLayer(ActivationOp op) : op_(op) {}
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;  // "GELU (tanh)", "LeakyReLU 0.1", ...

 private:
  ActivationOp op_;
};

class Flatten : public Layer {
 public:
  Var forward(const Context&, const Var& x) const override { return ag::flatten(x); }
  std::string describe() const override { return "Flatten"; }
};

class Sequential : public Layer {
 public:
  template <typename L, typename... Args>
  L& add(Args&&... args) {
    layers_.push_back(std::make_unique<L>(std::forward<Args>(args)...));
    return static_cast<L&>(*layers_.back());
  }
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;  // one line per layer
  std::size_t size() const { return layers_.size(); }
  // The i-th layer added (0 <= i < size()), for tools that walk a model layer by layer.
  const Layer& layer(std::size_t i) const { return *layers_.at(i); }

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

// y = body(x) + shortcut(x), then the activation (ReLU by default, as in ResNet's
// basic block, fused with the sum: ag::add_relu; Activation::None leaves the sum).
// The body runs first, then the shortcut. Without a shortcut the sum takes x
// itself, so the body must keep x's shape; with one, body(x) and shortcut(x) must
// agree (ag::add_relu's or ag::add's ShapeError names both shapes). `name` is the block's scope,
// for summaries and traces ("stage2/block1"); its parts name their own variables.
class Residual : public Layer {
 public:
  Residual(std::string name, Sequential body, std::optional<Sequential> shortcut = std::nullopt,
           Activation activation = Activation::ReLU);
  Var forward(const Context& ctx, const Var& x) const override;
  // "stage2/block1: Residual + ReLU", then the body's layers and the shortcut's,
  // one a line, indented.
  std::string describe() const override;
  const Sequential& body() const { return body_; }
  const Sequential* shortcut() const { return shortcut_ ? &*shortcut_ : nullptr; }

 private:
  std::string name_;
  Sequential body_;
  std::optional<Sequential> shortcut_;
  Activation activation_;
};

// Inference without a Trainer: runs `model` on `input` (on the store's device) in
// inference mode and returns its output, a tensor on `stream`. Batch norm uses the
// moving statistics and leaves them as they are. The pass runs on a tape of its own
// with recording off, so nothing is kept for a backward pass. `store` may be made
// without gradients (an inference copy, e.g. filled by load_checkpoint):
//
//   VariableStore store(vars, cpu, /*with_grads=*/false);
//   load_checkpoint("model.safetensors", store, nullptr, cpu);
//   Tensor logits = infer(net, store, images, cpu);  // [N,1,28,28] -> [N,10]
//
// A mis-shaped input throws the layer's ShapeError, and an input on another device
// InvalidArgument. It only reads `store`: nothing may write it meanwhile (a Trainer
// step on that store).
Tensor infer(const Layer& model, VariableStore& store, const Tensor& input, const Stream& stream);

// Weight decay as a TensorFlow 1.x model adds it to its regularization losses:
// coeff * tf.nn.l2_loss(w) = coeff * sum(w^2)/2 over every trainable variable
// whose name ends in "/weight" (biases and batch-norm scales are not
// decayed). Undefined when coeff is 0 or there is no such variable.
Var l2_regularization(const Context& ctx, double coeff);

}  // namespace towerlab
