#include "models/resnet.h"

#include "engine/error.h"

namespace towerlab::models {

namespace {

constexpr double kMomentum = 0.99, kEps = 1e-3;  // BatchNorm's defaults (TensorFlow's)

Conv2dParams conv3x3(std::int64_t stride) {
  return {.stride_h = stride, .stride_w = stride, .pad_h = 1, .pad_w = 1};
}

}  // namespace

Residual basic_block(VariableSet& vars, const std::string& name, std::int64_t in, std::int64_t out,
                     std::int64_t stride) {
  Sequential body;
  body.add<Conv2d>(vars, name + "/conv1", in, out, 3, conv3x3(stride), false);
  body.add<BatchNorm>(vars, name + "/bn1", out, kMomentum, kEps, Activation::ReLU);
  body.add<Conv2d>(vars, name + "/conv2", out, out, 3, conv3x3(1), false);
  body.add<BatchNorm>(vars, name + "/bn2", out, kMomentum, kEps);
  if (stride == 1 && in == out) return Residual(name, std::move(body));
  Sequential projection;
  projection.add<Conv2d>(vars, name + "/shortcut/conv", in, out, 1,
                         Conv2dParams{.stride_h = stride, .stride_w = stride}, false);
  projection.add<BatchNorm>(vars, name + "/shortcut/bn", out, kMomentum, kEps);
  return Residual(name, std::move(body), std::move(projection));
}

Sequential resnet(VariableSet& vars, const ResNetOptions& o) {
  TL_CHECK(o.in_channels > 0 && o.width > 0 && o.blocks_per_stage > 0 && o.classes > 0,
           InvalidArgument,
           "resnet: channels, width, blocks per stage and classes must be positive, got "
               << o.in_channels << ", " << o.width << ", " << o.blocks_per_stage << " and "
               << o.classes);
  Sequential net;
  net.add<Conv2d>(vars, "stem/conv", o.in_channels, o.width, 3, conv3x3(1), false);
  net.add<BatchNorm>(vars, "stem/bn", o.width, kMomentum, kEps, Activation::ReLU);
  std::int64_t channels = o.width;
  for (int stage = 1; stage <= 3; ++stage) {
    const std::int64_t out = o.width << (stage - 1);
    for (int block = 1; block <= o.blocks_per_stage; ++block) {
      const std::int64_t stride = stage > 1 && block == 1 ? 2 : 1;
      const std::string name = "stage" + std::to_string(stage) + "/block" + std::to_string(block);
      net.add<Residual>(basic_block(vars, name, channels, out, stride));
      channels = out;
    }
  }
  net.add<GlobalAvgPool2d>();
  net.add<Linear>(vars, "fc", channels, o.classes);
  return net;
}

}  // namespace towerlab::models
