// NCCL between processes (parallel/nccl_communicator.h): when the Trainer's phase 5
// takes NCCL and when it stages on the host (a pure function of every rank's
// placement, tested on many layouts), the errors of a request that cannot be met,
// and, where GPUs are present, the communicator itself: ranks are threads of this
// binary (tests/thread_process_group.h), each on its own GPU, and must hold the
// same bits as each other and as the host-staged path. The two-rank cases need two
// GPUs and skip with a message elsewhere.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "bn_model.h"
#include "parallel/nccl_communicator.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

NcclRankPlacement gpu_rank(const std::string& host, int index, const std::string& uuid,
                           CrossProcessPath request = CrossProcessPath::Auto) {
  return {request, true, host, Device::cuda(index).str(), uuid};
}

NcclRankPlacement cpu_rank(const std::string& host,
                           CrossProcessPath request = CrossProcessPath::Auto) {
  return {request, false, host, "cpu", ""};
}

TEST(NcclPlacement, RanksWithGpusOfTheirOwnUseNccl) {
  // Two GPUs of one host, and one GPU on each of two hosts (both cuda:0).
  for (const auto& ranks : {std::vector{gpu_rank("a", 0, "GPU-0"), gpu_rank("a", 1, "GPU-1")},
                            std::vector{gpu_rank("a", 0, "GPU-a0"), gpu_rank("b", 0, "GPU-b0")},
                            std::vector{gpu_rank("a", 0, "GPU-0"), gpu_rank("a", 1, "GPU-1"),
                                        gpu_rank("b", 0, "GPU-2"), gpu_rank("b", 1, "GPU-3")}}) {
    const NcclChoice choice = choose_cross_process_path(ranks, true);
    EXPECT_TRUE(choice.nccl) << choice.reason;
    EXPECT_NE(choice.reason.find("a GPU of its own"), std::string::npos) << choice.reason;
  }
}

TEST(NcclPlacement, RanksSharingAGpuStageOnTheHost) {
  // The layout of the test above with one GPU named twice: the control that shows
  // the decision looks at the GPUs' identities, not at the ranks' count.
  NcclChoice choice =
      choose_cross_process_path({gpu_rank("a", 0, "GPU-0"), gpu_rank("a", 0, "GPU-0")}, true);
  EXPECT_FALSE(choice.nccl);
  EXPECT_NE(choice.reason.find("ranks 0 and 1 share one GPU (cuda:0 and cuda:0 on a, GPU-0)"),
            std::string::npos)
      << choice.reason;
  // cuda:0 and cuda:1 that CUDA_VISIBLE_DEVICES maps onto one physical GPU.
  choice = choose_cross_process_path(
      {gpu_rank("a", 0, "GPU-7"), gpu_rank("a", 1, "GPU-8"), gpu_rank("a", 1, "GPU-7")}, true);
  EXPECT_FALSE(choice.nccl);
  EXPECT_NE(choice.reason.find("ranks 0 and 2 share one GPU"), std::string::npos) << choice.reason;
}

TEST(NcclPlacement, ARankOnTheCpuStagesEveryRankOnTheHost) {
  NcclChoice choice = choose_cross_process_path({gpu_rank("a", 0, "GPU-0"), cpu_rank("b")}, true);
  EXPECT_FALSE(choice.nccl);
  EXPECT_NE(choice.reason.find("rank 1 on b does not train on GPUs only (tower 0 on cpu)"),
            std::string::npos)
      << choice.reason;
  // Tower 0 on a GPU is not enough: every tower must be.
  NcclRankPlacement mixed = gpu_rank("a", 1, "GPU-1");
  mixed.all_towers_on_gpus = false;
  choice = choose_cross_process_path({gpu_rank("a", 0, "GPU-0"), mixed}, true);
  EXPECT_FALSE(choice.nccl);
  EXPECT_NE(choice.reason.find("rank 1 on a"), std::string::npos) << choice.reason;
}

TEST(NcclPlacement, ABuildWithoutNcclStagesOnTheHost) {
  const NcclChoice choice =
      choose_cross_process_path({gpu_rank("a", 0, "GPU-0"), gpu_rank("a", 1, "GPU-1")}, false);
  EXPECT_FALSE(choice.nccl);
  EXPECT_NE(choice.reason.find("no NCCL"), std::string::npos) << choice.reason;
}

TEST(NcclPlacement, OneProcessUsesNcclOnlyWhenAskedTo) {
  EXPECT_FALSE(choose_cross_process_path({gpu_rank("a", 0, "GPU-0")}, true).nccl);
  EXPECT_TRUE(
      choose_cross_process_path({gpu_rank("a", 0, "GPU-0", CrossProcessPath::Nccl)}, true).nccl);
}

TEST(NcclPlacement, HostStagingIsHonoured) {
  const NcclChoice choice =
      choose_cross_process_path({gpu_rank("a", 0, "GPU-0", CrossProcessPath::HostStaged),
                                 gpu_rank("a", 1, "GPU-1", CrossProcessPath::HostStaged)},
                                true);
  EXPECT_FALSE(choice.nccl);
  EXPECT_NE(choice.reason.find("CrossProcessPath::HostStaged"), std::string::npos) << choice.reason;
}

TEST(NcclPlacement, NcclAskedForButImpossibleIsRefused) {
  const auto nccl = CrossProcessPath::Nccl;
  EXPECT_THROW_WITH(choose_cross_process_path(
                        {gpu_rank("a", 0, "GPU-0", nccl), gpu_rank("a", 0, "GPU-0", nccl)}, true),
                    NotSupported,
                    "NCCL between processes (CrossProcessPath::Nccl) cannot be used: ranks 0 and "
                    "1 share one GPU");
  EXPECT_THROW_WITH(
      choose_cross_process_path({gpu_rank("a", 0, "GPU-0", nccl), cpu_rank("a", nccl)}, true),
      NotSupported, "rank 1 on a does not train on GPUs only");
  EXPECT_THROW_WITH(choose_cross_process_path(
                        {gpu_rank("a", 0, "GPU-0", nccl), gpu_rank("a", 1, "GPU-1", nccl)}, false),
                    NotSupported, "this build of towerlab has no NCCL");
}

TEST(NcclPlacement, RanksThatAskForDifferentPathsAreRefused) {
  EXPECT_THROW_WITH(
      choose_cross_process_path(
          {gpu_rank("a", 0, "GPU-0"), gpu_rank("a", 1, "GPU-1", CrossProcessPath::HostStaged)},
          true),
      InvalidArgument, "rank 0 for Auto, rank 1 for HostStaged");
}

TEST(NcclPlacement, RecordsSurviveTheGather) {
  const NcclRankPlacement p = gpu_rank("node-7.example", 3, "GPU-12ab", CrossProcessPath::Nccl);
  const NcclRankPlacement q = decode_rank_placement(encode_rank_placement(p));
  EXPECT_EQ(q.request, p.request);
  EXPECT_EQ(q.all_towers_on_gpus, p.all_towers_on_gpus);
  EXPECT_EQ(q.host, p.host);
  EXPECT_EQ(q.device, p.device);
  EXPECT_EQ(q.gpu, p.gpu);
  const NcclRankPlacement c = decode_rank_placement(encode_rank_placement(cpu_rank("h")));
  EXPECT_FALSE(c.all_towers_on_gpus);
  EXPECT_EQ(c.gpu, "");
  EXPECT_THROW_WITH(decode_rank_placement("0\n1\nhost"), InvalidArgument, "malformed record");
  EXPECT_THROW_WITH(decode_rank_placement("7\n1\nh\ncuda:0\nGPU-1"), InvalidArgument,
                    "malformed record");
}

TEST(NcclPlacement, CpuRanksAgreeToStageOnTheHost) {
  std::vector<NcclChoice> choices(2);
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    choices[std::size_t(rank)] =
        choose_cross_process_path(group, CrossProcessPath::Auto, {Device::cpu(), Device::cpu()});
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  EXPECT_FALSE(choices[0].nccl);
  EXPECT_EQ(choices[0].reason, choices[1].reason);
  const std::string expected = NcclCommunicator::available()
                                   ? "rank 0 on " /* the host name follows */
                                   : "this build of towerlab has no NCCL";
  EXPECT_NE(choices[0].reason.find(expected), std::string::npos) << choices[0].reason;
}

// The small CNN with batch norm (moving statistics travel in phase 5 too).
std::vector<Tensor> make_batch(std::int64_t n, unsigned seed) {
  return small_image_batch(n, seed, 5);
}

TEST(NcclTrainer, NcclAskedForOnCpuTowersFailsOnEveryRank) {
  BnModel model;
  const auto errors = run_ranks(2, [&](int, ProcessGroup& group) {
    TrainerOptions options;
    options.devices = {Device::cpu(), Device::cpu()};
    options.process_group = &group;
    options.cross_process = CrossProcessPath::Nccl;
    try {
      Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
    } catch (const NotSupported&) {
      throw;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected NotSupported, got: " << e.what();
    }
  });
  const std::string expected = NcclCommunicator::available()
                                   ? "does not train on GPUs only (tower 0 on cpu)"
                                   : "this build of towerlab has no NCCL";
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[std::size_t(r)].find(expected), std::string::npos)
        << "rank " << r << ": " << errors[std::size_t(r)];
  }
}

TEST(NcclTrainer, ThePlacementLogSaysWhichPathPhaseFiveTakes) {
  BnModel model;
  const std::string why_not_nccl = NcclCommunicator::available()
                                       ? "host staging: rank 0 on "
                                       : "host staging: this build of towerlab has no NCCL";
  for (const auto& [path, expected] :
       {std::pair{CrossProcessPath::Auto, why_not_nccl},
        std::pair{CrossProcessPath::HostStaged,
                  std::string("host staging requested (CrossProcessPath::HostStaged)")}}) {
    std::vector<std::string> logs(2);
    const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
      std::ostringstream log;
      TrainerOptions options;
      options.process_group = &group;
      options.log_placement = true;
      options.log = &log;
      options.cross_process = path;
      Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
      trainer.step(make_batch(5, 3));
      logs[std::size_t(rank)] = log.str();
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
      EXPECT_NE(logs[std::size_t(r)].find("placement: across processes, gradients and moving "
                                          "statistics by the process group (" +
                                          expected),
                std::string::npos)
          << logs[std::size_t(r)];
    }
  }
}

TEST(NcclTrainer, RanksThatDisagreeOnThePathFailTogether) {
  BnModel model;
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    TrainerOptions options;
    options.process_group = &group;
    options.cross_process = rank == 0 ? CrossProcessPath::Auto : CrossProcessPath::HostStaged;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[std::size_t(r)].find("rank 0 for Auto, rank 1 for HostStaged"),
              std::string::npos)
        << "rank " << r << ": " << errors[std::size_t(r)];
  }
}

TEST(NcclCommunicator, NeedsNcclAndAGpu) {
  const auto errors = run_ranks(1, [&](int, ProcessGroup& group) {
    if (!NcclCommunicator::available()) {
      EXPECT_THROW_WITH(NcclCommunicator(group, Device::cuda(0)), NotSupported,
                        "this build of towerlab has no NCCL");
      return;
    }
    EXPECT_THROW_WITH(NcclCommunicator(group, Device::cpu()), DeviceError,
                      "rank 0 gave cpu; NCCL needs a GPU for each rank");
    if (cuda_device_count() == 0) {
      EXPECT_THROW_WITH(NcclCommunicator(group, Device::cuda(0)), DeviceError,
                        "cuda:0 is not available");
    }
  });
  EXPECT_EQ(errors[0], "");
}

// Skips (with the reason) unless this build has NCCL and `gpus` GPUs are visible.
// Not a failure under TOWERLAB_REQUIRE_GPU: the GPU machine has one GPU, and its
// preset leaves NCCL out.
#define TL_NEED_NCCL_GPUS(gpus)                                                               \
  do {                                                                                        \
    if (!NcclCommunicator::available()) GTEST_SKIP() << "this build of towerlab has no NCCL"; \
    if (cuda_device_count() < (gpus)) {                                                       \
      GTEST_SKIP() << "needs " << (gpus) << " GPU(s) for as many NCCL ranks; "                \
                   << cuda_device_count() << " visible";                                      \
    }                                                                                         \
  } while (0)

TEST(NcclCommunicator, OneRankKeepsItsBits) {
  TL_NEED_NCCL_GPUS(1);
  const auto errors = run_ranks(1, [&](int, ProcessGroup& group) {
    NcclCommunicator comm(group, Device::cuda(0), std::chrono::seconds(20));
    Stream stream(Device::cuda(0));
    const auto values = random_values(1001, 5);
    Tensor a = Tensor::from_host<float>(values, {1001}, stream);
    Tensor b = Tensor::from_host<float>(std::vector<float>{1.5f, -2.0f}, {2}, stream);
    Tensor empty = Tensor::empty({0}, stream);
    comm.allreduce_sum({a, empty, b}, stream, "test");
    EXPECT_EQ(a.to_host<float>(stream), values);
    EXPECT_EQ(b.to_host<float>(stream), (std::vector<float>{1.5f, -2.0f}));
  });
  EXPECT_EQ(errors[0], "");
}

// Where train_on_gpus keeps each rank's master.
enum class Master { OnTheGpu, OnTheHost, Sharded };

// Trains ranks x towers (each rank on GPU `rank`, its towers virtual devices of it)
// with the given path, three steps of `batch` samples, and returns each rank's
// values and moving statistics, then (Master given) its optimizer's slots and the
// steps' losses.
std::vector<std::vector<float>> train_on_gpus(int ranks, int towers, CrossProcessPath path,
                                              const std::string& expected_log,
                                              BatchNormStats stats = BatchNormStats::Average,
                                              std::optional<Master> master = std::nullopt,
                                              std::int64_t batch = 9) {
  BnModel model;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank, ProcessGroup& group) {
    std::ostringstream log;
    TrainerOptions options;
    options.devices.assign(std::size_t(towers), Device::cuda(rank));
    options.master = Device::cuda(rank);
    if (master == Master::OnTheHost) options.master = Device::cpu();
    if (master == Master::Sharded) {
      options.master.reset();
      options.master_placement = MasterPlacement::Sharded;
    }
    options.seed = 7;
    options.process_group = &group;
    options.cross_process = path;
    options.batchnorm_stats = stats;
    options.log_placement = true;
    options.log = &log;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
    EXPECT_NE(log.str().find(expected_log), std::string::npos) << log.str();
    // 9 samples: at least 2 for every tower's batch norm, with 2 ranks x 2 towers too
    // (7 left one tower a single sample; the case had never run before the emulated GPUs).
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) {
      losses.push_back(float(trainer.step(make_batch(batch, 40 + unsigned(s))).loss));
    }
    auto values = trainer.master().flat_values().to_host<float>();
    const auto state = trainer.master().flat_state().to_host<float>();
    values.insert(values.end(), state.begin(), state.end());
    if (master.has_value()) {
      for (const auto& [name, slot] : trainer.optimizer().slots()) {
        const auto held = slot.to_host<float>();
        values.insert(values.end(), held.begin(), held.end());
      }
      values.insert(values.end(), losses.begin(), losses.end());
    }
    results[std::size_t(rank)] = values;
  });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  return results;
}

TEST(NcclTrainer, OneRankOnNcclEqualsHostStaging) {
  TL_NEED_NCCL_GPUS(1);
  const auto nccl = train_on_gpus(1, 2, CrossProcessPath::Nccl, "by NCCL on cuda:0");
  const auto host =
      train_on_gpus(1, 2, CrossProcessPath::HostStaged, "by the process group (host staging");
  EXPECT_EQ(nccl[0], host[0]);
}

TEST(NcclCommunicator, TwoRanksOnTwoGpusHoldTheSameSum) {
  TL_NEED_NCCL_GPUS(2);
  const std::size_t n = 100003;  // odd: chunks of NCCL's ring do not divide it
  std::vector<std::vector<float>> inputs{random_values(n, 1), random_values(n, 2)};
  std::vector<float> expected(n);
  for (std::size_t i = 0; i < n; ++i) expected[i] = inputs[0][i] + inputs[1][i];
  std::vector<std::vector<float>> results(2);
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    NcclCommunicator comm(group, Device::cuda(rank), std::chrono::seconds(30));
    Stream stream(Device::cuda(rank));
    Tensor x = Tensor::from_host<float>(inputs[std::size_t(rank)], {std::int64_t(n)}, stream);
    comm.allreduce_sum({x}, stream, "test");
    results[std::size_t(rank)] = x.to_host<float>(stream);
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  EXPECT_EQ(results[0], results[1]) << "the ranks' bits differ";
  // a + b is one rounding whichever rank adds: the host's sum, bit for bit.
  EXPECT_EQ(results[0], expected);
  EXPECT_NE(results[0], inputs[0]) << "nothing was reduced";
}

TEST(NcclTrainer, TwoRanksOnNcclEqualHostStagingBitForBit) {
  TL_NEED_NCCL_GPUS(2);
  for (int towers : {1, 2}) {
    SCOPED_TRACE(std::to_string(towers) + " tower(s) per rank");
    const auto nccl = train_on_gpus(2, towers, CrossProcessPath::Auto, "by NCCL on cuda:");
    const auto host =
        train_on_gpus(2, towers, CrossProcessPath::HostStaged, "by the process group");
    EXPECT_EQ(nccl[0], nccl[1]) << "the ranks' bits differ";
    // Two ranks: each element's cross-process sum is one addition on either path.
    EXPECT_EQ(nccl[0], host[0]);
  }
}

// BatchNormStats::Tower0 on both paths: rank 1 adds zeros for its moving statistics,
// so the job keeps rank 0's tower 0's: those of one process whose tower 0 has the
// same rows (9 samples: rows 0-2 for 2 ranks x 2 towers and for 1 rank x 4 towers),
// to float rounding, and the two paths agree bit for bit.
TEST(NcclTrainer, TwoRanksKeepRankZerosStatisticsOnNcclAndOnTheHost) {
  TL_NEED_NCCL_GPUS(2);
  const auto nccl =
      train_on_gpus(2, 2, CrossProcessPath::Auto, "by NCCL on cuda:", BatchNormStats::Tower0);
  const auto host = train_on_gpus(2, 2, CrossProcessPath::HostStaged, "by the process group",
                                  BatchNormStats::Tower0);
  const auto one = train_on_gpus(1, 4, CrossProcessPath::HostStaged, "by the process group",
                                 BatchNormStats::Tower0);
  const auto average = train_on_gpus(2, 2, CrossProcessPath::HostStaged, "by the process group");
  EXPECT_EQ(nccl[0], nccl[1]) << "the ranks' bits differ";
  EXPECT_EQ(nccl[0], host[0]);
  EXPECT_TRUE(all_close(host[0], one[0], 1e-5, 1e-5)) << "not rank 0's tower 0's statistics";
  EXPECT_FALSE(all_close(average[0], one[0], 1e-5, 1e-5))
      << "the policy changed nothing: the comparison cannot fail";
}

// --- a master sharded across processes on NCCL (parallel/sharded_nccl.h) -------

TEST(NcclCommunicator, ReduceScatterThenAllGatherIsTheAllReduce) {
  TL_NEED_NCCL_GPUS(2);  // and 3 ranks where there are 3 GPUs
  for (int ranks : {2, 3}) {
    if (cuda_device_count() < ranks) continue;
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::int64_t block = 1001;  // odd
    const std::size_t n = std::size_t(ranks * block);
    const auto n_ranks = std::size_t(ranks);
    std::vector<std::vector<float>> halves(n_ranks), whole(n_ranks), scattered(n_ranks);
    const auto errors = run_ranks(ranks, [&](int rank, ProcessGroup& group) {
      NcclCommunicator comm(group, Device::cuda(rank), std::chrono::seconds(30));
      Stream stream(Device::cuda(rank));
      const auto mine = random_values(n, 10 + unsigned(rank));
      Tensor x = Tensor::from_host<float>(mine, {std::int64_t(n)}, stream);
      Tensor y = Tensor::from_host<float>(mine, {std::int64_t(n)}, stream);
      comm.reduce_scatter_sum(x, stream, "test: reduce-scatter");
      scattered[std::size_t(rank)] =
          x.slice(rank * block, (rank + 1) * block).to_host<float>(stream);
      comm.all_gather(x, stream, "test: all-gather");
      halves[std::size_t(rank)] = x.to_host<float>(stream);
      comm.allreduce_sum({y}, stream, "test: all-reduce");
      whole[std::size_t(rank)] = y.to_host<float>(stream);
      // Not `ranks` blocks of one length: refused before any rank calls NCCL.
      EXPECT_THROW_WITH(comm.all_gather(x.slice(0, std::int64_t(n) - 1), stream, "test: odd"),
                        ShapeError, "is not " + std::to_string(ranks) + " blocks of one size");
    });
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
      EXPECT_EQ(halves[std::size_t(r)], whole[0]) << "rank " << r << ": not the all-reduce's bits";
      const std::vector<float> block_r(whole[0].begin() + r * block,
                                       whole[0].begin() + (r + 1) * block);
      EXPECT_EQ(scattered[std::size_t(r)], block_r) << "rank " << r << "'s block";
    }
    EXPECT_NE(whole[0], random_values(n, 10)) << "nothing was reduced";
  }
}

// Two processes: each element's sum across them is a + b on either path, so a master
// sharded on NCCL takes the steps of the master on the host, staged through it, bit
// for bit: values, moving statistics, Adam's slots and losses, on even and uneven
// batches (8 and 9 samples), one and two towers per process.
TEST(NcclTrainer, ShardedOnNcclTakesTheHostMastersStepsBitForBit) {
  TL_NEED_NCCL_GPUS(2);
  for (int towers : {1, 2}) {
    for (std::int64_t batch : {8, 9}) {
      SCOPED_TRACE(std::to_string(towers) + " tower(s) per rank, batch " + std::to_string(batch));
      const auto sharded =
          train_on_gpus(2, towers, CrossProcessPath::Auto,
                        "by NCCL on cuda:", BatchNormStats::Average, Master::Sharded, batch);
      const auto host =
          train_on_gpus(2, towers, CrossProcessPath::HostStaged, "by the process group",
                        BatchNormStats::Average, Master::OnTheHost, batch);
      EXPECT_EQ(sharded[0], sharded[1]) << "the ranks' bits differ";
      EXPECT_EQ(sharded[0], host[0]);
      EXPECT_EQ(sharded[1], host[1]);
      if (towers == 2 && batch == 9) {
        const auto on_gpu =
            train_on_gpus(2, towers, CrossProcessPath::Nccl,
                          "by NCCL on cuda:", BatchNormStats::Average, Master::OnTheGpu, batch);
        EXPECT_EQ(sharded[0], on_gpu[0]) << "the master on each rank's GPU, on NCCL";
      }
    }
  }
}

// Three processes: NCCL adds an element's three terms in its own order (rank order on
// the emulated GPUs), the host-staged ring starting each chunk at another rank. The
// sharded run takes the unsharded NCCL run's bits here (both add in rank order), and
// stays within the sums' rounding of the host-staged run. The control: the two
// orders do give different bits, so an exact comparison with the host path would fail.
TEST(NcclTrainer, ThreeRanksShardedOnNcclAddInNcclsOrder) {
  TL_NEED_NCCL_GPUS(3);
  const auto sharded =
      train_on_gpus(3, 2, CrossProcessPath::Nccl, "by NCCL on cuda:", BatchNormStats::Average,
                    Master::Sharded, 13);
  const auto on_gpu =
      train_on_gpus(3, 2, CrossProcessPath::Nccl, "by NCCL on cuda:", BatchNormStats::Average,
                    Master::OnTheGpu, 13);
  const auto host = train_on_gpus(3, 2, CrossProcessPath::HostStaged, "by the process group",
                                  BatchNormStats::Average, Master::OnTheHost, 13);
  EXPECT_EQ(sharded[0], sharded[2]) << "the ranks' bits differ";
  EXPECT_EQ(sharded[0], on_gpu[0]);
  EXPECT_TRUE(all_close(sharded[0], host[0], 1e-5, 1e-5));
  EXPECT_NE(sharded[0], host[0]) << "the sums' order changed no bit: the control cannot fail";
}

// The trace shows the towers' reduce-scatter (one launch on virtual towers), each
// tower's update and, across the processes, NCCL's two halves.
TEST(NcclTrainer, ShardedOnNcclTracesBothHalvesAndEachUpdate) {
  TL_NEED_NCCL_GPUS(2);
  BnModel model;
  std::vector<std::map<std::string, std::set<int>>> rows(2);  // span name: its rows
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    TrainerOptions options;
    options.devices.assign(2, Device::cuda(rank));
    options.master_placement = MasterPlacement::Sharded;
    options.process_group = &group;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options);
    Trace trace;
    trainer.set_trace(&trace);
    trainer.step(make_batch(8, 3));
    const auto events = nlohmann::json::parse(trace.json())["traceEvents"];
    for (const auto& e : events) {
      if (e.value("ph", "") != "X") continue;
      rows[std::size_t(rank)][e["name"].get<std::string>()].insert(e["tid"].get<int>());
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
    auto& seen = rows[std::size_t(r)];
    // Virtual towers of one GPU reduce-scatter in one launch on tower 0's row.
    EXPECT_EQ(seen["all-reduce (one launch)"], (std::set<int>{0})) << "rank " << r;
    EXPECT_EQ(seen["update slice"], (std::set<int>{0, 1})) << "rank " << r;
    for (const char* name : {"reduce-scatter (NCCL): gradient", "all-gather (NCCL): new values"}) {
      EXPECT_EQ(seen[name], (std::set<int>{4})) << "rank " << r << ": " << name;
    }
    EXPECT_EQ(seen.count("update + broadcast"), 0u) << "no master's update";
  }
}

TEST(NcclCommunicator, ARankThatNeverArrivesFailsTheOtherAfterTheDeadline) {
  TL_NEED_NCCL_GPUS(2);
  std::string first, again;
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    NcclCommunicator comm(group, Device::cuda(rank), std::chrono::seconds(2));
    if (rank == 1) return;  // never makes the all-reduce
    Stream stream(Device::cuda(0));
    Tensor x = Tensor::from_host<float>(random_values(4096, 3), {4096}, stream);
    try {
      comm.allreduce_sum({x}, stream, "step 3: gradients");
    } catch (const CommunicationError& e) {
      first = e.what();
    }
    try {
      comm.allreduce_sum({x}, stream, "step 4: gradients");
    } catch (const CommunicationError& e) {
      again = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(first.find("step 3: gradients: ncclAllReduce did not complete within 2 s"),
            std::string::npos)
      << first;
  EXPECT_EQ(again, first) << "a broken communicator repeats its first error";
}

}  // namespace
}  // namespace towerlab::testing
