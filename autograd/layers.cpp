#include "autograd/layers.h"

#include <sstream>

#include "autograd/losses.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace towerlab {

Conv2d::Conv2d(VariableSet& vars, std::string name, std::int64_t in_channels,
               std::int64_t out_channels, std::int64_t kernel, Conv2dParams params, bool bias)
    : name_(std::move(name)),
      in_(in_channels),
      out_(out_channels),
      kernel_(kernel),
      params_(params),
      bias_(bias) {
  TL_CHECK(in_ > 0 && out_ > 0 && kernel_ > 0, InvalidArgument,
           "Conv2d " << name_ << ": channels and kernel size must be positive, got " << in_ << "->"
                     << out_ << " " << kernel_ << "x" << kernel_);
  const std::int64_t groups = params_.groups;
  TL_CHECK(groups >= 1 && in_ % groups == 0 && out_ % groups == 0, InvalidArgument,
           "Conv2d " << name_ << ": " << groups << " groups must divide both " << in_
                     << " input and " << out_ << " output channels");
  vars.get(name_ + "/weight", {out_, in_ / groups, kernel_, kernel_}, Initializer::he_normal());
  if (bias_) vars.get(name_ + "/bias", {out_}, Initializer::zeros());
}

Var Conv2d::forward(const Context& ctx, const Var& x) const {
  return ag::conv2d(x, ctx.variable(name_ + "/weight"),
                    bias_ ? ctx.variable(name_ + "/bias") : Var(), params_);
}

std::string Conv2d::describe() const {
  std::ostringstream os;
  os << name_ << ": Conv2d " << in_ << "->" << out_ << " " << kernel_ << "x" << kernel_
     << " stride " << params_.stride_h << " pad " << params_.pad_h;
  if (params_.groups > 1) os << " groups " << params_.groups;
  if (!bias_) os << " no bias";
  return os.str();
}

namespace {

// " + ReLU" after a layer's summary when it applies one.
const char* activation_suffix(Activation activation) {
  return activation == Activation::ReLU ? " + ReLU" : "";
}

}  // namespace

Linear::Linear(VariableSet& vars, std::string name, std::int64_t in_features,
               std::int64_t out_features, bool bias, Activation activation)
    : name_(std::move(name)),
      in_(in_features),
      out_(out_features),
      bias_(bias),
      activation_(activation) {
  TL_CHECK(in_ > 0 && out_ > 0, InvalidArgument,
           "Linear " << name_ << ": sizes must be positive, got " << in_ << "->" << out_);
  vars.get(name_ + "/weight", {out_, in_}, Initializer::he_normal());
  if (bias_) vars.get(name_ + "/bias", {out_}, Initializer::zeros());
}

Var Linear::forward(const Context& ctx, const Var& x) const {
  return ag::linear(x, ctx.variable(name_ + "/weight"),
                    bias_ ? ctx.variable(name_ + "/bias") : Var(), activation_);
}

std::string Linear::describe() const {
  std::ostringstream os;
  os << name_ << ": Linear " << in_ << "->" << out_ << (bias_ ? "" : " no bias")
     << activation_suffix(activation_);
  return os.str();
}

Embedding::Embedding(VariableSet& vars, std::string name, std::int64_t num_embeddings,
                     std::int64_t dim)
    : name_(std::move(name)), num_embeddings_(num_embeddings), dim_(dim) {
  TL_CHECK(
      num_embeddings_ > 0 && dim_ > 0, InvalidArgument,
      "Embedding " << name_ << ": sizes must be positive, got " << num_embeddings_ << "x" << dim_);
  vars.get(name_ + "/weight", {num_embeddings_, dim_}, Initializer::normal(0.0f, 1.0f));
}

Var Embedding::forward(const Context& ctx, const Var& ids) const {
  return ag::embedding(ids, ctx.variable(name_ + "/weight"));
}

std::string Embedding::describe() const {
  std::ostringstream os;
  os << name_ << ": Embedding " << num_embeddings_ << "x" << dim_;
  return os.str();
}

BatchNorm::BatchNorm(VariableSet& vars, std::string name, std::int64_t channels, double momentum,
                     double eps, Activation activation, std::optional<Pool2dParams> max_pool)
    : name_(std::move(name)),
      channels_(channels),
      momentum_(momentum),
      eps_(eps),
      activation_(activation),
      max_pool_(max_pool) {
  TL_CHECK(channels_ > 0, InvalidArgument, "BatchNorm " << name_ << ": no channels");
  TL_CHECK(momentum_ >= 0.0 && momentum_ < 1.0 && eps_ > 0.0, InvalidArgument,
           "BatchNorm " << name_ << ": momentum must be in [0, 1) and eps positive, got "
                        << momentum_ << " and " << eps_);
  vars.get(name_ + "/gamma", {channels_}, Initializer::ones());
  vars.get(name_ + "/beta", {channels_}, Initializer::zeros());
  vars.get(name_ + "/moving_mean", {channels_}, Initializer::zeros(), false);
  vars.get(name_ + "/moving_variance", {channels_}, Initializer::ones(), false);
}

Var BatchNorm::forward(const Context& ctx, const Var& x) const {
  const Var gamma = ctx.variable(name_ + "/gamma"), beta = ctx.variable(name_ + "/beta");
  const Tensor& moving_mean = ctx.state(name_ + "/moving_mean");
  const Tensor& moving_var = ctx.state(name_ + "/moving_variance");
  if (ctx.training && ctx.batchnorm_sync != nullptr) {
    const Var y = ag::sync_batchnorm(x, gamma, beta, moving_mean, moving_var, *ctx.batchnorm_sync,
                                     ctx.tower, momentum_, eps_, activation_);
    return max_pool_ ? ag::max_pool2d(y, *max_pool_) : y;
  }
  if (max_pool_) {
    return ag::batchnorm_max_pool2d(x, gamma, beta, moving_mean, moving_var, ctx.training,
                                    *max_pool_, momentum_, eps_, activation_);
  }
  return ag::batchnorm(x, gamma, beta, moving_mean, moving_var, ctx.training, momentum_, eps_,
                       activation_);
}

std::string BatchNorm::describe() const {
  std::ostringstream os;
  os << name_ << ": BatchNorm " << channels_ << " momentum " << momentum_ << " eps " << eps_
     << activation_suffix(activation_);
  if (max_pool_) os << " + " << MaxPool2d(*max_pool_).describe();
  return os.str();
}

std::string MaxPool2d::describe() const {
  std::ostringstream os;
  os << "MaxPool2d " << params_.kernel_h << "x" << params_.kernel_w << " stride "
     << params_.stride_h;
  return os.str();
}

std::string AvgPool2d::describe() const {
  std::ostringstream os;
  os << "AvgPool2d " << params_.kernel_h << "x" << params_.kernel_w << " stride "
     << params_.stride_h;
  return os.str();
}

Dropout::Dropout(std::string name, double p) : name_(std::move(name)), p_(p) {
  TL_CHECK(p >= 0.0 && p <= 1.0, InvalidArgument,
           "Dropout " << name_ << ": p is " << p << "; it must be in [0, 1]");
}

std::string Dropout::describe() const {
  std::ostringstream os;
  os << name_ << ": Dropout p " << p_;
  return os.str();
}

Var ActivationLayer::forward(const Context&, const Var& x) const {
  switch (op_.kind) {
    case ActivationKind::Sigmoid:
      return ag::sigmoid(x);
    case ActivationKind::Tanh:
      return ag::tanh(x);
    case ActivationKind::Gelu:
      return ag::gelu(x, GeluApproximate::None);
    case ActivationKind::GeluTanh:
      return ag::gelu(x, GeluApproximate::Tanh);
    case ActivationKind::SiLU:
      return ag::silu(x);
    case ActivationKind::LeakyReLU:
      return ag::leaky_relu(x, op_.negative_slope);
  }
  TL_THROW(InvalidArgument, "ActivationLayer: unknown activation kind");
}

std::string ActivationLayer::describe() const {
  switch (op_.kind) {
    case ActivationKind::Sigmoid:
      return "Sigmoid";
    case ActivationKind::Tanh:
      return "Tanh";
    case ActivationKind::Gelu:
      return "GELU";
    case ActivationKind::GeluTanh:
      return "GELU (tanh)";
    case ActivationKind::SiLU:
      return "SiLU";
    case ActivationKind::LeakyReLU: {
      std::ostringstream os;
      os << "LeakyReLU " << op_.negative_slope;
      return os.str();
    }
  }
  return "Activation";
}

Var Sequential::forward(const Context& ctx, const Var& x) const {
  Var h = x;
  for (const auto& layer : layers_) {
    const TapeScope scope(ctx.tape, [&] { return layer->describe(); });  // a trace's layer span
    h = layer->forward(ctx, h);
  }
  return h;
}

std::string Sequential::describe() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < layers_.size(); ++i) os << (i ? "\n" : "") << layers_[i]->describe();
  return os.str();
}

Residual::Residual(std::string name, Sequential body, std::optional<Sequential> shortcut,
                   Activation activation)
    : name_(std::move(name)),
      body_(std::move(body)),
      shortcut_(std::move(shortcut)),
      activation_(activation) {
  TL_CHECK(body_.size() > 0, InvalidArgument, "Residual " << name_ << ": the body has no layers");
}

Var Residual::forward(const Context& ctx, const Var& x) const {
  const Var body = body_(ctx, x);
  const Var skip = shortcut_ ? (*shortcut_)(ctx, x) : x;
  // The sum and the ReLU as one op (kernels/add_relu.h): the same values, one pass.
  return activation_ == Activation::ReLU ? ag::add_relu(body, skip) : ag::add(body, skip);
}

std::string Residual::describe() const {
  std::ostringstream os;
  os << name_ << ": Residual" << activation_suffix(activation_);
  const auto indented = [&os](const char* title, const Sequential& part) {
    os << "\n  " << title;
    std::istringstream lines(part.describe());
    for (std::string line; std::getline(lines, line);) os << "\n    " << line;
  };
  indented("body:", body_);
  if (shortcut_) {
    indented("shortcut:", *shortcut_);
  } else {
    os << "\n  shortcut: identity";
  }
  return os.str();
}

Tensor infer(const Layer& model, VariableStore& store, const Tensor& input, const Stream& stream) {
  Tape tape(stream, "inference");
  const NoGradGuard no_grad(tape);
  const Context ctx{tape, store, /*training=*/false};
  return model(ctx, tape.constant(input, "input")).value();
}

Var l2_regularization(const Context& ctx, double coeff) {
  if (coeff == 0.0) return Var();
  std::vector<Var> terms;
  for (const VariableSpec& spec : ctx.variables.set().specs()) {
    if (spec.trainable && spec.name.ends_with("/weight")) {
      terms.push_back(ag::l2_loss(ctx.variable(spec.name), coeff));
    }
  }
  return terms.empty() ? Var() : ag::add_n(terms);
}

}  // namespace towerlab
