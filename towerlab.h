// towerlab: a small deep-learning engine that trains one model replica ("tower")
// per device, splits each batch across the towers and averages their gradients
// with a ring all-reduce. This is the one header a program includes.
//
// A first program: list the devices, then add two vectors on each of them.
//
//   #include <towerlab/towerlab.h>
//   using namespace towerlab;
//
//   int main() {
//     for (Device device : available_devices()) {
//       Stream stream(device);                      // CUDA stream, or the calling thread
//       Tensor a = Tensor::from_host<float>({1, 2, 3}, {3}, stream);
//       Tensor b = Tensor::from_host<float>({10, 20, 30}, {3}, stream);
//       Tensor c = Tensor::empty({3}, stream);
//       add(c, a, b, stream);                       // asynchronous on the stream
//       std::vector<float> host = c.to_host<float>(stream);  // waits: {11, 22, 33}
//     }
//   }
//
// Errors are exceptions derived from towerlab::Error (engine/error.h); the
// library never exits the process. TOWERLAB_VERSION (towerlab/version.h) is the
// version as a string, TOWERLAB_VERSION_MAJOR/MINOR/PATCH as numbers. Whole models
// built from the layers are not included here: <towerlab/models/fashion_net.h>.
#pragma once

// Generated from project(VERSION): in PREFIX/include/towerlab once installed, in
// the build tree's include/towerlab before (CMakeLists.txt).
#include <towerlab/version.h>

#include "autograd/checkpoint.h"
#include "autograd/context.h"
#include "autograd/layers.h"
#include "autograd/losses.h"
#include "autograd/nn.h"
#include "autograd/ops.h"
#include "autograd/optimizer.h"
#include "autograd/tape.h"
#include "autograd/transformer.h"
#include "autograd/variables.h"
#include "engine/allocator.h"
#include "engine/dataset.h"
#include "engine/device.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "engine/settings.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "engine/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/add_relu.h"
#include "kernels/batched_matmul.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/broadcast.h"
#include "kernels/cast.h"
#include "kernels/conv2d.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layer_norm.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"
#include "kernels/pointwise_loss.h"
#include "kernels/pool2d.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/relu.h"
#include "kernels/slice_copy.h"
#include "kernels/softmax.h"
#include "parallel/batch_split.h"
#include "parallel/cluster.h"
#include "parallel/collective_checkpoint.h"
#include "parallel/ring_allreduce.h"
#include "parallel/summary.h"
#include "parallel/sync_batchnorm.h"
#include "parallel/trace.h"
#include "parallel/trainer.h"
