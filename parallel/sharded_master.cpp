#include "parallel/sharded_master.h"

#include "engine/error.h"
#include "kernels/reduce.h"
#include "parallel/transfer.h"

namespace towerlab {

std::vector<RingRange> sharded_slices(std::int64_t length, std::int64_t towers, int ranks, int rank,
                                      std::int64_t exchange_length) {
  TL_CHECK(towers >= 1 && ranks >= 1 && rank >= 0 && rank < ranks, InvalidArgument,
           "sharded master: " << towers << " towers, rank " << rank << " of " << ranks);
  std::vector<RingRange> slices;
  if (ranks == 1) {
    const RingSchedule schedule(towers, length);
    for (std::int64_t k = 0; k < towers; ++k)
      slices.push_back(schedule.chunk(schedule.summed_at(k)));
    return slices;
  }
  TL_CHECK(exchange_length >= length, InvalidArgument,
           "sharded master: an exchange buffer of " << exchange_length
                                                    << " floats for a gradient of " << length);
  // The gradient's part of the chunk the processes' ring finishes at this rank.
  const RingSchedule processes(ranks, exchange_length, 0, length);
  const RingRange mine = processes.chunk(processes.summed_at(rank));
  for (std::int64_t k = 0; k < towers; ++k) {
    const auto [begin, end] = ring_chunk(mine.size(), towers, k);
    slices.push_back({mine.begin + begin, mine.begin + end});
  }
  return slices;
}

ShardedMaster::ShardedMaster(const VariableSet& layout, const std::vector<RingRange>& slices,
                             const Optimizer& optimizer, std::vector<const Stream*> tower_streams)
    : layout_(&layout), length_(layout.trainable_numel()) {
  TL_CHECK(
      !tower_streams.empty() && slices.size() == tower_streams.size(), InvalidArgument,
      "sharded master: " << slices.size() << " slices for " << tower_streams.size() << " towers");
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const Stream& stream = *tower_streams[k];
    const RingRange range = slices[k];
    TL_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= length_, InvalidArgument,
             "sharded master: slice " << k << " [" << range.begin << ", " << range.end
                                      << ") outside a buffer of " << length_);
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
  for (const std::string& name : shards_.front().optimizer.slot_names()) {
    if (shards_.front().optimizer.slots().count(name) == 0) continue;  // before the first step
    Tensor all = Tensor::empty({length_}, stream);
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
