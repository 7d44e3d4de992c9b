#include "parallel/sharded_master.h"

#include "engine/error.h"
#include "kernels/reduce.h"
#include "parallel/transfer.h"

namespace towerlab {

ShardedMaster::ShardedMaster(const VariableSet& layout, const Optimizer& optimizer,
                             std::vector<const Stream*> tower_streams)
    : layout_(&layout) {
  TL_CHECK(!tower_streams.empty(), InvalidArgument, "sharded master: no towers");
  const auto n = std::int64_t(tower_streams.size());
  const RingSchedule schedule(n, layout.trainable_numel());
  for (std::int64_t k = 0; k < n; ++k) {
    const Stream& stream = *tower_streams[std::size_t(k)];
    const RingRange range = schedule.chunk(schedule.summed_at(k));
    Optimizer own = optimizer;
    // Its slots are made for its slice by scatter(), never shared with the original's.
    own.restore({}, 0, Tensor::empty({range.size()}, stream), stream);
    shards_.push_back({range, &stream, Tensor::empty({range.size()}, stream), std::move(own)});
  }
}

void ShardedMaster::update(std::size_t k, const Tensor& flat_grads, const Tensor& replica_values) {
  Shard& shard = shards_[k];
  const Stream& stream = *shard.stream;
  const Tensor grad = flat_grads.slice(shard.range.begin, shard.range.end);
  shard.optimizer.step(*layout_, shard.range.begin, shard.values, grad, stream);
  copy_tensor(replica_values.slice(shard.range.begin, shard.range.end), shard.values, stream);
}

std::int64_t ShardedMaster::first_nonfinite(std::size_t k, const Tensor& flat_grads) const {
  const Shard& shard = shards_[k];
  if (shard.range.size() == 0) return -1;
  const std::int64_t at = towerlab::first_nonfinite(
      flat_grads.slice(shard.range.begin, shard.range.end), *shard.stream);
  return at < 0 ? -1 : shard.range.begin + at;
}

void ShardedMaster::scatter(const Tensor& values, const Optimizer& optimizer,
                            const Stream& stream) {
  for (Shard& shard : shards_) {
    const RingRange r = shard.range;
    transfer(shard.values, *shard.stream, values.slice(r.begin, r.end), stream);
    std::map<std::string, Tensor> slots;
    for (const auto& [name, slot] : optimizer.slots()) slots[name] = slot.slice(r.begin, r.end);
    // restore copies on the shard's stream: the whole slots must be ready there.
    stream.synchronize();
    shard.optimizer.restore(slots, optimizer.steps(), shard.values, *shard.stream);
  }
  for (const Shard& shard : shards_) shard.stream->synchronize();
}

void ShardedMaster::gather_values(const Tensor& values, const Stream& stream) const {
  for (const Shard& shard : shards_) {
    transfer(values.slice(shard.range.begin, shard.range.end), stream, shard.values, *shard.stream);
  }
  stream.synchronize();
}

std::map<std::string, Tensor> ShardedMaster::gather_slots(const Stream& stream) const {
  std::map<std::string, Tensor> whole;
  std::int64_t length = 0;  // the slices cover the buffer
  for (const Shard& shard : shards_) length += shard.range.size();
  for (const std::string& name : shards_.front().optimizer.slot_names()) {
    if (shards_.front().optimizer.slots().count(name) == 0) continue;  // before the first step
    Tensor all = Tensor::empty({length}, stream);
    for (const Shard& shard : shards_) {
      transfer(all.slice(shard.range.begin, shard.range.end), stream,
               shard.optimizer.slots().at(name), *shard.stream);
    }
    whole[name] = all;
  }
  stream.synchronize();
  return whole;
}

std::int64_t ShardedMaster::value_bytes(std::size_t k) const {
  return shards_[k].values.numel() * std::int64_t(sizeof(float));
}

std::int64_t ShardedMaster::slot_bytes(std::size_t k) const {
  std::int64_t bytes = 0;
  for (const auto& [name, slot] : shards_[k].optimizer.slots()) {
    bytes += slot.numel() * std::int64_t(sizeof(float));
  }
  return bytes;
}

}  // namespace towerlab
