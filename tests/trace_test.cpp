// The Chrome trace: times from the first span, args on every span, rows named once;
// the per-layer spans a TraceProfiler takes from a tape (each layer's forward, and
// the backward grouped by the layer that recorded it), which change no gradient;
// and the thread team the ring and the trainer run their members on.
#include "parallel/trace.h"

#include <atomic>
#include <chrono>
#include <latch>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/settings.h"
#include "engine/thread_pool.h"
#include "parallel/thread_team.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

using Json = nlohmann::json;

std::vector<Json> spans_of(const Trace& trace) {
  std::vector<Json> spans;
  const Json parsed = Json::parse(trace.json());
  for (const Json& e : parsed["traceEvents"]) {
    if (e["ph"] == "X") spans.push_back(e);
  }
  return spans;
}

TEST(Trace, TimesStartAtTheFirstSpanAndSpansCarryTheirArgs) {
  Trace trace;
  const auto early = Trace::Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  trace.span(0, "later", Trace::Clock::now(), "tower", {{"samples", std::int64_t(3)}});
  trace.set_step(7);
  trace.span(1, "first", early, "ring", {{"chunk", std::int64_t(2)}, {"layer", "conv1"}});
  const auto spans = spans_of(trace);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[1]["name"], "first");
  EXPECT_EQ(spans[1]["ts"], 0.0);  // the earliest start, though recorded second
  EXPECT_GE(spans[0]["ts"].get<double>(), 5000.0);
  EXPECT_EQ(spans[0]["args"], (Json{{"samples", 3}}));  // before set_step: no step
  EXPECT_EQ(spans[1]["args"], (Json{{"chunk", 2}, {"layer", "conv1"}, {"step", 7}}));
  EXPECT_EQ(spans[1]["cat"], "ring");
}

TEST(Trace, NamingARowAgainRenamesIt) {
  Trace trace;
  trace.name_row(0, "tower 0 (cpu)");
  trace.name_row(1, "master (cpu)");
  trace.name_row(0, "tower 0 (cuda:0)");
  std::vector<std::string> names;
  const Json parsed = Json::parse(trace.json());
  for (const Json& e : parsed["traceEvents"]) {
    if (e["name"] == "thread_name") names.push_back(e["args"]["name"]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tower 0 (cuda:0)", "master (cpu)"}));
}

// fc1 -> ReLU -> fc2, and an mse loss outside every layer.
struct Net {
  VariableSet vars;
  Sequential net;
  Net() {
    net.add<Linear>(vars, "fc1", 4, 5);
    net.add<ReLU>();
    net.add<Linear>(vars, "fc2", 5, 2);
  }
  // One forward and backward on `tape`; returns fc1's weight gradient.
  std::vector<float> train(Tape& tape, VariableStore& store) const {
    const Stream& s = tape.stream();
    store.zero_grad(s);
    const Context ctx{tape, store, true};
    Tensor x = Tensor::empty({3, 4}, s);
    random_normal(x, 5, 0, 0.0f, 1.0f, s);
    Var y = net(ctx, tape.constant(x, "x"));
    Var loss = ag::mse(y, tape.constant(Tensor::zeros({3, 2}, s), "target"));
    tape.backward(loss);
    tape.reset();
    return store.grad("fc1/weight").to_host<float>(s);
  }
};

TEST(TraceProfiler, RecordsEachLayersForwardAndItsBackwardWithoutChangingGradients) {
  const Stream& s = default_stream(Device::cpu());
  Net model;
  VariableStore store(model.vars, s);
  store.initialize(3, s);
  Tape tape(s);
  const std::vector<float> untraced = model.train(tape, store);

  Trace trace;
  trace.set_step(4);
  TraceProfiler profiler(trace, 2, s, 3);
  tape.set_profiler(&profiler);
  const std::vector<float> traced = model.train(tape, store);
  tape.set_profiler(nullptr);
  EXPECT_EQ(traced, untraced);

  std::vector<std::string> forward, backward;
  for (const Json& span : spans_of(trace)) {
    EXPECT_EQ(span["tid"], 2);
    EXPECT_EQ(span["args"]["samples"], 3);
    EXPECT_EQ(span["args"]["step"], 4);
    (span["cat"] == "forward" ? forward : backward).push_back(span["name"]);
  }
  EXPECT_EQ(forward, (std::vector<std::string>{"fc1", "ReLU", "fc2"}));
  // Reverse order; the loss, made outside every layer, is named by its op; each
  // layer is one span however many records it made (a Linear: matmul and bias).
  EXPECT_EQ(backward, (std::vector<std::string>{"mse", "fc2", "ReLU", "fc1"}));
  EXPECT_EQ(spans_of(trace)[0]["args"]["layer"], "fc1: Linear 4->5");

  // Off again: the tape records no span.
  const std::size_t before = trace.size();
  model.train(tape, store);
  EXPECT_EQ(trace.size(), before);
}

TEST(ThreadTeam, RunsEveryMemberAtOnce) {
  // Each member waits until all have arrived: only possible if they run at the same
  // time. A member that gives up after a while reports a team run one by one.
  constexpr std::size_t n = 4;
  ThreadTeam team(n);
  std::latch arrived(n);
  std::atomic<int> met{0};
  std::vector<std::thread::id> ids(n);
  team.run([&](std::size_t i) {
    ids[i] = std::this_thread::get_id();
    arrived.count_down();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!arrived.try_wait() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (arrived.try_wait()) ++met;
  });
  EXPECT_EQ(met.load(), int(n));
  for (std::size_t i = 1; i < n; ++i) EXPECT_NE(ids[i], ids[0]);
}

// Members run kernels side by side, so each holds its share of the pool: 2
// members of 4 threads get 2 each; a member beyond kernel_threads (the trainer's
// gradient reducer) runs no kernels and keeps one. The control is the share outside
// a team, the whole pool.
TEST(ThreadTeam, EveryMemberHoldsItsShareOfThePool) {
  const int saved = num_threads();
  set_num_threads(4);
  EXPECT_EQ(thread_share(), 4) << "the control";
  std::vector<int> shares(3, 0);
  {
    // Both members read their shares while both run (a member alone would borrow
    // the other's: the next test).
    ThreadTeam team(2);
    std::latch started(2), read(2);
    team.run([&](std::size_t i) {
      started.arrive_and_wait();
      shares[i] = thread_share();
      read.arrive_and_wait();
    });
  }
  {
    ThreadTeam team(3, 2);
    std::latch started(3), read(3);
    team.run([&](std::size_t i) {
      started.arrive_and_wait();
      shares[i] += 10 * thread_share();
      read.arrive_and_wait();
    });
  }
  set_num_threads(saved);
  EXPECT_EQ(shares, (std::vector<int>{2 + 20, 2 + 20, 10}));
}

// A member that is still running once the others have finished gets the whole
// pool (ThreadShareGroup); the coordinator keeps its share of one.
TEST(ThreadTeam, AMemberStillRunningBorrowsTheSharesOfFinishedOnes) {
  const int saved = num_threads();
  set_num_threads(4);
  std::vector<int> alone(3, 0);
  {
    ThreadTeam team(3, 2);
    std::atomic<bool> member_1_returned{false};
    team.run([&](std::size_t i) {
      if (i == 1) {
        member_1_returned = true;  // its share leaves the group just after
        return;
      }
      if (i == 2) {
        alone[2] = thread_share();
        return;
      }
      while (!member_1_returned.load()) std::this_thread::yield();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (thread_share() != 4 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      alone[0] = thread_share();
    });
  }
  set_num_threads(saved);
  EXPECT_EQ(alone, (std::vector<int>{4, 0, 1}));
}

TEST(ThreadTeam, RethrowsTheFirstFailureInMemberOrderAndRunsAgain) {
  ThreadTeam team(3);
  std::atomic<int> ran{0};
  EXPECT_THROW_WITH(team.run([&](std::size_t i) {
    ++ran;
    if (i >= 1) TL_THROW(InvalidArgument, "member " << i << " failed");
  }),
                    InvalidArgument, "member 1 failed");
  EXPECT_EQ(ran.load(), 3);  // every member ran to its end
  team.run([&](std::size_t) { ++ran; });
  EXPECT_EQ(ran.load(), 6);
}

}  // namespace
}  // namespace towerlab::testing
