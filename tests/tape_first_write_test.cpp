// First gradient writes (autograd/tape.h): an op whose backward writes the whole
// gradient assigns the first contribution instead of adding it to a zero-filled
// buffer, and so does the first write to a variable's gradient when its owner did
// not zero-fill it (VariableGrads::Unwritten, as the Trainer's towers run). The
// gradients must be the bits the zero-fill-and-accumulate reference gives; a
// NaN-poisoned unwritten buffer catches an op that reads what it should overwrite;
// and a steady training step takes no new memory from the system.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "models/fashion_net.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

using FirstWrite = Tape::FirstWrite;
using VariableGrads = Tape::VariableGrads;

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t nonfinite = 0;
  for (float g : got) nonfinite += std::isfinite(g) ? 0 : 1;
  EXPECT_EQ(nonfinite, 0u) << what << ": an op read a gradient it should have overwritten";
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << what << ": gradients differ from the zero-filled reference";
}

// Every trainable gradient of `store`, flat, after one pass of `pass` on a tape in
// `mode` computing in `compute`. Unwritten variable gradients start as NaN: the
// backward must never read them (and must zero-fill those it does not write).
template <typename Pass>
std::vector<float> gradients(VariableStore& store, FirstWrite mode, const Pass& pass,
                             VariableGrads variable_grads = VariableGrads::Zeroed,
                             DType compute = DType::Float32) {
  Tape tape(cpu());
  tape.set_compute_dtype(compute);
  tape.set_first_write(mode);
  tape.set_variable_grads(variable_grads);
  if (variable_grads == VariableGrads::Zeroed) {
    store.zero_grad(cpu());
  } else {
    fill(store.flat_grads(), std::numeric_limits<double>::quiet_NaN(), cpu());
  }
  tape.backward(pass(tape));
  return store.flat_grads().to_host<float>();
}

// `pass`'s gradients under Assign and Poisoned, with zero-filled and with unwritten
// variable gradients (and Zeroed with unwritten ones), against the zero-filled
// reference's bits, on a tape computing in `compute`. (On a 16-bit tape Zeroed also
// hands out no rounded gradient, Tape::grad_target_rounded: the reference rounds
// every one where its reader reads it.)
template <typename Pass>
void expect_reference_bits(VariableStore& store, const Pass& pass, DType compute = DType::Float32) {
  const VariableGrads zeroed = VariableGrads::Zeroed;
  const std::vector<float> reference = gradients(store, FirstWrite::Zeroed, pass, zeroed, compute);
  expect_same_bits(gradients(store, FirstWrite::Assign, pass, zeroed, compute), reference,
                   "assign");
  expect_same_bits(gradients(store, FirstWrite::Poisoned, pass, zeroed, compute), reference,
                   "poisoned");
  for (FirstWrite mode : {FirstWrite::Zeroed, FirstWrite::Assign, FirstWrite::Poisoned}) {
    expect_same_bits(gradients(store, mode, pass, VariableGrads::Unwritten, compute), reference,
                     mode == FirstWrite::Zeroed   ? "unwritten variables, zeroed"
                     : mode == FirstWrite::Assign ? "unwritten variables, assign"
                                                  : "unwritten variables, poisoned");
  }
}

Tensor labels_for(std::int64_t n) {
  std::vector<float> ids(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  return Tensor::from_host<float>(ids, {n}, cpu());
}

// A classifier's gradients (softmax cross-entropy on normal random images of
// `images_shape`, labels 0-9 in turn) under Assign and Poisoned against the
// zero-filled reference's bits.
void expect_classifier_gradients_match(Sequential& net, VariableStore& store,
                                       const Shape& images_shape, std::uint64_t images_seed,
                                       DType compute = DType::Float32) {
  Tensor images = Tensor::empty(images_shape, cpu());
  random_normal(images, images_seed, 0, 0.0f, 1.0f, cpu());
  const Tensor labels = labels_for(images_shape[0]);
  auto pass = [&](Tape& tape) {
    Context ctx{tape, store, true};
    return ag::softmax_cross_entropy(net(ctx, tape.constant(images)), tape.constant(labels));
  };
  expect_reference_bits(store, pass, compute);
}

TEST(TapeFirstWrite, FashionNetGradientsAreTheZeroFilledReferenceBits) {
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  VariableStore store(vars, cpu());
  store.initialize(3, cpu());
  expect_classifier_gradients_match(net, store, {12, 1, 28, 28}, 4);
}

// On a bfloat16 tape, where each convolution's output gradient is handed to the batch
// norm after it in bfloat16 (Tape::grad_target_rounded), written rounded there
// instead of rounded by the convolution: the same bits.
TEST(TapeFirstWrite, Bf16FashionNetAndResNetGradientsAreTheZeroFilledReferenceBits) {
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  VariableStore store(vars, cpu());
  store.initialize(3, cpu());
  expect_classifier_gradients_match(net, store, {12, 1, 28, 28}, 4, DType::BFloat16);
  VariableSet resnet_vars;
  Sequential resnet = models::resnet(resnet_vars, {.width = 8, .blocks_per_stage = 1});
  VariableStore resnet_store(resnet_vars, cpu());
  resnet_store.initialize(9, cpu());
  expect_classifier_gradients_match(resnet, resnet_store, {6, 1, 12, 12}, 10, DType::BFloat16);
}

// Tape::grad_target_rounded: on a bfloat16 CPU tape a convolution's output whose one
// reader is a batch norm gets its gradient in bfloat16 under Assign and Poisoned,
// the variables' gradients the bits of Zeroed's, which hands out float32; a second
// reader of the output, a convolution with a bias (whose gradient sums the float32
// output gradient) or a float32 tape keep it float32.
TEST(TapeFirstWrite, ARoundedGradientGoesOnlyWhereItsOneReaderRoundsIt) {
  VariableSet vars;
  vars.get("w", {4, 3, 3, 3}, Initializer::normal(0.0f, 0.5f));
  vars.get("b", {4}, Initializer::normal(0.0f, 0.5f));
  vars.get("gamma", {4}, Initializer::normal(1.0f, 0.1f));
  vars.get("beta", {4}, Initializer::normal(0.0f, 0.1f));
  VariableStore store(vars, cpu());
  store.initialize(7, cpu());
  Tensor images = Tensor::empty({2, 3, 6, 6}, cpu());
  random_normal(images, 8, 0, 0.0f, 1.0f, cpu());
  struct Run {
    std::vector<float> grads;
    DType y_grad;
  };
  auto run = [&](FirstWrite mode, DType compute, bool bias, bool second_reader) {
    Tape tape(cpu());
    tape.set_compute_dtype(compute);
    tape.set_first_write(mode);
    store.zero_grad(cpu());
    Context ctx{tape, store, true};
    const Var y = ag::conv2d(tape.constant(images), ctx.variable("w"),
                             bias ? ctx.variable("b") : Var(), {.pad_h = 1, .pad_w = 1});
    // The second reader is recorded first, so that the batch norm's backward, which
    // runs before its, makes the first write to y's gradient.
    const Var other = second_reader ? ag::sum(y) : Var();
    const Var z = ag::batchnorm(y, ctx.variable("gamma"), ctx.variable("beta"), Tensor(), Tensor(),
                                true, 0.9, 1e-5, Activation::ReLU);
    Var loss = ag::sum(ag::mul(z, z));
    if (second_reader) loss = ag::add(loss, other);
    tape.backward(loss);
    return Run{store.flat_grads().to_host<float>(), y.grad().dtype()};
  };
  for (const bool bias : {false, true}) {
    for (const bool second_reader : {false, true}) {
      const std::string where = std::string(bias ? "bias" : "no bias") +
                                (second_reader ? ", two readers" : ", one reader");
      const Run reference = run(FirstWrite::Zeroed, DType::BFloat16, bias, second_reader);
      EXPECT_EQ(reference.y_grad, DType::Float32) << where;
      const DType handed = bias || second_reader ? DType::Float32 : DType::BFloat16;
      for (const FirstWrite mode : {FirstWrite::Assign, FirstWrite::Poisoned}) {
        const Run got = run(mode, DType::BFloat16, bias, second_reader);
        EXPECT_EQ(got.y_grad, handed) << where;
        expect_same_bits(got.grads, reference.grads, where.c_str());
      }
      EXPECT_EQ(run(FirstWrite::Assign, DType::Float32, bias, second_reader).y_grad, DType::Float32)
          << where;
    }
  }
}

TEST(TapeFirstWrite, ElementwiseOpsAndValuesUsedTwiceGiveTheReferenceBits) {
  VariableSet vars;
  vars.get("a", {6, 5}, Initializer::normal(0.0f, 1.0f));
  vars.get("b", {5, 4}, Initializer::normal(0.0f, 1.0f));
  vars.get("bias", {4}, Initializer::normal(0.0f, 1.0f));
  VariableStore store(vars, cpu());
  store.initialize(5, cpu());
  // Every op that writes through grad_target (matmul, bias_add, relu, add, sub, mul,
  // scale, reshape), with values consumed twice so that a second contribution
  // accumulates onto an assigned first one.
  auto pass = [&](Tape& tape) {
    Context ctx{tape, store, true};
    Var a = ctx.variable("a"), b = ctx.variable("b");
    Var h = ag::bias_add(ag::matmul(a, b), ctx.variable("bias"));  // [6,4]
    Var r = ag::relu(h);
    Var s = ag::sub(ag::mul(r, h), ag::scale(r, 0.5));
    Var t = ag::add(s, s);
    Var flat = ag::flatten(ag::add(t, h));
    return ag::sum(ag::mul(flat, flat));
  };
  expect_reference_bits(store, pass);
}

// The residual network's blocks (convolutions without bias, batch norm, projection
// shortcuts, the residual add and ReLU, global pooling) and the MLP's dropout.
TEST(TapeFirstWrite, ResNetAndMlpGradientsAreTheZeroFilledReferenceBits) {
  VariableSet vars;
  Sequential net = models::resnet(vars, {.width = 4, .blocks_per_stage = 1});
  VariableStore store(vars, cpu());
  store.initialize(9, cpu());
  expect_classifier_gradients_match(net, store, {6, 1, 12, 12}, 10);
  VariableSet mlp_vars;
  Sequential mlp = models::mlp(mlp_vars, {.inputs = 64, .hidden = {16, 8}});
  VariableStore mlp_store(mlp_vars, cpu());
  mlp_store.initialize(11, cpu());
  expect_classifier_gradients_match(mlp, mlp_store, {7, 64}, 12);
}

// Under VariableGrads::Unwritten a variable's first write assigns through any of
// its Vars and the next adds (a weight read by a layer and by a regularizer); one
// that nothing reads, or that only an op outside the loss's path reads, is
// zero-filled by the backward; the listener hears of each once its zeros are in;
// and a second Var of the name with another gradient tensor is refused.
TEST(TapeFirstWrite, UnwrittenVariableGradientsAreAssignedOrZeroFilled) {
  VariableSet vars;
  vars.get("w", {3, 4}, Initializer::normal(0.0f, 1.0f));
  vars.get("unread", {5}, Initializer::ones());
  vars.get("off_path", {2}, Initializer::ones());
  VariableStore store(vars, cpu());
  store.initialize(13, cpu());
  const Tensor x = Tensor::from_host<float>(random_values(2 * 3, 14), {2, 3}, cpu());
  auto pass = [&](Tape& tape) {
    Context ctx{tape, store, true};
    Var w = ctx.variable("w");
    ctx.variable("unread");
    ag::scale(ctx.variable("off_path"), 2.0);  // recorded, but the loss does not use it
    Var y = ag::matmul(tape.constant(x), w);   // the first write: assigned
    Var again = ctx.variable("w");             // a second Var of w: adds
    return ag::add_n({ag::sum(ag::mul(y, y)), ag::sum(ag::mul(again, again))});
  };
  expect_reference_bits(store, pass);
  const auto grads = gradients(store, FirstWrite::Assign, pass, VariableGrads::Unwritten);
  EXPECT_EQ(std::vector<float>(grads.begin() + 12, grads.end()), std::vector<float>(7, 0.0f))
      << "unread and off_path: zero-filled";
  // The control: without the tape's zero-fill they would keep the NaN they started with.
  {
    Tape tape(cpu());
    tape.set_variable_grads(VariableGrads::Unwritten);
    fill(store.flat_grads(), std::numeric_limits<double>::quiet_NaN(), cpu());
    pass(tape);  // no backward: nothing written, nothing zero-filled
    EXPECT_TRUE(std::isnan(store.flat_grads().to_host<float>()[12]));
  }

  struct Heard : GradientListener {
    VariableStore* store;
    std::vector<std::string> names;
    void gradient_ready(const std::string& name) override {
      // Its final values are in when the listener hears of it: no NaN left.
      for (float g : store->grad(name).to_host<float>()) EXPECT_FALSE(std::isnan(g)) << name;
      names.push_back(name);
    }
  } heard;
  heard.store = &store;
  Tape tape(cpu());
  tape.set_variable_grads(VariableGrads::Unwritten);
  tape.set_gradient_listener(&heard);
  fill(store.flat_grads(), std::numeric_limits<double>::quiet_NaN(), cpu());
  tape.backward(pass(tape));
  // unread before any record runs; w after its first reader, the product; off_path
  // after the scale that reads it, which is recorded first and so replayed last.
  EXPECT_EQ(heard.names, (std::vector<std::string>{"unread", "w", "off_path"}));

  Tape strict(cpu());
  strict.set_variable_grads(VariableGrads::Unwritten);
  strict.variable(store.value("w"), store.grad("w"), "w");
  EXPECT_THROW_WITH(strict.variable(store.value("w"), Tensor::zeros({3, 4}, cpu()), "w"),
                    InvalidArgument, "made again with another gradient tensor");
}

// The ViT's backward hands gradients on without copies (Tape::pass_grad: its
// reshapes, its linear layers' bias adds, its residual adds) through permutes, layer
// norms, attention and dropout: the zero-filled reference's bits all the same.
TEST(TapeFirstWrite, VitGradientsAreTheZeroFilledReferenceBits) {
  VariableSet vars;
  Sequential net = models::vit(vars, {.image = 8, .dim = 16, .heads = 2, .blocks = 2});
  VariableStore store(vars, cpu());
  store.initialize(7, cpu());
  expect_classifier_gradients_match(net, store, {5, 1, 8, 8}, 8);
}

// pass_grad: a first write to an intermediate takes the tensor itself (the same
// memory), a second one adds; a variable's gradient is added to, never replaced;
// under FirstWrite::Zeroed every contribution is added to zeros (the control: the
// memory is not shared there, so the sharing seen under Assign is pass_grad's).
TEST(TapeFirstWrite, PassGradSharesAFirstWriteAndAddsTheRest) {
  VariableSet vars;
  vars.get("w", {2, 3}, Initializer::normal(0.0f, 1.0f));
  VariableStore store(vars, cpu());
  store.initialize(3, cpu());
  for (FirstWrite mode : {FirstWrite::Assign, FirstWrite::Poisoned, FirstWrite::Zeroed}) {
    SCOPED_TRACE(int(mode));
    Tape tape(cpu());
    tape.set_first_write(mode);
    store.zero_grad(cpu());
    Context ctx{tape, store, true};
    Var w = ctx.variable("w");
    Var h = ag::scale(w, 2.0);
    // A new tensor each time: a tensor handed on is not written by its giver.
    const auto g = [] { return Tensor::from_host<float>({1, 2, 3, 4, 5, 6}, {2, 3}, cpu()); };
    const Tensor first = g();
    tape.pass_grad(h, first);
    EXPECT_EQ(h.grad().data<float>() == first.data<float>(), mode != FirstWrite::Zeroed);
    EXPECT_EQ(h.grad().to_host<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    tape.pass_grad(h, g());  // a second contribution adds
    EXPECT_EQ(h.grad().to_host<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
    fill(w.grad(), 0.5, cpu());  // sentinel: a variable's gradient is added to
    const Tensor third = g();
    tape.pass_grad(w, third);
    EXPECT_NE(w.grad().data<float>(), third.data<float>());
    EXPECT_EQ(w.grad().to_host<float>(), (std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f}));
  }
}

// An op that takes grad_target() and then adds into the gradient whatever `assign`
// says (the bug the poison exists for), or honours it.
Var doubled(const Var& x, bool honours_assign) {
  Tape& tape = x.tape();
  Tensor y = Tensor::empty(x.shape(), cpu());
  scale(y, x.value(), 2.0, cpu());
  return tape.record(y, "doubled", {x}, [x, honours_assign](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget g = t.grad_target(x);
    if (honours_assign && g.assign) {
      scale(g.grad, out.grad(), 2.0, cpu());
    } else {
      axpy(g.grad, 2.0, out.grad(), cpu());
    }
  });
}

TEST(TapeFirstWrite, PoisonCatchesAnOpThatAccumulatesIntoAnUnwrittenGradient) {
  VariableSet vars;
  vars.get("w", {7}, Initializer::normal(0.0f, 1.0f));
  VariableStore store(vars, cpu());
  store.initialize(2, cpu());
  for (bool honours : {true, false}) {
    SCOPED_TRACE(honours ? "op honours assign" : "op always accumulates");
    auto pass = [&](Tape& tape) {
      Context ctx{tape, store, true};
      Var w = ctx.variable("w");
      return ag::sum(doubled(ag::scale(w, 3.0), honours));
    };
    const std::vector<float> reference = gradients(store, FirstWrite::Zeroed, pass);
    for (float g : reference) EXPECT_EQ(g, 6.0f);  // d(sum(2 * 3w))/dw
    const std::vector<float> poisoned = gradients(store, FirstWrite::Poisoned, pass);
    for (float g : poisoned) EXPECT_EQ(std::isnan(g), !honours) << g;
  }
}

TEST(TapeFirstWrite, OnlyTheFirstContributionToAnIntermediateAssigns) {
  VariableSet vars;
  vars.get("w", {3}, Initializer::normal(0.0f, 1.0f));
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  for (FirstWrite mode : {FirstWrite::Assign, FirstWrite::Zeroed}) {
    Tape tape(cpu());
    tape.set_first_write(mode);
    Context ctx{tape, store, true};
    Var w = ctx.variable("w");
    Var h = ag::scale(w, 2.0);
    const Tape::GradTarget first = tape.grad_target(h);
    EXPECT_EQ(first.assign, mode == FirstWrite::Assign);
    if (!first.assign) {
      for (float g : first.grad.to_host<float>()) EXPECT_EQ(g, 0.0f);
    }
    EXPECT_FALSE(tape.grad_target(h).assign);  // a second contribution accumulates
    EXPECT_FALSE(tape.grad_target(w).assign);  // a variable's gradient always accumulates
    EXPECT_EQ(tape.grad_target(h).grad.data<float>(), first.grad.data<float>());
  }
  Tape tape(cpu());
  Var c = tape.constant(Tensor::zeros({2}, cpu()));
  EXPECT_THROW_WITH(tape.grad_target(c), InvalidArgument, "does not require a gradient");
}

// Once the allocator's cache holds a step's working set, training steps on a CPU
// tower take no new memory from the system: every tensor and scratch buffer of a
// step is served from blocks the step before freed. The second step still grows
// the cache: the optimizer's state, created by the first update, sits in blocks
// that the first step's activations had used. (Two CPU towers allocate from the
// one host cache in an order that varies with timing, so its layout, and whether
// a late step needs one more segment, varies too: one tower only here.)
TEST(TapeFirstWrite, SteadyCpuStepsTakeNoNewMemory) {
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  TrainerOptions options;
  options.devices = {Device::cpu()};
  options.master = Device::cpu();
  Trainer trainer(
      vars,
      [&](const Tower& tower, const std::vector<Tensor>& b) {
        Var logits = net(tower.context(), tower.input(b[0]));
        return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
      },
      Optimizer::by_name("adam", 1e-3), options);
  Tensor images = Tensor::empty({16, 1, 28, 28}, cpu());
  random_normal(images, 6, 0, 0.0f, 1.0f, cpu());
  const Tensor labels = labels_for(16);
  for (int step = 1; step <= 2; ++step) trainer.step({images, labels});
  Allocator& host = device_allocator(Device::cpu());
  const MemoryStats before = host.stats();
  for (int step = 3; step <= 8; ++step) trainer.step({images, labels});
  const MemoryStats after = host.stats();
  EXPECT_EQ(after.segment_allocations, before.segment_allocations);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

}  // namespace
}  // namespace towerlab::testing
