// The gradient's reduction in bfloat16 contributions (TrainerOptions::reduce_dtype,
// parallel/ring_contributions.h, docs/precision.md).
//
// The ring (CPU, and cuda:0 on the emulated GPUs: members sharing one GPU, and on
// distinct GPUs where there are two or more): a bfloat16 ring's all-reduce and
// reduce-scatter equal contribution_sum_reference bit for bit, for 1 to 4 members,
// odd lengths, ranges (buckets), in place and through receive buffers; the controls
// (the float32 ring, the unrounded contributions, another order) differ from it;
// its bytes are counted: half of the float32 reduce-scatter's, 3/4 of the
// all-reduce's. The processes' exchange (threads as processes): the same reference
// in rank order on every rank. The trainer: the summed gradient is each tower's
// gradient rounded once, summed in tower order (CPU: 1 to 4 towers, even and uneven
// batches; the emulated GPUs: towers sharing cuda:0, and on cuda:0 and cuda:1), with
// its controls and within the bound; float32 is a trainer without the option; a
// sharded master and gradient buckets give the same bits; two processes of one
// tower give one process of two towers; the refused combinations (NCCL between
// processes asked for; on Auto the host stages instead, with two emulated GPUs).
#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <sstream>
#include <vector>

#include "cnn_model.h"
#include "engine/half.h"
#include "parallel/nccl_communicator.h"
#include "parallel/ring_allreduce.h"
#include "parallel/ring_contributions.h"
#include "parallel/ring_schedule.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

// Member m's buffer: values of magnitudes from 2^-20 to 2^20, both signs, so that
// each one's rounding to bfloat16 matters and sums cancel and carry; the members'
// magnitudes at one element lie up to 2^40 apart, so that the order of a float32
// sum of bfloat16 values matters (close together, such sums are exact).
std::vector<float> member_values(std::int64_t length, int member) {
  std::vector<float> v = random_values(std::size_t(length), 300 + unsigned(member));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = std::ldexp(v[i], int((i * 7 + std::size_t(member) * 11) % 41) - 20);
  return v;
}

// The sum in float32, in `order`, of each member's values, rounded to bfloat16 first
// or not: the controls' sums.
std::vector<float> ordered_sum(const std::vector<std::vector<float>>& members,
                               const std::vector<std::size_t>& order, bool round) {
  std::vector<float> sum(members[0].size());
  for (std::size_t i = 0; i < sum.size(); ++i) {
    for (std::size_t k = 0; k < order.size(); ++k) {
      const float v = members[order[k]][i];
      const float term = round ? float(bfloat16(v)) : v;
      sum[i] = k == 0 ? term : sum[i] + term;
    }
  }
  return sum;
}

// 0, 1, ..., n-1.
std::vector<std::size_t> member_order(int n) {
  std::vector<std::size_t> order;
  for (int m = 0; m < n; ++m) order.push_back(std::size_t(m));
  return order;
}

std::vector<float> reference(const std::vector<std::vector<float>>& members) {
  std::vector<float> sum(members[0].size());
  std::vector<std::span<const float>> spans(members.begin(), members.end());
  contribution_sum_reference(sum, spans);
  return sum;
}

// Elements whose bits differ.
std::int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  return count;
}

// --- the reference ---------------------------------------------------------------

TEST(ContributionReference, RoundsEachTermOnceAndAddsInMemberOrder) {
  // bfloat16's step at 1 is 2^-7: 1 + 2^-8 is a tie and rounds to even, 1; so is
  // 1 + 3 * 2^-8, which rounds to 1 + 2^-6.
  const std::vector<float> a{1.0f + std::ldexp(1.0f, -8), -0.0f, 3.0f};
  const std::vector<float> b{1.0f + 3 * std::ldexp(1.0f, -8), -0.0f, std::ldexp(1.0f, -30)};
  std::vector<float> sum(3);
  contribution_sum_reference(sum, {a, b});
  EXPECT_EQ(sum[0], 2.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::signbit(sum[1])) << "a sum of -0s starts from member 0's -0, not from +0";
  EXPECT_EQ(sum[2], 3.0f + std::ldexp(1.0f, -30)) << "the sum itself is float32, not rounded";
  EXPECT_THROW_WITH(contribution_sum_reference(sum, {a, std::vector<float>(2)}), ShapeError,
                    "member 1 has 2 values, the sum 3");
}

// --- the ring --------------------------------------------------------------------

class ContributionRingTest : public BackendTest {
 protected:
  // Layouts of `members` members on this backend: all on one device (virtual
  // devices), and on CUDA, where there are two GPUs or more, spread over them.
  std::vector<std::vector<Device>> layouts(int members) {
    std::vector<std::vector<Device>> all{std::vector<Device>(std::size_t(members), device())};
    const int gpus = device().is_cuda() ? cuda_device_count() : 0;
    if (gpus >= 2 && members >= 2) {
      std::vector<Device> spread;
      for (int m = 0; m < members; ++m) spread.push_back(Device::cuda(m % gpus));
      all.push_back(spread);
    }
    return all;
  }

  struct Members {
    std::vector<std::unique_ptr<Stream>> streams;
    std::vector<const Stream*> raw;
    std::vector<Tensor> buffers;
    std::vector<std::vector<float>> values;
    Members(const std::vector<Device>& devices, std::int64_t length) {
      for (std::size_t m = 0; m < devices.size(); ++m) {
        streams.push_back(std::make_unique<Stream>(devices[m]));
        raw.push_back(streams.back().get());
        values.push_back(member_values(length, int(m)));
        buffers.push_back(Tensor::from_host<float>(values.back(), {length}, *streams.back()));
      }
    }
    std::vector<float> host(std::size_t m) const { return buffers[m].to_host<float>(*streams[m]); }
  };
};
TL_INSTANTIATE_BACKENDS(ContributionRingTest);

struct ReadsVariant {
  RingReads reads;
  RingOnOneGpu one_gpu;
  const char* name;
};
constexpr ReadsVariant kReads[] = {
    {RingReads::InPlace, RingOnOneGpu::OneLaunch, "in place"},
    {RingReads::ThroughReceiveBuffer, RingOnOneGpu::Steps, "through a receive buffer"},
};

TEST_P(ContributionRingTest, AllReduceIsTheReferenceBitForBitOnEveryMember) {
  for (const ReadsVariant& variant : kReads) {
    for (int n : {1, 2, 3, 4}) {
      for (const auto& devices : layouts(n)) {
        // 40000: chunks of at least 10000 values, so 2 host members take threads.
        for (std::int64_t length : {1, 3, 7, 1001, 40000}) {
          SCOPED_TRACE(std::string(variant.name) + ", " + std::to_string(n) + " members on " +
                       devices.back().str() + ", length " + std::to_string(length));
          Members members(devices, length);
          Ring ring(members.raw, variant.reads, variant.one_gpu, DType::BFloat16);
          ring.allreduce(members.buffers);
          const std::vector<float> expected = reference(members.values);
          for (std::size_t m = 0; m < std::size_t(n); ++m) {
            ASSERT_EQ(differing(members.host(m), expected), 0) << "member " << m;
          }
          if (length < 1001) continue;
          // Controls: each would fail the comparison above.
          const std::vector<std::size_t> order = member_order(n);
          const std::vector<std::size_t> reversed(order.rbegin(), order.rend());
          EXPECT_GT(differing(ordered_sum(members.values, order, false), expected), 0)
              << "contributions in float32 (not rounded) give the same bits";
          if (n >= 3) {
            EXPECT_GT(differing(ordered_sum(members.values, reversed, true), expected), 0)
                << "another order gives the same bits";
          }
          Members float32(devices, length);
          Ring(float32.raw, variant.reads, variant.one_gpu).allreduce(float32.buffers);
          EXPECT_GT(differing(float32.host(0), expected), 0) << "the float32 ring gives them";
        }
      }
    }
  }
}

// A range of the buffers (a gradient bucket) reduce-scattered: member j holds the
// reference's sums in chunk summed_at(j) within the range, what a sharded master
// updates from; the range's other chunks are the owners' alone, the rest of the
// buffers untouched. Then the all-gather of the range gives every member every sum.
TEST_P(ContributionRingTest, ARangesReduceScatterLeavesEachOwnerItsChunksSums) {
  const std::int64_t length = 1003, begin = 101, end = 900;
  for (int n : {2, 3, 4}) {
    for (const auto& devices : layouts(n)) {
      SCOPED_TRACE(std::to_string(n) + " members on " + devices.back().str());
      Members members(devices, length);
      Ring ring(members.raw, RingReads::InPlace, RingOnOneGpu::OneLaunch, DType::BFloat16);
      ring.reduce_scatter_range(members.buffers, begin, end);
      const std::vector<float> expected = reference(members.values);
      const RingSchedule schedule(n, length, begin, end);
      for (int j = 0; j < n; ++j) {
        const auto got = members.host(std::size_t(j));
        const RingRange mine = schedule.chunk(schedule.summed_at(j));
        EXPECT_GT(mine.size(), 0);
        for (std::int64_t i = 0; i < length; ++i) {
          const bool owned = i >= mine.begin && i < mine.end;
          const bool outside = i < begin || i >= end;
          if (!owned && !outside) continue;
          const float want =
              owned ? expected[std::size_t(i)] : members.values[std::size_t(j)][std::size_t(i)];
          ASSERT_EQ(std::memcmp(&got[std::size_t(i)], &want, sizeof(float)), 0)
              << "member " << j << ", element " << i << (owned ? " (its chunk)" : " (outside)");
        }
      }
      ring.all_gather_range(members.buffers, begin, end);
      for (int j = 0; j < n; ++j) {
        const auto got = members.host(std::size_t(j));
        for (std::int64_t i = begin; i < end; ++i) {
          ASSERT_EQ(std::memcmp(&got[std::size_t(i)], &expected[std::size_t(i)], sizeof(float)), 0)
              << "member " << j << ", element " << i << " after the all-gather";
        }
      }
    }
  }
}

// The bytes the members receive from one another: the contributions are bfloat16,
// the all-gather float32, on every path.
TEST_P(ContributionRingTest, MovesHalfTheReduceScattersBytesAndThreeQuartersOfTheAllReduces) {
  const std::int64_t length = 1001;
  for (const ReadsVariant& variant : kReads) {
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::string(variant.name) + ", " + std::to_string(n) + " members");
      const std::vector<Device> devices(std::size_t(n), device());
      Members a(devices, length), b(devices, length);
      Ring float32(a.raw, variant.reads, variant.one_gpu);
      Ring bf16(b.raw, variant.reads, variant.one_gpu, DType::BFloat16);
      float32.allreduce(a.buffers);
      bf16.allreduce(b.buffers);
      EXPECT_EQ(float32.bytes_received(), 8 * (n - 1) * length);
      EXPECT_EQ(bf16.bytes_received(), 6 * (n - 1) * length);
      float32.reduce_scatter_range(a.buffers, 0, length);
      bf16.reduce_scatter_range(b.buffers, 0, length);
      EXPECT_EQ(float32.bytes_received(), 12 * (n - 1) * length);
      EXPECT_EQ(bf16.bytes_received(), 8 * (n - 1) * length);
    }
  }
}

TEST(ContributionRing, OtherDtypesAreRefused) {
  const Stream& s = cpu();
  EXPECT_THROW_WITH(Ring({&s, &s}, RingReads::InPlace, RingOnOneGpu::OneLaunch, DType::Float16),
                    NotSupported, "Ring: contributions in float16");
}

// --- across processes ------------------------------------------------------------

TEST(ContributionProcesses, EveryRankHoldsTheReferenceInRankOrder) {
  const std::int64_t length = 1001;
  for (int ranks : {1, 2, 3, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " processes");
    std::vector<std::vector<float>> values, got(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) values.push_back(member_values(length, r));
    const auto errors = run_ranks(ranks, [&](int rank, ProcessGroup& group) {
      got[std::size_t(rank)] = values[std::size_t(rank)];
      allreduce_contributions(group, got[std::size_t(rank)], "gradient");
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    const std::vector<float> expected = reference(values);
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(differing(got[std::size_t(r)], expected), 0) << r;
    EXPECT_GT(differing(ordered_sum(values, member_order(ranks), false), expected), 0)
        << "control: unrounded";
  }
}

// --- the trainer -----------------------------------------------------------------

struct Model : CnnModel {
  // Tower `only` (>= 0) alone contributes: the others' losses are multiplied by 0,
  // so their gradients are zeros and the reduction passes tower `only`'s through.
  TowerFn tower_fn(int only = -1) const {
    return [this, only](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"));
      if (only >= 0 && tower.index != only) loss = ag::scale(loss, 0.0);
      return TowerResult{loss, {logits}, {}};
    };
  }
};

TrainerOptions towers(int n, DType reduce_dtype, Device device = Device::cpu()) {
  TrainerOptions o;
  o.devices.assign(std::size_t(n), device);
  o.seed = 5;
  o.reduce_dtype = reduce_dtype;
  return o;
}

std::vector<float> first_gradient(const Model& model, const TrainerOptions& options,
                                  std::int64_t batch, int only = -1) {
  Trainer trainer(model.vars, model.tower_fn(only), Optimizer::by_name("sgd", 0.1), options);
  trainer.step(small_image_batch(batch, 40, 7));
  return trainer.gradients().to_host<float>();
}

std::vector<float> three_steps(const Model& model, const TrainerOptions& options,
                               std::int64_t batch) {
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
  for (unsigned s = 0; s < 3; ++s) trainer.step(small_image_batch(batch, 40 + s, 7));
  return trainer.master().flat_values().to_host<float>();
}

// Elements whose values differ (+0 and -0 alike: a tower that contributes nothing
// contributes zeros of either sign).
std::int64_t unequal(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) count += !(a[i] == b[i]);
  return count;
}

// The summed gradient of n towers on `devices` (one per tower) against the reference
// on each tower's own float32 gradient, with its controls and the bound.
void expect_the_reference(const Model& model, const std::vector<Device>& devices,
                          std::int64_t batch) {
  const int n = int(devices.size());
  const auto on = [&](DType dtype) {
    TrainerOptions o = towers(n, dtype);
    o.devices = devices;
    return o;
  };
  // Tower i's own float32 gradient: the others contribute zeros (float32 ring).
  std::vector<std::vector<float>> own;
  for (int i = 0; i < n; ++i) own.push_back(first_gradient(model, on(DType::Float32), batch, i));
  const std::vector<float> got = first_gradient(model, on(DType::BFloat16), batch);
  const std::vector<float> expected = reference(own);
  EXPECT_EQ(unequal(got, expected), 0);
  // Controls: the float32 reduction, and the unrounded towers' sum, differ.
  const std::vector<std::size_t> order = member_order(n);
  EXPECT_GT(unequal(first_gradient(model, on(DType::Float32), batch), got), 0);
  EXPECT_GT(unequal(ordered_sum(own, order, false), got), 0);
  // Within the bound against the float32 sum of the same towers: 2^-8 of each
  // term, plus the two float32 sums' own rounding (n - 1 additions each).
  const std::vector<float> float32_sum = ordered_sum(own, order, false);
  for (std::size_t e = 0; e < got.size(); ++e) {
    double terms = 0;
    for (const auto& g : own) terms += std::fabs(double(g[e]));
    const double bound = (std::ldexp(1.0, -8) + 3 * (n - 1) * std::ldexp(1.0, -24)) * terms;
    ASSERT_LE(std::fabs(double(got[e]) - double(float32_sum[e])), bound) << "element " << e;
  }
}

TEST(ReduceDtype, TheGradientIsEachTowersContributionRoundedOnceSummedInTowerOrder) {
  const Model model;
  for (int n : {1, 2, 3, 4}) {
    for (std::int64_t batch : {7, 8}) {
      SCOPED_TRACE(std::to_string(n) + " towers, batch " + std::to_string(batch));
      expect_the_reference(model, std::vector<Device>(std::size_t(n), Device::cpu()), batch);
    }
  }
}

// On the emulated GPUs: towers sharing cuda:0, and on two GPUs where there are.
TEST(ReduceDtype, GpuTowersSumTheReferenceToo) {
  skip_without_cuda_device();
  if (IsSkipped() || HasFatalFailure()) return;
  const Model model;
  std::vector<std::vector<Device>> layouts{{Device::cuda(0), Device::cuda(0)},
                                           {Device::cuda(0), Device::cuda(0), Device::cuda(0)}};
  if (cuda_device_count() >= 2) layouts.push_back({Device::cuda(0), Device::cuda(1)});
  for (const auto& devices : layouts) {
    SCOPED_TRACE(std::to_string(devices.size()) + " towers, the last on " + devices.back().str());
    expect_the_reference(model, devices, 7);
  }
}

// On NCCL the processes all-gather their bfloat16 contributions and each sums them
// in rank order on its GPU: the host staging's bits, on CrossProcessPath::Nccl and
// on Auto (which picks NCCL), with one tower per rank (2 ranks, and 3 where there
// are GPUs for them) and with two virtual towers per rank under a sharded master
// (whose processes' sums are no bfloat16 values: the processes' rounding counts).
// The order of the ranks' terms is not what this can check: a few bfloat16 terms
// of similar size add exactly in float32 in any order.
TEST(ReduceDtype, NcclBetweenProcessesGivesTheHostStagingsBits) {
  if (!NcclCommunicator::available()) GTEST_SKIP() << "this build of towerlab has no NCCL";
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs for 2 NCCL ranks";
  const Model model;
  struct Job {
    int ranks, towers_each;
    MasterPlacement placement;
  };
  const auto run = [&](const Job& job, CrossProcessPath path, DType reduce_dtype) {
    const auto n = std::size_t(job.ranks);
    std::vector<std::string> logs(n);
    std::vector<std::vector<float>> values(n);
    const auto errors = run_ranks(job.ranks, [&](int rank, ProcessGroup& group) {
      std::ostringstream log;
      TrainerOptions o = towers(job.towers_each, reduce_dtype, Device::cuda(rank));
      o.master_placement = job.placement;
      o.process_group = &group;
      o.cross_process = path;
      o.log_placement = true;
      o.log = &log;
      values[std::size_t(rank)] = three_steps(model, o, 7);
      logs[std::size_t(rank)] = log.str();
    });
    for (std::size_t r = 0; r < n; ++r) {
      EXPECT_EQ(errors[r], "") << "rank " << r;
      const bool nccl = logs[r].find("NCCL on cuda:") != std::string::npos;
      EXPECT_EQ(nccl, path != CrossProcessPath::HostStaged) << logs[r];
      EXPECT_EQ(bits(values[r]), bits(values[0])) << "rank " << r << " differs from rank 0";
    }
    return values[0];
  };
  std::vector<Job> jobs{{2, 1, MasterPlacement::OneDevice}, {2, 2, MasterPlacement::Sharded}};
  if (cuda_device_count() >= 3) jobs.push_back({3, 1, MasterPlacement::OneDevice});
  for (const Job& job : jobs) {
    SCOPED_TRACE(std::to_string(job.ranks) + " ranks of " + std::to_string(job.towers_each) +
                 " tower(s)");
    const auto host = run(job, CrossProcessPath::HostStaged, DType::BFloat16);
    EXPECT_EQ(bits(run(job, CrossProcessPath::Nccl, DType::BFloat16)), bits(host));
    EXPECT_EQ(bits(run(job, CrossProcessPath::Auto, DType::BFloat16)), bits(host));
    EXPECT_NE(bits(run(job, CrossProcessPath::Nccl, DType::Float32)), bits(host))
        << "control: float32 on NCCL";
  }
}

TEST(ReduceDtype, Float32IsATrainerWithoutTheOptionBitForBit) {
  const Model model;
  TrainerOptions plain;
  plain.devices = {Device::cpu(), Device::cpu()};
  plain.seed = 5;
  const auto expected = three_steps(model, plain, 7);
  EXPECT_EQ(bits(three_steps(model, towers(2, DType::Float32), 7)), bits(expected));
  // Control: bfloat16 contributions change the steps.
  EXPECT_NE(bits(three_steps(model, towers(2, DType::BFloat16), 7)), bits(expected));
}

TEST(ReduceDtype, AShardedMasterAndGradientBucketsGiveTheSameBits) {
  const Model model;
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " towers");
    const auto expected = three_steps(model, towers(n, DType::BFloat16), 7);
    TrainerOptions sharded = towers(n, DType::BFloat16);
    sharded.master_placement = MasterPlacement::Sharded;
    TrainerOptions bucketed = towers(n, DType::BFloat16);
    bucketed.bucket_bytes = 64;  // a bucket per variable
    TrainerOptions both = sharded;
    both.bucket_bytes = 64;
    EXPECT_EQ(bits(three_steps(model, sharded, 7)), bits(expected)) << "sharded";
    EXPECT_EQ(bits(three_steps(model, bucketed, 7)), bits(expected)) << "bucketed";
    EXPECT_EQ(bits(three_steps(model, both, 7)), bits(expected)) << "sharded and bucketed";
    EXPECT_EQ(bits(three_steps(model, towers(n, DType::BFloat16), 7)), bits(expected))
        << "the same run, other bits";
  }
}

// A process of one tower contributes that tower's gradient rounded once (rounding
// twice changes nothing): two such processes sum what one process of two towers
// sums, in the same order. Two processes of two towers, sharded or not, agree.
TEST(ReduceDtype, TwoProcessesOfOneTowerAreOneProcessOfTwoTowers) {
  const Model model;
  const auto run = [&](int towers_each, MasterPlacement placement) {
    std::vector<std::vector<float>> values(2);
    const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
      TrainerOptions o = towers(towers_each, DType::BFloat16);
      o.master_placement = placement;
      o.process_group = &group;
      values[std::size_t(rank)] = three_steps(model, o, 7);
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(bits(values[0]), bits(values[1])) << "the ranks differ";
    return values[0];
  };
  const auto one_process = three_steps(model, towers(2, DType::BFloat16), 7);
  EXPECT_EQ(bits(run(1, MasterPlacement::OneDevice)), bits(one_process));
  EXPECT_NE(bits(three_steps(model, towers(2, DType::Float32), 7)), bits(one_process))
      << "control: float32";
  EXPECT_EQ(bits(run(2, MasterPlacement::Sharded)), bits(run(2, MasterPlacement::OneDevice)));
}

TEST(ReduceDtype, CombinationsWithOtherSemanticsAreRefused) {
  const Model model;
  TrainerOptions o = towers(2, DType::BFloat16);
  o.reduction = AllReduce::ReduceToOne;
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o),
                    NotSupported, "reduce_dtype bfloat16 with AllReduce::ReduceToOne");
  o.reduction = AllReduce::Nccl;
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o),
                    NotSupported, "reduce_dtype bfloat16 with AllReduce::Nccl");
  o = towers(2, DType::Float16);
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o),
                    NotSupported, "Trainer: reduce_dtype float16");
}

}  // namespace
}  // namespace towerlab::testing
