// Streams and events on every backend: ordering, waiting, timing, RAII moves.
#include "test_util.h"

namespace towerlab::testing {
namespace {

class StreamTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(StreamTest);

TEST_P(StreamTest, WorkOnOneStreamRunsInOrder) {
  Tensor x = Tensor::zeros({1 << 16}, stream());
  for (int i = 0; i < 10; ++i)
    axpy(x, 1.0, make(std::vector<float>(1 << 16, 1.0f), {1 << 16}), stream());
  scale(x, x, 0.5, stream());
  const auto values = host(x);
  EXPECT_EQ(values.front(), 5.0f);
  EXPECT_EQ(values.back(), 5.0f);
}

TEST_P(StreamTest, SecondStreamWaitsOnEvent) {
  Stream other(device());
  Tensor x = Tensor::zeros({1 << 18}, stream());
  fill(x, 3.0, stream());
  Event done(device());
  done.record(stream());
  other.wait(done);
  Tensor y = Tensor::empty({1 << 18}, other);
  scale(y, x, 2.0, other);
  const auto values = y.to_host<float>(other);
  EXPECT_EQ(values[12345], 6.0f);
  EXPECT_TRUE(done.query());
}

TEST_P(StreamTest, TimingEventsMeasureElapsedTime) {
  Event start(device(), true), end(device(), true);
  start.record(stream());
  Tensor x = Tensor::zeros({1 << 20}, stream());
  for (int i = 0; i < 5; ++i) fill(x, i, stream());
  end.record(stream());
  end.synchronize();
  EXPECT_GE(Event::elapsed_ms(start, end), 0.0f);
}

TEST_P(StreamTest, EventErrorsAreClear) {
  Event untimed(device()), timed(device(), true);
  untimed.record(stream());
  timed.record(stream());
  EXPECT_THROW_WITH(Event::elapsed_ms(untimed, timed), InvalidArgument, "timing = true");
  Event never(device(), true);
  EXPECT_THROW_WITH(Event::elapsed_ms(timed, never), InvalidArgument, "must be recorded");
  never.synchronize();  // waiting on an unrecorded event returns at once
  if (device().is_cuda()) {
    Event cpu_event(Device::cpu());
    EXPECT_THROW_WITH(cpu_event.record(stream()), InvalidArgument, "recorded on a stream of");
  }
}

TEST_P(StreamTest, MovedStreamsKeepWorking) {
  Stream a(device());
  Stream b = std::move(a);
  Tensor x = Tensor::zeros({5}, b);
  fill(x, 2.0, b);
  EXPECT_EQ(x.to_host<float>(b), std::vector<float>(5, 2.0f));
  Stream c(device());
  c = std::move(b);
  fill(x, 4.0, c);
  EXPECT_EQ(x.to_host<float>(c), std::vector<float>(5, 4.0f));
}

TEST_P(StreamTest, DestroyingAStreamWaitsForItsWorkBeforeItsHandleCanBeReused) {
  if (device().is_cpu()) GTEST_SKIP() << "a host stream's work has finished when each call returns";
  Event done(device());
  {
    Stream doomed(device());
    Tensor x = Tensor::zeros({1 << 16}, doomed);
    hold_back(doomed);  // the work below is still queued when `doomed` goes
    for (int i = 0; i < 50; ++i) fill(x, i, doomed);
    done.record(doomed);
  }  // x goes back to the cache as `doomed`'s block, then `doomed` is destroyed
  // The allocator hands the block to no stream, which is safe only once the work is done.
  EXPECT_TRUE(done.query());
}

TEST(Stream, DefaultStreamIsSharedPerDevice) {
  EXPECT_EQ(&default_stream(Device::cpu()), &default_stream(Device::cpu()));
  EXPECT_EQ(default_stream(Device::cpu()).device(), Device::cpu());
  EXPECT_EQ(default_stream(Device::cpu()).native_handle(), nullptr);
}

}  // namespace
}  // namespace towerlab::testing
