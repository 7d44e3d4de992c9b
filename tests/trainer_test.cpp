// The multi-device trainer on virtual CPU devices: N towers take the same steps as
// one tower on the whole batch (even, uneven and smaller-than-tower-count batches,
// SGD and Adam), outputs come back in input order, a checkpoint trained on four
// towers predicts the same on one, and misuse is a clear error. On every backend
// (cuda:0 where a GPU is): virtual towers take one tower's steps with the master
// on the CPU or the GPU, and their checkpoint predicts the same on the CPU.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bn_model.h"
#include "cnn_model.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// A small CNN without batch norm (local batch norm is not equivalent across towers),
// with an L2 term and a logged data loss.
struct Model : CnnModel {
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Context ctx = tower.context();
      Var logits = net(ctx, tower.input(batch[0], "images"));
      Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"));
      Var total = ag::add_n({loss, l2_regularization(ctx, 1e-3)});
      return TowerResult{total, {logits}, {{"data_loss", loss}}};
    };
  }
};

std::vector<Tensor> make_batch(std::int64_t n, unsigned seed) {
  return small_image_batch(n, seed, 7);
}

TrainerOptions on_cpu_towers(int towers) {
  TrainerOptions o;
  o.devices.assign(std::size_t(towers), Device::cpu());
  o.seed = 11;
  return o;
}

void expect_same_steps(const char* optimizer, double lr) {
  Model model;
  for (std::int64_t batch : {1, 3, 7, 8}) {
    Trainer reference(model.vars, model.tower_fn(), Optimizer::by_name(optimizer, lr),
                      on_cpu_towers(1));
    std::vector<StepResult> ref_steps;
    for (int s = 0; s < 3; ++s) ref_steps.push_back(reference.step(make_batch(batch, 20 + s)));
    const auto ref_values = reference.master().flat_values().to_host<float>();
    for (int towers : {2, 3, 4}) {
      Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name(optimizer, lr),
                      on_cpu_towers(towers));
      for (int s = 0; s < 3; ++s) {
        const StepResult r = trainer.step(make_batch(batch, 20 + s));
        EXPECT_NEAR(r.loss, ref_steps[std::size_t(s)].loss,
                    1e-5 * std::abs(ref_steps[std::size_t(s)].loss))
            << optimizer << ", batch " << batch << ", " << towers << " towers, step " << s;
        EXPECT_TRUE(all_close(r.outputs[0].to_host<float>(),
                              ref_steps[std::size_t(s)].outputs[0].to_host<float>(), 1e-5, 1e-4))
            << "outputs in input order; batch " << batch << ", " << towers << " towers";
      }
      EXPECT_TRUE(
          all_close(trainer.master().flat_values().to_host<float>(), ref_values, 2e-6, 1e-4))
          << optimizer << ", batch " << batch << ", " << towers << " towers";
      // Every replica holds the master's values after the step.
      for (int i = 0; i < towers; ++i) {
        EXPECT_EQ(trainer.replica(std::size_t(i)).flat_values().to_host<float>(),
                  trainer.master().flat_values().to_host<float>())
            << "replica " << i;
      }
    }
  }
}

TEST(Trainer, TowersTakeTheSameStepsAsOneDeviceWithSgd) {
  expect_same_steps("momentum", 0.1);
}

TEST(Trainer, TowersTakeTheSameStepsAsOneDeviceWithAdam) {
  expect_same_steps("adam", 1e-2);
}

// With batch norm (tests/bn_model.h): synchronized across towers it is exactly one
// device's batch norm.
TEST(Trainer, SynchronizedBatchNormMatchesOneDevice) {
  BnModel model;
  for (const char* optimizer : {"momentum", "adam"}) {
    for (std::int64_t batch : {3, 7, 8}) {
      Trainer reference(model.vars, model.tower_fn(), Optimizer::by_name(optimizer, 1e-2),
                        on_cpu_towers(1));
      for (int s = 0; s < 3; ++s) reference.step(make_batch(batch, 30 + s));
      for (int towers : {2, 3, 4}) {
        TrainerOptions options = on_cpu_towers(towers);
        options.batchnorm = BatchNormMode::Sync;
        Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name(optimizer, 1e-2), options);
        for (int s = 0; s < 3; ++s) trainer.step(make_batch(batch, 30 + s));
        EXPECT_TRUE(all_close(trainer.master().flat_values().to_host<float>(),
                              reference.master().flat_values().to_host<float>(), 1e-5, 1e-4))
            << optimizer << ", batch " << batch << ", " << towers << " towers";
        EXPECT_TRUE(all_close(trainer.master().flat_state().to_host<float>(),
                              reference.master().flat_state().to_host<float>(), 1e-5, 1e-4))
            << "moving statistics; " << optimizer << ", batch " << batch << ", " << towers
            << " towers";
      }
    }
  }
}

// One tower alone: synchronized batch norm has no one to synchronize with and
// gives local batch norm's bits.
TEST(Trainer, OneTowerWithSynchronizedBatchNormIsLocalBatchNorm) {
  BnModel model;
  TrainerOptions sync = on_cpu_towers(1);
  sync.batchnorm = BatchNormMode::Sync;
  Trainer local(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), on_cpu_towers(1));
  Trainer synced(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), sync);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(synced.step(make_batch(8, 90 + s)).loss, local.step(make_batch(8, 90 + s)).loss);
  }
  EXPECT_EQ(synced.master().flat_values().to_host<float>(),
            local.master().flat_values().to_host<float>());
  EXPECT_EQ(synced.master().flat_state().to_host<float>(),
            local.master().flat_state().to_host<float>());
}

TEST(Trainer, UpdatedVariablesAreTheMovingStatistics) {
  BnModel model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), on_cpu_towers(1));
  EXPECT_EQ(trainer.updated_variables(),
            (std::vector<std::string>{"bn1/moving_mean", "bn1/moving_variance", "bn2/moving_mean",
                                      "bn2/moving_variance"}));
}

TEST(Trainer, LocalBatchNormIsNotOneDevicesBatchNorm) {
  // The control for the test above: without synchronization the towers' steps differ.
  BnModel model;
  Trainer reference(model.vars, model.tower_fn(), Optimizer::by_name("momentum", 1e-2),
                    on_cpu_towers(1));
  Trainer local(model.vars, model.tower_fn(), Optimizer::by_name("momentum", 1e-2),
                on_cpu_towers(2));
  reference.step(make_batch(8, 3));
  local.step(make_batch(8, 3));
  EXPECT_FALSE(all_close(local.master().flat_values().to_host<float>(),
                         reference.master().flat_values().to_host<float>(), 1e-5, 1e-4));
}

// The same on virtual devices of every backend: towers on cuda:0 (streams of one
// GPU) where a GPU is, and with the master on the CPU or on the towers' device.
class TrainerBackendTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(TrainerBackendTest);

TEST_P(TrainerBackendTest, VirtualTowersMatchOneTowerWithMasterAnywhere) {
  BnModel model;
  TrainerOptions one;
  one.devices = {device()};
  one.master = device();
  one.seed = 11;
  Trainer reference(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), one);
  for (int s = 0; s < 3; ++s) reference.step(make_batch(7, 50 + s));
  const auto expected = reference.master().flat_values().to_host<float>(default_stream(device()));
  // Under ThreadSanitizer the emulated GPUs' streams and their CUDA threads are
  // host threads it shadows: six trainers of them outgrow its memory, so three
  // towers stand for two to four there.
  const bool sanitized_gpu = kThreadSanitizer && kEmulatedGpus && device().is_cuda();
  const std::vector<int> tower_counts =
      sanitized_gpu ? std::vector<int>{3} : std::vector<int>{2, 3, 4};
  for (int towers : tower_counts) {
    for (Device master : {Device::cpu(), device()}) {
      TrainerOptions options;
      options.devices.assign(std::size_t(towers), device());
      options.master = master;
      options.seed = 11;
      options.batchnorm = BatchNormMode::Sync;
      Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
      for (int s = 0; s < 3; ++s) trainer.step(make_batch(7, 50 + s));
      EXPECT_TRUE(all_close(trainer.master().flat_values().to_host<float>(default_stream(master)),
                            expected, 1e-5, 1e-4))
          << towers << " towers on " << device().str() << ", master on " << master.str();
    }
  }
}

// Without a master device the master lives on the first tower's device: GPU
// towers update on the GPU, CPU towers on the host.
TEST_P(TrainerBackendTest, TheMasterDefaultsToTheFirstTowersDevice) {
  BnModel model;
  TrainerOptions options;
  options.devices.assign(2, device());
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
  EXPECT_EQ(trainer.master().device(), device());
  EXPECT_EQ(trainer.master_stream().device(), device());
  options.master = Device::cpu();
  Trainer on_host(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
  EXPECT_EQ(on_host.master().device(), Device::cpu()) << "an explicit master is kept";
}

// A checkpoint trained on two virtual towers of the backend's device (cuda:0,cuda:0
// where a GPU is) loads into one tower on the CPU, which predicts what they predict.
TEST_P(TrainerBackendTest, CheckpointFromVirtualTowersPredictsTheSameOnTheCpu) {
  BnModel model;
  TrainerOptions two;
  two.devices.assign(2, device());
  two.master = device();
  two.seed = 11;
  two.batchnorm = BatchNormMode::Sync;
  Trainer trained(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), two);
  for (int s = 0; s < 3; ++s) trained.step(make_batch(8, 60 + s));
  const auto path = (std::filesystem::temp_directory_path() /
                     ("towerlab-virtual-" + std::to_string(::getpid()) + ".safetensors"))
                        .string();
  save_checkpoint(path, trained.master(), &trained.optimizer());
  Trainer host(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), on_cpu_towers(1));
  load_checkpoint(path, host.master(), &host.optimizer(), cpu());
  host.broadcast();
  std::filesystem::remove(path);
  EXPECT_EQ(host.master().flat_values().to_host<float>(),
            trained.master().flat_values().to_host<float>(default_stream(device())))
      << "the checkpoint holds the trained bits";
  const auto test = make_batch(9, 88);
  const auto on_cpu = host.evaluate(test).outputs[0].to_host<float>();
  const auto on_towers = trained.evaluate(test).outputs[0].to_host<float>();
  EXPECT_TRUE(all_close(on_cpu, on_towers, 1e-5, 1e-4))
      << "logits on the CPU against " << device().str();
  const std::size_t classes = on_cpu.size() / 9;
  for (std::size_t row = 0; row < 9; ++row) {
    const auto argmax = [&](const std::vector<float>& logits) {
      const auto first = logits.begin() + std::ptrdiff_t(row * classes);
      return std::max_element(first, first + std::ptrdiff_t(classes)) - first;
    };
    EXPECT_EQ(argmax(on_cpu), argmax(on_towers)) << "the predicted class of row " << row;
  }
}

// CPU towers of a master on the host share one memory: their replicas' values are
// the master's, and under bf16 they read one working copy, rounded from the values
// each update wrote, right after it. GPU towers, and a sharded master, keep copies
// of their own, each rounded at the start of the tower's forward: after a step it
// holds the values that step began from.
TEST_P(TrainerBackendTest, CpuTowersOfAHostMasterShareItsValues) {
  BnModel model;
  TrainerOptions options;
  options.devices.assign(3, device());
  options.master = Device::cpu();
  options.seed = 11;
  options.precision = Precision::Bf16;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
  const bool shared = device().is_cpu();
  const Stream& host = trainer.master_stream();
  const auto rounded_master = [&] {
    return cast(cast(trainer.master().flat_values(), DType::BFloat16, host), DType::Float32, host)
        .to_host<float>(host);
  };
  for (int s = 0; s < 2; ++s) {
    const auto before = rounded_master();
    trainer.step(make_batch(7, 60 + s));
    const Stream& stream = default_stream(device());
    const auto values = trainer.master().flat_values().to_host<float>();
    // One memory: the working copy after the step is the new values rounded once,
    // after the update. Copies of their own: the values the step's forward read.
    const auto after = rounded_master();
    ASSERT_NE(after, values) << "the control: bfloat16 rounding changes some values";
    ASSERT_NE(after, before) << "the control: the step moved some rounded values";
    const auto& rounded = shared ? after : before;
    for (std::size_t i = 0; i < trainer.num_towers(); ++i) {
      const VariableStore& replica = trainer.replica(i);
      EXPECT_EQ(replica.shares_values_with(trainer.master()), shared) << "replica " << i;
      EXPECT_EQ(replica.flat_working().raw_data() == trainer.replica(0).flat_working().raw_data(),
                shared || i == 0)
          << "replica " << i << "'s working copy";
      EXPECT_EQ(replica.flat_values().to_host<float>(stream), values) << "replica " << i;
      EXPECT_EQ(cast(replica.flat_working(), DType::Float32, stream).to_host<float>(stream),
                rounded)
          << "replica " << i << " after step " << s;
    }
  }
  options.master.reset();
  options.master_placement = MasterPlacement::Sharded;
  Trainer sharded(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
  sharded.step(make_batch(7, 60));
  for (std::size_t i = 0; i < sharded.num_towers(); ++i) {
    EXPECT_FALSE(sharded.replica(i).shares_values_with(sharded.master())) << "sharded, " << i;
  }
}

// Towers on three GPUs (each its own device: peer copies in the ring, a master on
// another GPU or on the host) take the steps of one CPU device.
TEST(Trainer, TowersOnThreeGpusMatchOneCpuDeviceWithTheMasterOnAGpuOrTheHost) {
  if (cuda_device_count() < 3) GTEST_SKIP() << "needs three CUDA devices";
  BnModel model;
  Trainer reference(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
                    on_cpu_towers(1));
  for (int s = 0; s < 3; ++s) reference.step(make_batch(7, 70 + s));
  const auto expected = reference.master().flat_values().to_host<float>();
  for (Device master : {Device::cuda(1), Device::cpu()}) {
    TrainerOptions options = on_cpu_towers(1);
    options.devices = {Device::cuda(0), Device::cuda(1), Device::cuda(2)};
    options.master = master;
    options.batchnorm = BatchNormMode::Sync;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
    for (int s = 0; s < 3; ++s) trainer.step(make_batch(7, 70 + s));
    EXPECT_TRUE(all_close(trainer.master().flat_values().to_host<float>(default_stream(master)),
                          expected, 1e-5, 1e-4))
        << "towers on cuda:0,cuda:1,cuda:2, master on " << master.str();
  }
}

TEST(Trainer, LossDecreasesAndLogsComeFromTheLastNonEmptyTower) {
  Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), on_cpu_towers(3));
  const auto batch = make_batch(12, 5);
  const double first = trainer.step(batch).loss;
  StepResult last;
  for (int i = 0; i < 20; ++i) last = trainer.step(batch);
  EXPECT_LT(last.loss, 0.5 * first);
  ASSERT_EQ(last.logs.count("data_loss"), 1u);
  EXPECT_GT(last.logs.at("data_loss"), 0.0);
  EXPECT_EQ(trainer.loss(), last.loss);
  EXPECT_EQ(trainer.optimizer().steps(), 21);
  EXPECT_EQ(trainer.gradients().numel(), model.vars.trainable_numel());
  EXPECT_EQ(trainer.gradient("fc/bias").shape(), (Shape{3}));
}

TEST(Trainer, CheckpointFromFourTowersPredictsTheSameOnOne) {
  Model model;
  Trainer four(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), on_cpu_towers(4));
  for (int i = 0; i < 3; ++i) four.step(make_batch(10, 40 + i));
  const auto path = (std::filesystem::temp_directory_path() /
                     ("towerlab-trainer-" + std::to_string(::getpid()) + ".safetensors"))
                        .string();
  save_checkpoint(path, four.master(), &four.optimizer());
  Trainer one(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), on_cpu_towers(1));
  load_checkpoint(path, one.master(), &one.optimizer(), cpu());
  one.broadcast();
  std::filesystem::remove(path);
  const auto test = make_batch(9, 77);
  EXPECT_TRUE(all_close(one.evaluate(test).outputs[0].to_host<float>(),
                        four.evaluate(test).outputs[0].to_host<float>(), 1e-6, 1e-5));
}

TEST(Trainer, TraceShowsTowersAndTheRing) {
  Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), on_cpu_towers(2));
  Trace trace;
  trainer.set_trace(&trace);
  trainer.step(make_batch(6, 1));
  const std::string json = trace.json();
  // CPU towers of a host master: the ring's reduce to tower 0 (Ring::reduce), with
  // no all-gather.
  for (const char* name : {"\"forward\"", "\"backward\"", "\"reduce 0\"", "\"update + broadcast\"",
                           "\"tower 1 (cpu)\"", "\"master (cpu)\""}) {
    EXPECT_NE(json.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(json.find("all-gather"), std::string::npos);
  // The trainer's own spans name their phase as docs/one_step.md numbers it.
  const std::map<std::string, std::string> phase_of{
      {"forward", "2. run towers"},
      {"backward", "2. run towers"},
      {"update + broadcast", "7. update and broadcast"}};
  std::map<std::string, int> seen;
  const nlohmann::json parsed = nlohmann::json::parse(json);
  for (const auto& e : parsed["traceEvents"]) {
    const std::string name = e["name"];
    if (e["ph"] != "X" || !phase_of.contains(name)) continue;
    EXPECT_EQ(e["args"]["phase"], phase_of.at(name)) << e.dump();
    ++seen[name];
  }
  EXPECT_EQ(seen, (std::map<std::string, int>{
                      {"backward", 2}, {"forward", 2}, {"update + broadcast", 1}}));
}

// A bad sample is named by its row of the batch the caller passed, not by its row
// of the tower's slice (7 samples over 3 towers: rows 0-2, 3-4, 5-6; row 6 is tower
// 2's row 1), in a training step and in an evaluation.
TEST(Trainer, ABadLabelNamesItsRowOfTheBatch) {
  Model model;  // 3 classes
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), on_cpu_towers(3));
  std::vector<Tensor> batch = make_batch(7, 5);
  std::vector<float> labels = batch[1].to_host<float>();
  labels[6] = 9;
  batch[1] = Tensor::from_host<float>(labels, {7}, cpu());
  const std::string expected =
      "Trainer: tower 2 on cpu (samples 5 to 6 of the batch): softmax_cross_entropy_forward: "
      "labels[6] = 9 is not a class id in [0, 3) (row 6 of the batch)";
  for (bool training : {true, false}) {
    try {
      training ? trainer.step(batch) : trainer.evaluate(batch);
      ADD_FAILURE() << "a label outside the classes was accepted";
    } catch (const SampleError& e) {
      EXPECT_EQ(std::string(e.what()), expected);
      EXPECT_EQ(e.row(), 6);
    }
  }
  EXPECT_EQ(trainer.optimizer().steps(), 0);
}

// Inside each tower's forward and backward: every layer, in order and in reverse,
// with the tower's samples (7 split over 2 towers: 4 and 3).
TEST(Trainer, TraceShowsEachLayerOfEachTower) {
  Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), on_cpu_towers(2));
  Trace trace;
  trace.set_step(1);
  trainer.set_trace(&trace);
  trainer.step(make_batch(7, 1));
  trainer.set_trace(nullptr);
  trainer.step(make_batch(7, 2));  // not recorded
  const nlohmann::json parsed = nlohmann::json::parse(trace.json());
  std::vector<std::string> forward[2], backward[2];
  for (const auto& e : parsed["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["args"]["step"], 1) << e.dump();
    const int tower = e["tid"];
    if (tower == 2) continue;  // the master
    if (e["cat"] != "ring") EXPECT_EQ(e["args"]["samples"], tower == 0 ? 4 : 3) << e.dump();
    if (e["cat"] == "forward") forward[tower].push_back(e["name"]);
    if (e["cat"] == "backward") backward[tower].push_back(e["name"]);
  }
  for (int tower : {0, 1}) {
    EXPECT_EQ(forward[tower],
              (std::vector<std::string>{"conv1", "ReLU", "MaxPool2d", "Flatten", "fc"}));
    // The loss terms first, each run of one op named by it (made outside every
    // layer: add_n's adds, the L2 terms, the cross entropy), then the layers in reverse.
    EXPECT_EQ(backward[tower],
              (std::vector<std::string>{"add", "l2_loss", "softmax_cross_entropy", "fc", "Flatten",
                                        "MaxPool2d", "ReLU", "conv1"}));
  }
}

TEST(Trainer, ReductionToOneDeviceTakesTheRingsSteps) {
  Model model;
  TrainerOptions to_one = on_cpu_towers(3);
  to_one.reduction = AllReduce::ReduceToOne;
  Trainer ring(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), on_cpu_towers(3));
  Trainer one(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), to_one);
  for (int s = 0; s < 2; ++s) {
    ring.step(make_batch(8, 30 + s));
    one.step(make_batch(8, 30 + s));
  }
  EXPECT_TRUE(all_close(one.master().flat_values().to_host<float>(),
                        ring.master().flat_values().to_host<float>(), 1e-6, 1e-5));
  // The control: a third step on one of them only is told apart.
  one.step(make_batch(8, 40));
  EXPECT_FALSE(all_close(one.master().flat_values().to_host<float>(),
                         ring.master().flat_values().to_host<float>(), 1e-6, 1e-5));
}

TEST(Trainer, PlacementLogNamesEveryVariableAndTower) {
  Model model;
  std::ostringstream log;
  TrainerOptions options = on_cpu_towers(2);
  options.log_placement = true;
  options.log = &log;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
  EXPECT_NE(log.str().find("placement: tower 1 runs forward and backward on cpu"),
            std::string::npos)
      << log.str();
  EXPECT_NE(
      log.str().find("placement: variable fc/weight [3,64]: master on cpu, replicas on cpu cpu"),
      std::string::npos)
      << log.str();
}

TEST(Trainer, NcclNeedsOneTowerPerPhysicalGpu) {
  Model model;
  TrainerOptions options = on_cpu_towers(2);
  options.reduction = AllReduce::Nccl;
  try {
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
    ADD_FAILURE() << "NCCL accepted CPU towers";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("needs one tower per physical GPU; cpu is not a GPU") !=
                    std::string::npos ||
                msg.find("has no NCCL") != std::string::npos)
        << msg;
  }
}

TEST(Trainer, NcclMatchesTheRingOnTwoGpus) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  Model model;
  TrainerOptions ring;
  ring.devices = {Device::cuda(0), Device::cuda(1)};
  TrainerOptions nccl = ring;
  nccl.reduction = AllReduce::Nccl;
  Trainer a(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), ring);
  Trainer b(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), nccl);
  for (int s = 0; s < 3; ++s) {
    a.step(make_batch(8, 60 + s));
    b.step(make_batch(8, 60 + s));
  }
  EXPECT_TRUE(all_close(a.master().flat_values().to_host<float>(),
                        b.master().flat_values().to_host<float>(), 1e-6, 1e-5));
}

// Towers on the host and on a GPU together are refused before anything is built.
// Soft placement lets the list through placement on a machine without a GPU, and
// the refusal must not depend on whether the machine has one.
TEST(Trainer, HostAndGpuTowersTogetherAreRefused) {
  Model model;
  std::ostringstream log;
  TrainerOptions mixed = on_cpu_towers(2);
  mixed.devices.push_back(Device::cuda(0));
  mixed.soft_placement = true;
  mixed.log = &log;
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), mixed),
                    NotSupported,
                    "Trainer: towers on cpu and cuda:0 cannot be mixed (towers requested: cpu, "
                    "cpu, cuda:0); put every tower on the CPU or every tower on GPUs (the master "
                    "may be on either)");
  // Control: the same towers without the GPU one, with the master on the GPU, are fine.
  TrainerOptions host_towers = on_cpu_towers(2);
  host_towers.master = Device::cuda(0);
  host_towers.soft_placement = true;
  host_towers.log = &log;
  EXPECT_NO_THROW(
      Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), host_towers));
}

TEST(Trainer, ErrorsAreClear) {
  Model model;
  TrainerOptions none;
  none.devices.clear();
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), none),
                    InvalidArgument, "the device list is empty");

  TrainerOptions missing = on_cpu_towers(1);
  missing.devices.push_back(Device::cuda(cuda_device_count() + 1));
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), missing),
                    DeviceError, "devices present: cpu");
  TrainerOptions bad_master = on_cpu_towers(1);
  bad_master.master = Device::cuda(cuda_device_count() + 1);
  EXPECT_THROW_WITH(
      Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), bad_master),
      DeviceError, "is not available");

  std::ostringstream log;
  TrainerOptions soft_options;
  soft_options.devices = {Device::cuda(cuda_device_count()), Device::cuda(cuda_device_count() + 1)};
  soft_options.soft_placement = true;
  soft_options.log = &log;
  Trainer soft(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), soft_options);
  EXPECT_NE(log.str().find("(soft placement)"), std::string::npos);
  EXPECT_EQ(soft.num_towers(), 2u);

  TowerFn no_loss = [](const Tower&, const std::vector<Tensor>&) { return TowerResult{}; };
  Trainer silent(model.vars, no_loss, Optimizer::by_name("sgd", 0.1), on_cpu_towers(2));
  EXPECT_THROW_WITH(silent.step(make_batch(4, 1)), InvalidArgument,
                    "Trainer: tower 0 on cpu (samples 0 to 1 of the batch): the tower "
                    "function returned no loss");

  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), on_cpu_towers(2));
  EXPECT_THROW_WITH(trainer.step({Tensor::zeros({0, 1, 8, 8}, cpu()), Tensor::zeros({0}, cpu())}),
                    InvalidArgument, "the batch is empty (0 samples)");
  EXPECT_THROW_WITH(trainer.step({Tensor::zeros({4, 1, 8, 8}, cpu()), Tensor::zeros({3}, cpu())}),
                    ShapeError, "their first dimensions differ");
  // The trainer stays usable after a refused step.
  EXPECT_NO_THROW(trainer.step(make_batch(4, 2)));
}

}  // namespace
}  // namespace towerlab::testing
