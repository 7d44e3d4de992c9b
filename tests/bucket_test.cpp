// Gradient buckets (parallel/buckets.h): the tape reports every variable's gradient
// once, after its last write; the buckets cut the flat gradient in reverse
// declaration order; a range of the ring all-reduce, in process and across
// processes, gives the bits of the whole reduction (and a range reduced as a buffer
// of its own would not: the control); and a bucketed step gives the bits of an
// unbucketed one for 1 to 3 towers x 1 to 3 ranks, uneven batches, SGD and Adam,
// local and synchronized batch norm, while a tower that fails mid-backward leaves
// no reducer waiting.
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "bn_model.h"
#include "parallel/buckets.h"
#include "parallel/ring_allreduce.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

// BnModel with an L2 term: every weight is read twice (its layer and the
// regularizer), through two Vars of one name; batch norm adds moving statistics.
// `fail_on_tower` >= 0 makes that tower's backward throw in the middle (after the
// last layers' buckets are complete).
struct Net {
  BnModel model;
  int fail_on_tower = -1;
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Context ctx = tower.context();
      Var logits = model.net(ctx, tower.input(batch[0], "images"));
      if (tower.index == fail_on_tower) {
        logits = tower.tape.record(logits.value(), "fails in backward", {logits},
                                   [](const Var&) { TL_THROW(InvalidArgument, "boom"); });
        // Later records (run earlier in the backward): the last layers' buckets.
        logits = ag::scale(logits, 1.0);
      }
      Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"));
      return TowerResult{ag::add_n({loss, l2_regularization(ctx, 1e-3)}), {logits}, {}};
    };
  }
};

std::vector<Tensor> make_batch(std::int64_t n, unsigned seed) {
  return small_image_batch(n, seed, 5);
}

TrainerOptions options(int towers, std::int64_t bucket_bytes, ProcessGroup* group = nullptr) {
  TrainerOptions o;
  o.devices.assign(std::size_t(towers), Device::cpu());
  o.seed = 5;
  o.bucket_bytes = bucket_bytes;
  o.process_group = group;
  return o;
}

// What a few steps leave: every loss, every output, the master's values and
// moving statistics, bit for bit.
struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> outputs;
  std::vector<float> values, state;
  bool operator==(const Outcome&) const = default;
};

Outcome train(const Net& net, const char* optimizer, TrainerOptions o, std::int64_t batch,
              int steps = 3) {
  Trainer trainer(net.model.vars, net.tower_fn(), Optimizer::by_name(optimizer, 0.05),
                  std::move(o));
  Outcome run;
  for (int s = 0; s < steps; ++s) {
    const StepResult r = trainer.step(make_batch(batch, 40 + unsigned(s)));
    run.losses.push_back(r.loss);
    run.outputs.push_back(r.outputs.empty() ? std::vector<float>{} : r.outputs[0].to_host<float>());
  }
  run.values = trainer.master().flat_values().to_host<float>();
  run.state = trainer.master().flat_state().to_host<float>();
  return run;
}

// ---- the tape's gradient listener ----

// Keeps a copy of each variable's gradient when reported complete.
struct Recorder final : GradientListener {
  std::map<std::string, Tensor> grads;  // the Var to read, by name
  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> seen;
  void gradient_ready(const std::string& name) override {
    order.push_back(name);
    seen[name] = grads.at(name).to_host<float>(cpu());
  }
};

TEST(Buckets, TheTapeReportsEveryVariableOnceAfterItsLastGradientWrite) {
  Net net;
  // A variable the forward pass makes on the tape but no record reads.
  net.model.vars.get("unused/scale", {3}, Initializer::ones());
  VariableStore store(net.model.vars, cpu());
  store.initialize(3, cpu());
  store.zero_grad(cpu());
  Tape tape(cpu(), "test tape");
  const Tower tower{0, Device::cpu(), cpu(), tape, store, true, 4, nullptr};
  const auto batch = make_batch(4, 7);
  TowerResult r = net.tower_fn()(tower, {batch[0], batch[1]});
  // Its gradient is complete before any record runs. A second Var of a name the
  // layers read counts with theirs.
  tower.variable("unused/scale");
  tower.variable("fc2/bias");
  Recorder recorder;
  std::set<std::string> trainable;
  for (const VariableSpec& v : net.model.vars.specs()) {
    if (!v.trainable) continue;
    trainable.insert(v.name);
    recorder.grads[v.name] = store.grad(v.name);
    EXPECT_TRUE(tape.has_variable(v.name)) << v.name;
  }
  EXPECT_FALSE(tape.has_variable("bn1/moving_mean"));
  tape.set_gradient_listener(&recorder);
  // The snapshots must not all be the final values trivially: the gradient of
  // conv1/weight (the first layer, read by its layer and by the L2 term) is still
  // zero before the backward starts.
  const std::vector<float> before = store.grad("conv1/weight").to_host<float>(cpu());
  tape.backward(r.loss);
  tape.set_gradient_listener(nullptr);

  EXPECT_EQ(recorder.order.size(), trainable.size()) << "each variable exactly once";
  ASSERT_FALSE(recorder.order.empty());
  EXPECT_EQ(recorder.order[0], "unused/scale");
  EXPECT_EQ(std::set<std::string>(recorder.order.begin(), recorder.order.end()), trainable);
  for (const std::string& name : trainable) {
    EXPECT_EQ(recorder.seen[name], store.grad(name).to_host<float>(cpu()))
        << name << " was reported before its last gradient write";
  }
  EXPECT_NE(before, store.grad("conv1/weight").to_host<float>(cpu()))
      << "control: a snapshot taken too early differs from the final gradient";
  // The last layer's weights are complete long before the first layer's.
  const auto at = [&](const std::string& name) {
    return std::find(recorder.order.begin(), recorder.order.end(), name) - recorder.order.begin();
  };
  EXPECT_LT(at("fc2/weight"), at("conv1/weight"));
  tape.reset();
  EXPECT_FALSE(tape.has_variable("conv1/weight")) << "reset() forgets the variables";
}

// ---- the buckets ----

TEST(Buckets, CutTheGradientInReverseDeclarationOrder) {
  Net net;
  const VariableSet& vars = net.model.vars;
  const std::int64_t numel = vars.trainable_numel();
  // One bucket: 0, or a limit at least the gradient's size.
  for (std::int64_t bytes : {std::int64_t(0), numel * 4, numel * 400}) {
    const auto one = make_buckets(vars, bytes);
    ASSERT_EQ(one.size(), 1u) << bytes;
    EXPECT_EQ(one[0].begin, 0);
    EXPECT_EQ(one[0].end, numel);
  }
  // One variable per bucket, last declared first.
  const auto each = make_buckets(vars, 1);
  std::vector<std::string> reversed;
  for (const VariableSpec& v : vars.specs()) {
    if (v.trainable) reversed.insert(reversed.begin(), v.name);
  }
  ASSERT_EQ(each.size(), reversed.size());
  for (std::size_t b = 0; b < each.size(); ++b) {
    EXPECT_EQ(each[b].variables, std::vector<std::string>{reversed[b]});
    const VariableSpec& v = vars.at(reversed[b]);
    EXPECT_EQ(each[b].begin, v.offset);
    EXPECT_EQ(each[b].end, v.offset + v.numel());
  }
  // A bucket closes once it holds at least the limit: contiguous ranges that
  // cover the gradient from its end to its start.
  const auto few = make_buckets(vars, 600);
  EXPECT_GT(few.size(), 1u);
  EXPECT_LT(few.size(), each.size());
  std::int64_t end = numel;
  for (std::size_t b = 0; b < few.size(); ++b) {
    EXPECT_EQ(few[b].end, end);
    if (b + 1 < few.size()) {
      EXPECT_GE(few[b].bytes(), 600);
    }
    end = few[b].begin;
  }
  EXPECT_EQ(end, 0);
}

// ---- ranges of the rings ----

TEST(Buckets, ARangeOfTheRingGivesTheBitsOfTheWholeReduction) {
  const std::int64_t length = 1000;
  const std::int64_t begin = 137, end = 801;  // across several chunks of 3 members
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<const Stream*> members;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(std::make_unique<Stream>(Device::cpu()));
    members.push_back(streams.back().get());
  }
  Ring ring(members);
  std::vector<Tensor> whole, ranged, alone;
  for (unsigned i = 0; i < 3; ++i) {
    // Values of mixed magnitudes, so that the order of a sum shows in its bits.
    std::vector<float> v = random_values(std::size_t(length), 60 + i, -1.0f, 1.0f);
    for (std::size_t k = 0; k < v.size(); k += 3) v[k] *= 1e4f;
    whole.push_back(Tensor::from_host<float>(v, {length}, cpu()));
    // Sentinels outside the range: a range reduction must not touch them.
    ranged.push_back(Tensor::from_host<float>(v, {length}, cpu()));
    alone.push_back(Tensor::from_host<float>(std::vector<float>(v.begin() + begin, v.begin() + end),
                                             {end - begin}, cpu()));
  }
  const std::vector<float> sentinel = ranged[1].to_host<float>(cpu());
  ring.allreduce(whole);
  ring.allreduce_range(ranged, begin, 500);
  ring.allreduce_range(ranged, 500, end);
  ring.allreduce(alone);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto w = whole[i].to_host<float>(cpu()), r = ranged[i].to_host<float>(cpu());
    EXPECT_EQ(std::vector<float>(w.begin() + begin, w.begin() + end),
              std::vector<float>(r.begin() + begin, r.begin() + end))
        << "member " << i;
    if (i == 1) {
      EXPECT_EQ(std::vector<float>(r.begin(), r.begin() + begin),
                std::vector<float>(sentinel.begin(), sentinel.begin() + begin));
      EXPECT_EQ(std::vector<float>(r.begin() + end, r.end()),
                std::vector<float>(sentinel.begin() + end, sentinel.end()));
    }
  }
  // Control: the range reduced as a short buffer of its own starts its chunks
  // elsewhere, so with 3 members some sums come out in another order.
  const auto w = whole[0].to_host<float>(cpu());
  EXPECT_NE(alone[0].to_host<float>(cpu()), std::vector<float>(w.begin() + begin, w.begin() + end));
  EXPECT_THROW_WITH(ring.allreduce_range(ranged, 10, 1001), InvalidArgument,
                    "range [10, 1001) of buffers of 1000 elements");
}

TEST(Buckets, AFramedRangeAcrossProcessesGivesTheBitsOfTheWholeReduction) {
  const std::size_t length = 997, begin = 300, end = 700;
  std::vector<std::vector<float>> whole(3), ranged(3), alone(3);
  const auto errors = run_ranks(3, [&](int rank, ProcessGroup& group) {
    std::vector<float> v = random_values(length, 80 + unsigned(rank), -1.0f, 1.0f);
    for (std::size_t k = 0; k < v.size(); k += 3) v[k] *= 1e4f;
    auto& w = whole[std::size_t(rank)];
    auto& r = ranged[std::size_t(rank)];
    auto& a = alone[std::size_t(rank)];
    w = v;
    r = v;
    a.assign(v.begin() + begin, v.begin() + end);
    group.allreduce_sum(std::span<float>(w), "whole");
    group.allreduce_sum(std::span<float>(r.data() + begin, end - begin), "range",
                        ReduceFrame{begin, length});
    group.allreduce_sum(std::span<float>(a), "alone");
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (std::size_t rank = 0; rank < 3; ++rank) {
    const auto& w = whole[rank];
    EXPECT_EQ(std::vector<float>(ranged[rank].begin() + begin, ranged[rank].begin() + end),
              std::vector<float>(w.begin() + begin, w.begin() + end));
    EXPECT_EQ(std::vector<float>(ranged[rank].begin() + begin, ranged[rank].begin() + end),
              std::vector<float>(ranged[0].begin() + begin, ranged[0].begin() + end))
        << "the same bits on every rank";
  }
  // Control: without its frame the range is summed in other orders.
  EXPECT_NE(alone[0], std::vector<float>(whole[0].begin() + begin, whole[0].begin() + end));
}

// ---- bucketed == unbucketed ----

TEST(Buckets, ABucketedStepGivesTheBitsOfAnUnbucketedOne) {
  Net net;
  const std::int64_t one_each = 1, a_few = 600;
  for (const char* optimizer : {"sgd", "adam"}) {
    for (int towers : {1, 2, 3}) {
      // Even and uneven; local batch norm needs two samples in every tower.
      for (std::int64_t batch : {2 * towers, 2 * towers + 1}) {
        const Outcome reference = train(net, optimizer, options(towers, 0), batch);
        for (std::int64_t bytes : {one_each, a_few}) {
          EXPECT_TRUE(train(net, optimizer, options(towers, bytes), batch) == reference)
              << optimizer << ", " << towers << " towers, batch " << batch << ", buckets of "
              << bytes << " bytes";
        }
      }
    }
  }
}

TEST(Buckets, TheComparisonCatchesAStepThatDiffersInTheLastBit) {
  // Control: the same training with one weight of the initial values moved by one
  // unit in the last place is told apart by Outcome's comparison.
  Net net;
  const Outcome reference = train(net, "adam", options(3, 1), 7);
  Trainer trainer(net.model.vars, net.tower_fn(), Optimizer::by_name("adam", 0.05), options(3, 1));
  Tensor w = trainer.master().value("fc2/weight");
  std::vector<float> v = w.to_host<float>(cpu());
  v[0] = std::nextafter(v[0], 1.0f);
  copy_tensor(w, Tensor::from_host<float>(v, w.shape(), cpu()), cpu());
  trainer.broadcast();
  Outcome changed;
  for (int s = 0; s < 3; ++s) {
    const StepResult r = trainer.step(make_batch(7, 40 + unsigned(s)));
    changed.losses.push_back(r.loss);
    changed.outputs.push_back(r.outputs[0].to_host<float>());
  }
  changed.values = trainer.master().flat_values().to_host<float>();
  changed.state = trainer.master().flat_state().to_host<float>();
  EXPECT_FALSE(changed == reference);
  EXPECT_NE(changed.values, reference.values);
}

TEST(Buckets, SynchronizedBatchNormAndEmptyTowersAreBucketedExactly) {
  Net net;
  for (BatchNormMode mode : {BatchNormMode::Local, BatchNormMode::Sync}) {
    // Synchronized batch norm normalizes over all the towers' samples: a batch of 2
    // over 3 towers leaves one tower out. Local batch norm needs two in each.
    const std::vector<std::int64_t> batches = mode == BatchNormMode::Sync
                                                  ? std::vector<std::int64_t>{2, 5}
                                                  : std::vector<std::int64_t>{7};
    for (std::int64_t batch : batches) {
      TrainerOptions unbucketed = options(3, 0), bucketed = options(3, 1);
      unbucketed.batchnorm = bucketed.batchnorm = mode;
      EXPECT_TRUE(train(net, "adam", bucketed, batch) == train(net, "adam", unbucketed, batch))
          << (mode == BatchNormMode::Sync ? "sync" : "local") << " batch norm, batch " << batch;
    }
  }
}

TEST(Buckets, ATowerFailingMidBackwardReleasesTheReducer) {
  Net net;
  net.fail_on_tower = 1;
  Trainer trainer(net.model.vars, net.tower_fn(), Optimizer::by_name("adam", 0.05), options(3, 1));
  EXPECT_THROW_WITH(trainer.step(make_batch(6, 40)), InvalidArgument,
                    "Trainer: tower 1 on cpu (samples 2 to 3 of the batch): boom");
  // The failed step updated nothing: the next one is a fresh trainer's (the
  // moving statistics aside, which the failed forward pass moved in the replicas).
  net.fail_on_tower = -1;
  Trainer fresh(net.model.vars, net.tower_fn(), Optimizer::by_name("adam", 0.05), options(3, 1));
  const StepResult a = trainer.step(make_batch(6, 41)), b = fresh.step(make_batch(6, 41));
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(trainer.master().flat_values().to_host<float>(),
            fresh.master().flat_values().to_host<float>());
}

TEST(Buckets, EvaluationTheTraceAndThePlacementLogWorkWithBuckets) {
  Net net;
  std::ostringstream log;
  TrainerOptions o = options(2, 600);
  o.log_placement = true;
  o.log = &log;
  Trainer trainer(net.model.vars, net.tower_fn(), Optimizer::by_name("sgd", 0.05), o);
  const std::string buckets = std::to_string(make_buckets(net.model.vars, 600).size());
  EXPECT_NE(log.str().find("the gradient is reduced in " + buckets + " buckets (bucket_bytes 600)"),
            std::string::npos)
      << log.str();
  Trace trace;
  trainer.set_trace(&trace);
  trainer.step(make_batch(5, 40));
  trainer.set_trace(nullptr);
  const std::string json = trace.json();
  EXPECT_NE(json.find("gradient buckets"), std::string::npos);
  EXPECT_NE(json.find("gradient bucket 0 of "), std::string::npos);
  Trainer unbucketed(net.model.vars, net.tower_fn(), Optimizer::by_name("sgd", 0.05),
                     options(2, 0));
  unbucketed.step(make_batch(5, 40));
  EXPECT_EQ(trainer.evaluate(make_batch(5, 43)).loss, unbucketed.evaluate(make_batch(5, 43)).loss);
}

TEST(Buckets, OnVirtualGpuTowersABucketedStepGivesTheBitsOfAnUnbucketedOne) {
  // The buckets' ring on a second stream per tower, ordered by events: a bucket
  // reduced before its gradient is complete, or a tower stream going on before the
  // buckets' streams are done, would change the bits.
  skip_without_cuda_device();
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  Net net;
  for (const char* optimizer : {"sgd", "adam"}) {
    TrainerOptions unbucketed = options(3, 0), bucketed = options(3, 1);
    unbucketed.devices.assign(3, Device::cuda(0));
    bucketed.devices.assign(3, Device::cuda(0));
    EXPECT_TRUE(train(net, optimizer, bucketed, 7) == train(net, optimizer, unbucketed, 7))
        << optimizer;
  }
}

// ---- across processes ----

// Every rank's Outcome of a few steps with the given towers and buckets.
std::vector<Outcome> train_ranks(const Net& net, const char* optimizer, int ranks, int towers,
                                 std::int64_t bytes, std::int64_t batch,
                                 BatchNormMode mode = BatchNormMode::Local) {
  std::vector<Outcome> runs(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank, ProcessGroup& group) {
    TrainerOptions o = options(towers, bytes, &group);
    o.batchnorm = mode;
    runs[std::size_t(rank)] = train(net, optimizer, o, batch);
  });
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

TEST(Buckets, ABucketedStepAcrossRanksGivesTheBitsOfAnUnbucketedOne) {
  Net net;
  for (const char* optimizer : {"sgd", "adam"}) {
    for (int ranks : {1, 2, 3}) {
      for (int towers : {1, 2, 3}) {
        // Uneven over ranks and towers, two samples or more in each tower (local
        // batch norm).
        const std::int64_t batch = 2 * ranks * towers + 1;
        const auto reference = train_ranks(net, optimizer, ranks, towers, 0, batch);
        for (std::int64_t bytes : {std::int64_t(1), std::int64_t(600)}) {
          const auto runs = train_ranks(net, optimizer, ranks, towers, bytes, batch);
          for (int r = 0; r < ranks; ++r) {
            EXPECT_TRUE(runs[std::size_t(r)].values == reference[std::size_t(r)].values &&
                        runs[std::size_t(r)].state == reference[std::size_t(r)].state &&
                        runs[std::size_t(r)].losses == reference[std::size_t(r)].losses)
                << optimizer << ", " << ranks << " ranks x " << towers << " towers, buckets of "
                << bytes << " bytes, rank " << r;
          }
        }
      }
    }
  }
}

TEST(Buckets, SynchronizedBatchNormAcrossRanksIsBucketedExactly) {
  // The batch-norm collectives keep the gradient in phase 5's call; the in-process
  // buckets still overlap.
  Net net;
  const auto reference = train_ranks(net, "adam", 2, 2, 0, 7, BatchNormMode::Sync);
  const auto runs = train_ranks(net, "adam", 2, 2, 1, 7, BatchNormMode::Sync);
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(runs[r].values == reference[r].values && runs[r].state == reference[r].state)
        << "rank " << r;
  }
}

TEST(Buckets, ARankFailingMidStepStopsTheOthersBucketCalls) {
  Net net;
  const auto errors = run_ranks(
      2,
      [&](int rank, ProcessGroup& group) {
        Net mine;
        mine.fail_on_tower = rank == 1 ? 0 : -1;
        Trainer trainer(mine.model.vars, mine.tower_fn(), Optimizer::by_name("sgd", 0.05),
                        options(2, 1, &group));
        trainer.step(make_batch(8, 40));
      },
      std::chrono::seconds(30));
  EXPECT_NE(errors[1].find("boom"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("Trainer: gradient bucket 0 of "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 stopped"), std::string::npos) << errors[0];
}

TEST(Buckets, RanksWithDifferentBucketSizesAreRefusedAtStartup) {
  Net net;
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    Trainer trainer(net.model.vars, net.tower_fn(), Optimizer::by_name("sgd", 0.05),
                    options(1, rank == 0 ? 0 : 1024, &group));
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("bucket_bytes"), std::string::npos) << e;
}

}  // namespace
}  // namespace towerlab::testing
