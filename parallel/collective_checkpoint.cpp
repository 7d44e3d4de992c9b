#include "parallel/collective_checkpoint.h"

#include <cstring>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/error.h"

namespace towerlab {

namespace {

// Rank 0's outcome as text for the other ranks: one letter for the error type (the
// most derived towerlab type that matches), then the message. "0" is success.
std::string encode_failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CheckpointMismatch& e) {
    return std::string("M") + e.what();
  } catch (const ShapeError& e) {
    return std::string("S") + e.what();
  } catch (const DeviceError& e) {
    return std::string("D") + e.what();
  } catch (const InvalidArgument& e) {
    return std::string("A") + e.what();
  } catch (const OutOfMemory& e) {
    return std::string("O") + e.what();
  } catch (const CudaError& e) {
    return std::string("C") + e.what();
  } catch (const IoError& e) {
    return std::string("I") + e.what();
  } catch (const NumericError& e) {
    return std::string("N") + e.what();
  } catch (const NotSupported& e) {
    return std::string("U") + e.what();
  } catch (const CommunicationError& e) {
    return std::string("X") + e.what();
  } catch (const std::exception& e) {
    return std::string("E") + e.what();
  }
}

[[noreturn]] void throw_failure(const std::string& outcome) {
  const std::string message = outcome.substr(1);
  switch (outcome.at(0)) {
    case 'M':
      throw CheckpointMismatch(message);
    case 'S':
      throw ShapeError(message);
    case 'D':
      throw DeviceError(message);
    case 'A':
      throw InvalidArgument(message);
    case 'O':
      throw OutOfMemory(message);
    case 'C':
      throw CudaError(message);
    case 'I':
      throw IoError(message);
    case 'N':
      throw NumericError(message);
    case 'U':
      throw NotSupported(message);
    case 'X':
      throw CommunicationError(message);
    default:
      throw Error(message);
  }
}

// Broadcasts rank 0's floats (the size is the same on every rank).
void broadcast_floats(ProcessGroup& group, std::vector<float>& values, const std::string& what) {
  group.broadcast(std::as_writable_bytes(std::span<float>(values)), 0, what);
}

}  // namespace

std::string on_rank0(ProcessGroup& group, const std::string& what,
                     const std::function<std::string()>& work) {
  std::string outcome;
  std::exception_ptr error;
  if (group.rank() == 0) {
    try {
      outcome = "0" + work();
    } catch (...) {
      error = std::current_exception();
      outcome = encode_failure(error);
    }
  }
  const std::string shared = group.allgather(outcome, what).at(0);
  if (error) std::rethrow_exception(error);
  if (shared.empty() || shared[0] != '0') throw_failure(shared);
  return shared.substr(1);
}

void save_checkpoint(ProcessGroup& group, const std::string& path, const VariableStore& store,
                     const Optimizer* optimizer,
                     const std::map<std::string, std::string>& metadata) {
  on_rank0(group, "save_checkpoint " + path, [&] {
    save_checkpoint(path, store, optimizer, metadata);
    return std::string();
  });
}

CheckpointInfo load_checkpoint(ProcessGroup& group, const std::string& path, VariableStore& store,
                               Optimizer* optimizer, const Stream& stream, CheckpointMatch match) {
  const std::string what = "load_checkpoint " + path;
  const bool root = group.rank() == 0;
  const nlohmann::json shared = nlohmann::json::parse(on_rank0(group, what, [&] {
    const CheckpointInfo info = load_checkpoint(path, store, optimizer, stream, match);
    nlohmann::json j{{"optimizer", info.optimizer},
                     {"step", info.step},
                     {"metadata", info.metadata},
                     {"plain_weights", info.plain_weights},
                     {"optimizer_state", int(info.optimizer_state)},
                     {"missing", info.missing},
                     {"unused", info.unused},
                     {"slots", nlohmann::json::array()},
                     {"optimizer_steps", 0}};
    if (optimizer != nullptr) {
      for (const auto& [slot, flat] : optimizer->slots()) j["slots"].push_back(slot);
      j["optimizer_steps"] = optimizer->steps();
    }
    return j.dump();
  }));
  CheckpointInfo info;
  info.optimizer = shared.at("optimizer").get<std::string>();
  info.step = shared.at("step").get<std::int64_t>();
  info.metadata = shared.at("metadata").get<std::map<std::string, std::string>>();
  info.plain_weights = shared.at("plain_weights").get<bool>();
  info.optimizer_state = CheckpointInfo::OptimizerState(shared.at("optimizer_state").get<int>());
  info.missing = shared.at("missing").get<std::vector<std::string>>();
  info.unused = shared.at("unused").get<std::vector<std::string>>();

  // Every variable (trainable or state) in the set's order, then every slot: the
  // variables are views of two flat buffers, so they travel one by one into a
  // packed host buffer and back.
  const auto& specs = store.set().specs();
  std::int64_t total = 0;
  for (const VariableSpec& v : specs) total += v.numel();
  std::vector<float> values(std::size_t(total), 0.0f);
  if (root) {
    std::int64_t at = 0;
    for (const VariableSpec& v : specs) {
      const std::vector<float> host = store.value(v.name).to_host<float>(stream);
      std::memcpy(values.data() + at, host.data(), host.size() * sizeof(float));
      at += v.numel();
    }
  }
  broadcast_floats(group, values, what + ": variables");
  const Stream& host_stream = default_stream(Device::cpu());
  if (!root) {
    const Tensor packed = Tensor::from_host(values, {total}, host_stream);
    std::int64_t at = 0;
    for (const VariableSpec& v : specs) {
      copy_tensor(store.value(v.name), packed.view(at, v.shape), stream);
      at += v.numel();
    }
  }

  if (optimizer != nullptr) {
    const auto slots = shared.at("slots").get<std::vector<std::string>>();
    const std::int64_t flat = store.flat_values().numel();
    std::vector<float> state(std::size_t(flat) * slots.size(), 0.0f);
    if (root) {
      for (std::size_t i = 0; i < slots.size(); ++i) {
        const std::vector<float> host = optimizer->slots().at(slots[i]).to_host<float>(stream);
        std::memcpy(state.data() + i * std::size_t(flat), host.data(), host.size() * sizeof(float));
      }
    }
    if (!slots.empty()) broadcast_floats(group, state, what + ": optimizer state");
    if (!root) {
      std::map<std::string, Tensor> restored;
      for (std::size_t i = 0; i < slots.size(); ++i) {
        restored[slots[i]] = Tensor::from_host(
            std::span<const float>(state.data() + i * std::size_t(flat), std::size_t(flat)), {flat},
            host_stream);
      }
      optimizer->restore(restored, shared.at("optimizer_steps").get<std::int64_t>(), store, stream);
    }
  }
  stream.synchronize();
  return info;
}

}  // namespace towerlab
