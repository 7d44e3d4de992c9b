// The ring all-reduce over a matrix of member counts and buffer lengths, on
// virtual CPU devices (and virtual CUDA devices where a GPU is), reading the
// sender's chunks in place and through a receive buffer, in one launch and in steps
// where the members share a GPU, its determinism and its
// ordering (bit-equality with the fixed-order sum, run after run), the seeds'
// reduction to one device and broadcast, and the batch split.
#include "parallel/ring_allreduce.h"

#include <nlohmann/json.hpp>

#include "parallel/batch_split.h"
#include "parallel/trace.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class RingTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(RingTest);

// Member i holds values i * 1000 + position: sums are exact in float32.
std::vector<Tensor> make_buffers(std::vector<std::unique_ptr<Stream>>& streams,
                                 std::int64_t length) {
  std::vector<Tensor> buffers;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    std::vector<float> v(static_cast<std::size_t>(length));
    for (std::int64_t p = 0; p < length; ++p) v[std::size_t(p)] = float(i * 1000 + p % 1000);
    buffers.push_back(Tensor::from_host<float>(v, {length}, *streams[i]));
  }
  return buffers;
}

// The ways a ring can reduce; on the host the first two are the same (host threads).
struct RingVariant {
  RingReads reads;
  RingOnOneGpu one_gpu;
  const char* name;
};
constexpr RingVariant kVariants[] = {
    {RingReads::InPlace, RingOnOneGpu::OneLaunch, "in place, one launch on one GPU"},
    {RingReads::InPlace, RingOnOneGpu::Steps, "in place, in steps"},
    {RingReads::ThroughReceiveBuffer, RingOnOneGpu::Steps, "through a receive buffer"},
};

TEST_P(RingTest, SumsEveryBufferForAnyMembersAndLength) {
  for (const RingVariant& variant : kVariants) {
    for (int members : {1, 2, 3, 4, 5, 8}) {
      for (std::int64_t length : {1, 2, 3, 7, 8, 64, 1001, 65537}) {
        std::vector<std::unique_ptr<Stream>> streams;
        std::vector<const Stream*> raw;
        for (int i = 0; i < members; ++i) {
          streams.push_back(std::make_unique<Stream>(device()));
          raw.push_back(streams.back().get());
        }
        auto buffers = make_buffers(streams, length);
        Ring ring(raw, variant.reads, variant.one_gpu);
        ring.allreduce(buffers);
        const float base = float(1000 * members * (members - 1) / 2);
        for (int i = 0; i < members; ++i) {
          const auto got = buffers[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]);
          for (std::int64_t p = 0; p < length; ++p) {
            ASSERT_EQ(got[std::size_t(p)], base + float(members * (p % 1000)))
                << variant.name << ", " << members << " members, length " << length << ", member "
                << i << ", element " << p;
          }
        }
      }
    }
  }
}

// The ring's sum of chunk k, added in the ring's fixed order: member k's values,
// plus member k+1's, plus member k+2's, ... (parallel/ring_allreduce.h). With
// `ring_order` false, in member order 0, 1, 2, ... instead (the control).
std::vector<float> fixed_order_sum(const std::vector<std::vector<float>>& values, bool ring_order) {
  const auto n = std::int64_t(values.size());
  const auto length = std::int64_t(values[0].size());
  std::vector<float> sum(std::size_t(length), 0.0f);
  for (std::int64_t k = 0; k < n; ++k) {
    const auto [begin, end] = ring_chunk(length, n, k);
    const std::int64_t first = ring_order ? k : 0;
    for (std::int64_t p = begin; p < end; ++p) {
      float acc = values[std::size_t(first)][std::size_t(p)];
      for (std::int64_t t = 1; t < n; ++t)
        acc += values[std::size_t((first + t) % n)][std::size_t(p)];
      sum[std::size_t(p)] = acc;
    }
  }
  return sum;
}

// Members run concurrently (host threads on the CPU, streams on a GPU), so a
// member that read its sender's chunk before the sender's previous step had
// written it, or an all-gather that overwrote a chunk its successor was still
// reading, would leave a partial sum somewhere: bit-equality with the fixed-order
// sum, on every member and run after run, catches both (and ThreadSanitizer, which
// runs the Ring tests, reports the race itself on the CPU).
TEST_P(RingTest, EqualsTheFixedOrderSumBitForBitRunAfterRun) {
  // More host threads than cores, so members of one step do overlap on a small machine.
  struct Threads {
    int saved = num_threads();
    Threads() { set_num_threads(6); }
    ~Threads() { set_num_threads(saved); }
  } threads;
  // Uneven chunks; on a GPU long enough that a step's kernels overlap (on the
  // emulated GPUs streams are host threads, which overlap at any length). On the
  // host, chunks of 64 KiB and more are added by the members' threads side by side,
  // smaller ones by the caller alone (parallel/ring_allreduce.h): both.
  const std::vector<std::int64_t> per_member_lengths =
      !device().is_cuda() ? std::vector<std::int64_t>{2048, (1 << 14) + 1}
      : kEmulatedGpus     ? std::vector<std::int64_t>{1 << 14}
                          : std::vector<std::int64_t>{1 << 20};
  for (const RingVariant& variant : kVariants) {
    for (int members : {4, 5}) {
      for (std::int64_t per_member : per_member_lengths) {
        const std::int64_t length = members * per_member + 3;
        std::vector<std::unique_ptr<Stream>> streams;
        std::vector<const Stream*> raw;
        for (int i = 0; i < members; ++i) {
          streams.push_back(std::make_unique<Stream>(device()));
          raw.push_back(streams.back().get());
        }
        std::vector<std::vector<float>> values;
        for (int i = 0; i < members; ++i)
          values.push_back(random_values(std::size_t(length), 40 + i));
        const auto expected = fixed_order_sum(values, true);
        // Control: the comparison sees the order of the additions (and so a missing
        // or repeated term), not only the rough sum.
        ASSERT_NE(fixed_order_sum(values, false), expected);

        Ring ring(raw, variant.reads, variant.one_gpu);
        std::vector<Tensor> buffers;
        for (int i = 0; i < members; ++i) {
          buffers.push_back(Tensor::empty({length}, *streams[std::size_t(i)]));
        }
        const int runs = !device().is_cuda() ? 25 : kEmulatedGpus ? 4 : 10;
        for (int run = 0; run < runs; ++run) {
          for (int i = 0; i < members; ++i) {
            copy_tensor(buffers[std::size_t(i)],
                        Tensor::from_host<float>(values[std::size_t(i)], {length},
                                                 *streams[std::size_t(i)]),
                        *streams[std::size_t(i)]);
          }
          ring.allreduce(buffers);
          for (int i = 0; i < members; ++i) {
            ASSERT_EQ(buffers[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]), expected)
                << variant.name << ", " << members << " members of " << per_member
                << " values, run " << run << ", member " << i;
          }
        }
      }
    }
  }
}

TEST_P(RingTest, ResultIsTheSameBitsEveryRunAndInEveryMember) {
  const int members = 4;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<const Stream*> raw;
  for (int i = 0; i < members; ++i) {
    streams.push_back(std::make_unique<Stream>(device()));
    raw.push_back(streams.back().get());
  }
  Ring ring(raw);
  std::vector<float> first;
  for (int run = 0; run < 5; ++run) {
    std::vector<Tensor> buffers;
    for (int i = 0; i < members; ++i) {
      buffers.push_back(Tensor::from_host<float>(random_values(10007, 100 + i), {10007},
                                                 *streams[std::size_t(i)]));
    }
    ring.allreduce(buffers);
    const auto got = buffers[0].to_host<float>(*streams[0]);
    for (int i = 1; i < members; ++i) {
      ASSERT_EQ(buffers[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]), got)
          << "member " << i;
    }
    if (run == 0) first = got;
    ASSERT_EQ(got, first) << "run " << run;
  }
}

// Ring::reduce leaves member 0 with the all-reduce's bits, on random values whose
// sums depend on the order they are added in, for every member count and chunk size
// (on the caller's thread and on the members' threads), every variant. On the host
// the others keep partial sums: the all-gather did not run (the control: some
// member other than 0 differs from the sum). On GPUs reduce() is the all-reduce.
TEST_P(RingTest, ReduceGivesMemberZeroTheAllReducesBits) {
  for (const RingVariant& variant : kVariants) {
    for (int members : {1, 2, 3, 4, 5}) {
      for (std::int64_t length : {1, 3, 7, 1001, 65537, 100003}) {
        std::vector<std::unique_ptr<Stream>> streams;
        std::vector<const Stream*> raw;
        for (int i = 0; i < members; ++i) {
          streams.push_back(std::make_unique<Stream>(device()));
          raw.push_back(streams.back().get());
        }
        std::vector<Tensor> all, to_first;
        for (int i = 0; i < members; ++i) {
          const std::vector<float> v = random_values(std::size_t(length), 300 + unsigned(i));
          all.push_back(Tensor::from_host<float>(v, {length}, *streams[std::size_t(i)]));
          to_first.push_back(Tensor::from_host<float>(v, {length}, *streams[std::size_t(i)]));
        }
        Ring ring(raw, variant.reads, variant.one_gpu);
        ring.allreduce(all);
        ring.reduce(to_first);
        const auto sum = all[0].to_host<float>(*streams[0]);
        ASSERT_EQ(to_first[0].to_host<float>(*streams[0]), sum)
            << variant.name << ", " << members << " members, length " << length;
        bool partial = false;
        for (int i = 1; i < members; ++i) {
          partial =
              partial || to_first[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]) != sum;
        }
        const bool host_reduce = device().is_cpu() && variant.reads == RingReads::InPlace;
        if (members > 1 && length >= members) {
          EXPECT_EQ(partial, host_reduce)
              << variant.name << ", " << members << " members, length " << length
              << (host_reduce ? ": the others hold partial sums" : ": reduce() is the all-reduce");
        }
      }
    }
  }
}

TEST_P(RingTest, ReduceAndBroadcastAgreesWithTheRing) {
  const int members = 3;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<const Stream*> raw;
  for (int i = 0; i < members; ++i) {
    streams.push_back(std::make_unique<Stream>(device()));
    raw.push_back(streams.back().get());
  }
  auto a = make_buffers(streams, 999);
  auto b = make_buffers(streams, 999);
  Ring ring(raw);
  ring.allreduce(a);
  reduce_and_broadcast(raw, b, 1);
  for (int i = 0; i < members; ++i) {
    EXPECT_EQ(a[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]),
              b[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]));
  }
}

TEST_P(RingTest, TraceRecordsEachRingStep) {
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<const Stream*> raw;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(std::make_unique<Stream>(device()));
    raw.push_back(streams.back().get());
  }
  auto buffers = make_buffers(streams, 300);
  Trace trace;
  Ring ring(raw, RingReads::InPlace, RingOnOneGpu::Steps);
  ring.allreduce(buffers, &trace);
  EXPECT_EQ(trace.size(), 3u * 2u * 2u);  // 3 members x 2 phases x (n-1 = 2) steps
  // Each span: on its member's row, the chunk of the schedule (member j receives
  // chunk j-1-s in the reduce-scatter, j-s in the all-gather) and its 100 floats.
  int seen = 0;
  const auto parsed = nlohmann::json::parse(trace.json());
  for (const auto& e : parsed["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    const bool gather = name.starts_with("all-gather");
    const int j = e["tid"], s = e["args"]["ring step"];
    EXPECT_EQ(name, (gather ? "all-gather " : "reduce-scatter ") + std::to_string(s));
    EXPECT_EQ(e["args"]["chunk"], ((gather ? j - s : j - 1 - s) + 3) % 3) << name << " on " << j;
    EXPECT_EQ(e["args"]["bytes"], 100 * 4);
    EXPECT_EQ(e["cat"], "ring");
    ++seen;
  }
  EXPECT_EQ(seen, 12);
}

// Members that share a GPU reduce in one launch: the same bits as the steps (the
// ring's order per chunk), for the whole buffers and for a range (a bucket), with
// the rest of the buffers untouched; the trace shows the one launch on member 0's row.
TEST_P(RingTest, OneLaunchOnOneGpuGivesTheStepsBits) {
  if (!device().is_cuda()) GTEST_SKIP() << "CUDA-only: one launch is for members that share a GPU";
  for (int members : {2, 3, 5, 8}) {
    const std::int64_t length = 4099;
    std::vector<std::unique_ptr<Stream>> streams;
    std::vector<const Stream*> raw;
    std::vector<std::vector<float>> values;
    for (int i = 0; i < members; ++i) {
      streams.push_back(std::make_unique<Stream>(device()));
      raw.push_back(streams.back().get());
      values.push_back(random_values(std::size_t(length), 70 + i));
    }
    auto load = [&] {
      std::vector<Tensor> buffers;
      for (int i = 0; i < members; ++i)
        buffers.push_back(
            Tensor::from_host<float>(values[std::size_t(i)], {length}, *streams[std::size_t(i)]));
      return buffers;
    };
    for (const auto& [begin, end] :
         {std::pair<std::int64_t, std::int64_t>{0, length}, {1000, 3001}, {17, 18}}) {
      auto one = load(), steps = load();
      Trace trace;
      Ring(raw).allreduce_range(one, begin, end, &trace, 0);
      Ring(raw, RingReads::InPlace, RingOnOneGpu::Steps).allreduce_range(steps, begin, end);
      EXPECT_EQ(trace.size(), 1u) << members << " members: one span, the launch";
      for (int i = 0; i < members; ++i) {
        const auto got = one[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]);
        ASSERT_EQ(got, steps[std::size_t(i)].to_host<float>(*streams[std::size_t(i)]))
            << members << " members, range [" << begin << ", " << end << "), member " << i;
        // Outside the range: the member's own values.
        for (std::int64_t p : {begin - 1, end}) {
          if (p >= 0 && p < length)
            ASSERT_EQ(got[std::size_t(p)], values[std::size_t(i)][std::size_t(p)])
                << "element " << p << " outside the range, member " << i;
        }
      }
      const auto parsed = nlohmann::json::parse(trace.json());
      for (const auto& e : parsed["traceEvents"]) {
        if (e["ph"] != "X") continue;
        EXPECT_EQ(e["name"], "all-reduce (one launch)");
        EXPECT_EQ(e["tid"], 0);
        EXPECT_EQ(e["args"]["bytes"], (end - begin) * 4);
      }
    }
  }
}

TEST_P(RingTest, MismatchedBuffersAreRejected) {
  Stream a(device()), b(device());
  Ring ring({&a, &b});
  EXPECT_THROW_WITH(ring.allreduce({Tensor::zeros({4}, a), Tensor::zeros({5}, b)}), ShapeError,
                    "member 1 has float32[5]");
  EXPECT_THROW_WITH(ring.allreduce({Tensor::zeros({4}, a)}), InvalidArgument,
                    "1 buffers for 2 members");
  EXPECT_THROW_WITH(reduce_and_broadcast({&a, &b}, {Tensor::zeros({4}, a), Tensor::zeros({5}, b)}),
                    ShapeError, "reduce_and_broadcast: member 1 has float32[5]");
  EXPECT_THROW_WITH(reduce_and_broadcast({&a, &b}, {Tensor::zeros({4}, a)}), InvalidArgument,
                    "1 buffers for 2 streams");
}

TEST(Ring, ChunksCoverTheBufferInBalancedPieces) {
  for (std::int64_t length : {0, 1, 5, 7, 100}) {
    for (std::int64_t n : {1, 2, 3, 8}) {
      std::int64_t expected_begin = 0;
      for (std::int64_t k = 0; k < n; ++k) {
        const auto [begin, end] = ring_chunk(length, n, k);
        EXPECT_EQ(begin, expected_begin);
        EXPECT_LE(end - begin, length / n + 1);
        EXPECT_GE(end - begin, length / n);
        expected_begin = end;
      }
      EXPECT_EQ(expected_begin, length);
    }
  }
}

TEST(BatchSplit, SizesDifferByAtMostOneAndNothingIsDropped) {
  const auto s = split_batch(10, 4);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].size(), 3);
  EXPECT_EQ(s[1].size(), 3);
  EXPECT_EQ(s[2].size(), 2);
  EXPECT_EQ(s[3].size(), 2);
  EXPECT_EQ(s[3].end, 10);
  EXPECT_DOUBLE_EQ(s[0].weight + s[1].weight + s[2].weight + s[3].weight, 1.0);
  const auto small = split_batch(2, 4);  // more towers than samples: two sit out
  EXPECT_EQ(small[1].size(), 1);
  EXPECT_EQ(small[2].size(), 0);
  EXPECT_EQ(small[3].weight, 0.0);
  EXPECT_THROW_WITH(split_batch(5, 0), InvalidArgument, "no towers");
  EXPECT_THROW_WITH(split_batch(-1, 2), InvalidArgument, "negative batch size -1");
}

}  // namespace
}  // namespace towerlab::testing
