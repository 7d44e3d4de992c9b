// towerlab's error paths under the faults a GPU can throw at it, injected on the
// emulated GPUs (emulator/include/tlemu/emulator.h), which is the only place they
// can be made to happen on purpose:
// - a failed cudaMalloc: the caching allocator survives one (it releases its cache
//   and retries); two in a row are an OutOfMemory naming the device, and a trainer
//   whose step ran out takes the next steps as if the failed one had never begun;
// - peer access refused (TOWERLAB_EMULATED_PEER=0, for the whole process: towerlab
//   enables a pair once and remembers, so refusing it half-way through a process
//   would test nothing real; ctest runs the peer cases both ways): the ring stages
//   through the host and takes the same steps;
// - a kernel that faults: a CudaError naming the device and the sticky error, at
//   this step and every later one (a faulted CUDA context is lost until the process
//   ends: the trainer must not go on as if nothing happened), and so is an
//   allocation on the faulted device, never an OutOfMemory;
// - a tower's stream held back: the ring waits for the tower's event, and the step
//   is the same, bit for bit.
// Each case starts and ends with no fault pending and no device faulted
// (tlemu::clear_faults()).
#include "cnn_model.h"
#include "test_util.h"

#if TOWERLAB_EMULATED_CUDA
#include <chrono>
#include <regex>

#include "kernels/relu.h"
#include "tlemu/emulator.h"

namespace towerlab::testing {
namespace {

// tests/cnn_model.h: towers and one device take the same steps.
struct Model : CnnModel {
  // `before` runs first in every tower, on the tower's thread (to hold its stream back).
  TowerFn tower_fn(std::function<void(const Tower&)> before = {}) const {
    return [this, before](const Tower& tower, const std::vector<Tensor>& batch) {
      if (before) before(tower);
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      return TowerResult{
          ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")), {}, {}};
    };
  }
};

TrainerOptions towers(std::vector<Device> devices) {
  TrainerOptions o;
  o.devices = std::move(devices);
  o.seed = 3;
  return o;
}

std::vector<float> values(const Trainer& trainer) {
  return trainer.master().flat_values().to_host<float>();
}

class EmulatedFaults : public ::testing::Test {
 protected:
  void SetUp() override { tlemu::clear_faults(); }
  void TearDown() override { tlemu::clear_faults(); }
};

TEST_F(EmulatedFaults, OneFailedCudaMallocIsRetriedTwoAreOutOfMemoryNamingTheDevice) {
  const Device gpu = Device::cuda(1);
  const MemoryOptions before = device_allocator(gpu).options();
  set_memory_options(gpu, {});  // caching, growing: the retry path exists
  {
    Tensor warm = Tensor::zeros({1 << 10}, default_stream(gpu));  // a cached segment
  }
  tlemu::fail_allocation(1, 1);
  // Larger than the cached segment: a new one is needed, its cudaMalloc fails, the
  // cache is given back and the retry succeeds.
  EXPECT_NO_THROW(Tensor::zeros({1 << 22}, default_stream(gpu)));
  tlemu::fail_allocation(1, 1, 2);
  EXPECT_THROW_WITH(Tensor::zeros({1 << 23}, default_stream(gpu)), OutOfMemory,
                    "out of memory on cuda:1: cannot allocate 32.00 MiB");
  EXPECT_NO_THROW(Tensor::zeros({1 << 23}, default_stream(gpu)));  // usable again
  set_memory_options(gpu, before);
}

TEST_F(EmulatedFaults, AStepThatRunsOutOfMemoryChangesNothingAndTheNextStepRuns) {
  Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
                  towers({Device::cuda(0), Device::cuda(1)}));
  Trainer reference(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
                    towers({Device::cuda(0), Device::cuda(1)}));
  trainer.step(small_image_batch(4, 1, 7));
  reference.step(small_image_batch(4, 1, 7));
  // Every cudaMalloc fails for a while, and a batch of 2000 needs more than the
  // towers' cached segments hold: the towers' activations cannot be allocated, in
  // the caching allocator and with exact blocks alike.
  tlemu::fail_allocation(1, -1, 1000);
  EXPECT_THROW_WITH(trainer.step(small_image_batch(2000, 2, 7)), OutOfMemory,
                    "out of memory on cuda:");
  tlemu::clear_faults();
  for (unsigned s = 3; s < 5; ++s) {
    trainer.step(small_image_batch(8, s, 7));
    reference.step(small_image_batch(8, s, 7));
  }
  EXPECT_EQ(values(trainer), values(reference))
      << "the step that ran out of memory left a trace in the variables or the optimizer";
  EXPECT_EQ(trainer.optimizer().steps(), reference.optimizer().steps());
}

TEST_F(EmulatedFaults, TwoGpusTakeOneDevicesStepsWithPeerAccessAllowedOrRefused) {
  const bool refused = !tlemu::config().peer_access;
  Model model;
  Trainer one(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1),
              towers({Device::cuda(0)}));
  TrainerOptions two_gpus = towers({Device::cuda(0), Device::cuda(1)});
  two_gpus.master = Device::cuda(1);
  Trainer two(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), two_gpus);
  for (unsigned s = 0; s < 3; ++s) {
    one.step(small_image_batch(7, 10 + s, 7));
    two.step(small_image_batch(7, 10 + s, 7));
  }
  EXPECT_EQ(enable_peer_access(0, 1), !refused)
      << (refused ? "peer access was not refused: nothing was staged" : "peer access was refused");
  EXPECT_TRUE(all_close(values(two), values(one), 2e-6, 1e-4));
  EXPECT_EQ(tlemu::sticky_error(0), cudaSuccess);
  EXPECT_EQ(tlemu::sticky_error(1), cudaSuccess);
}

TEST_F(EmulatedFaults, AFaultedKernelIsACudaErrorNamingTheDeviceAtThisStepAndEveryLaterOne) {
  Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1),
                  towers({Device::cuda(0), Device::cuda(1)}));
  trainer.step(small_image_batch(4, 1, 7));
  tlemu::fault_kernel(1, 1);  // tower 1's first kernel of the next step
  EXPECT_THROW_WITH(trainer.step(small_image_batch(4, 2, 7)), CudaError,
                    "on cuda:1 with cudaErrorIllegalAddress");
  EXPECT_EQ(tlemu::sticky_error(1), cudaErrorIllegalAddress);
  // As on hardware, the device stays faulted: the next step fails too, it neither
  // hangs nor trains on. Its message names the checked call's file by its path in
  // the source tree (CMakeLists.txt, "paths in the objects").
  EXPECT_THROW_WITH(trainer.step(small_image_batch(4, 3, 7)), CudaError, "cudaErrorIllegalAddress");
  try {
    trainer.step(small_image_batch(4, 4, 7));
    ADD_FAILURE() << "a step on the faulted device did not throw";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(std::regex_search(what, std::regex(R"( at (engine|kernels|parallel)/\S+:\d+)")))
        << what;
  }
}

// A faulted device's cudaMalloc returns its sticky error: the allocator must say
// so, not report an out-of-memory (a step whose tower allocated after its kernel
// had faulted once read "out of memory on cuda:1: cannot allocate 512 B").
TEST_F(EmulatedFaults, AFaultedDevicesAllocationIsItsCudaErrorNotOutOfMemory) {
  const Device gpu = Device::cuda(1);
  const MemoryOptions before = device_allocator(gpu).options();
  set_memory_options(gpu, {});  // caching, growing: a larger tensor takes a new segment
  {
    Tensor x = Tensor::zeros({1 << 10}, default_stream(gpu));
    tlemu::fault_kernel(1, 1);
    const auto fault = [&] {  // its launch or the synchronize sees the fault
      relu_forward(x, x, default_stream(gpu));
      default_stream(gpu).synchronize();
    };
    EXPECT_THROW_WITH(fault(), CudaError, "cudaErrorIllegalAddress");
    ASSERT_EQ(tlemu::sticky_error(1), cudaErrorIllegalAddress);
  }
  EXPECT_THROW_WITH(Tensor::zeros({1 << 23}, default_stream(gpu)), CudaError,
                    "cudaMalloc(&ptr, bytes) failed on cuda:1 with cudaErrorIllegalAddress");
  tlemu::clear_faults();
  EXPECT_NO_THROW(Tensor::zeros({1 << 23}, default_stream(gpu)));  // the control
  set_memory_options(gpu, before);
}

TEST_F(EmulatedFaults, ATowerWhoseStreamIsHeldBackIsWaitedForBitForBit) {
  Model model;
  const auto hold_back_tower_1 = [](const Tower& tower) {
    if (tower.index == 1) {
      tlemu::delay_stream(static_cast<cudaStream_t>(tower.stream.native_handle()),
                          std::chrono::milliseconds(150));
    }
  };
  Trainer held(model.vars, model.tower_fn(hold_back_tower_1), Optimizer::by_name("adam", 1e-2),
               towers({Device::cuda(0), Device::cuda(1)}));
  Trainer free(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
               towers({Device::cuda(0), Device::cuda(1)}));
  for (unsigned s = 0; s < 2; ++s) {
    held.step(small_image_batch(6, 20 + s, 7));
    free.step(small_image_batch(6, 20 + s, 7));
  }
  EXPECT_EQ(values(held), values(free));
}

}  // namespace
}  // namespace towerlab::testing
#endif  // TOWERLAB_EMULATED_CUDA
