// The contract docs/cpp_api.md states for inference beside training: between two
// trainer calls the master is copied into a store of the program's own, and another
// thread runs infer() on that copy, with its own stream and the same model object
// the towers use, while the trainer keeps stepping. Neither side may notice the
// other: the inference thread predicts what it predicts alone, and the trainer ends
// with the master it ends with alone. Named Concurrency.* so that scripts/test.sh
// runs it under ThreadSanitizer too.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "bn_model.h"
#include "test_util.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

constexpr int kStepsBefore = 2, kStepsAfter = 6, kInferences = 12;

TrainerOptions two_cpu_towers() {
  TrainerOptions o;
  o.devices.assign(2, Device::cpu());
  o.seed = 5;
  return o;
}

std::vector<float> master_values(const Trainer& trainer) {
  return trainer.master().flat_values().to_host<float>(cpu());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Concurrency, InferenceBesideTrainingOnAnotherThreadChangesNeither) {
  BnModel model;  // one model object: the towers and the inference thread share it
  const std::vector<Tensor> images{small_image_batch(9, 77, 1)[0]};

  // Alone: the snapshot's predictions after kStepsBefore steps, then the master
  // after all the steps.
  std::vector<float> predicted_alone, master_alone;
  {
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 0.05),
                    two_cpu_towers());
    for (int s = 0; s < kStepsBefore; ++s) trainer.step(small_image_batch(12, 10 + s, 2));
    VariableStore snapshot(model.vars, cpu(), /*with_grads=*/false);
    snapshot.copy_from(trainer.master(), cpu());
    predicted_alone = infer(model.net, snapshot, images[0], cpu()).to_host<float>(cpu());
    for (int s = kStepsBefore; s < kStepsBefore + kStepsAfter; ++s)
      trainer.step(small_image_batch(12, 10 + s, 2));
    master_alone = master_values(trainer);
  }

  // Together: the same steps, while another thread runs the snapshot.
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 0.05), two_cpu_towers());
  for (int s = 0; s < kStepsBefore; ++s) trainer.step(small_image_batch(12, 10 + s, 2));
  VariableStore snapshot(model.vars, cpu(), /*with_grads=*/false);
  snapshot.copy_from(trainer.master(), cpu());  // between two trainer calls
  std::vector<std::vector<float>> predicted(kInferences);
  std::thread inference([&] {
    const Stream stream(Device::cpu());  // its own stream
    for (auto& p : predicted)
      p = infer(model.net, snapshot, images[0], stream).to_host<float>(stream);
  });
  for (int s = kStepsBefore; s < kStepsBefore + kStepsAfter; ++s)
    trainer.step(small_image_batch(12, 10 + s, 2));
  inference.join();

  for (int i = 0; i < kInferences; ++i)
    EXPECT_TRUE(same_bits(predicted[i], predicted_alone)) << "inference " << i;
  EXPECT_TRUE(same_bits(master_values(trainer), master_alone));

  // Control: the comparisons can fail. The master moved during those steps, so the
  // trained model predicts otherwise than the snapshot, and differs from it.
  VariableStore latest(model.vars, cpu(), /*with_grads=*/false);
  latest.copy_from(trainer.master(), cpu());
  EXPECT_FALSE(
      same_bits(infer(model.net, latest, images[0], cpu()).to_host<float>(cpu()), predicted_alone));
  EXPECT_FALSE(same_bits(latest.flat_values().to_host<float>(cpu()),
                         snapshot.flat_values().to_host<float>(cpu())));
}

}  // namespace
}  // namespace towerlab::testing
