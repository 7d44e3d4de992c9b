// Warps on the emulated GPUs: their meeting point. Shuffles, votes and __syncwarp are
// rounds among the lanes their mask names (warp_round, device.h); the .sync.aligned
// instructions (mma.sync, ldmatrix; tensor_core.cpp) are rounds of all 32 lanes that
// combine every lane's operands at once (warp_collective, internal.h). A lane that
// arrives waits (block_internal.h: wait_until) until the round's last lane has left
// its value; each misuse a real warp would leave undefined (a mask that leaves the
// caller out, lanes that disagree, an exited or missing lane, lanes in divergent
// code) is reported at once with the kernel, block, warp and lane. Only __syncwarp
// orders memory, as block.cpp's opening comment says.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "block_internal.h"

namespace tlemu::detail {
namespace {

unsigned linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

}  // namespace

unsigned lane_id() {
  return linear_tid() % 32;
}

WarpResult warp_round(unsigned mask, std::uint64_t value, bool vote, int source, bool orders_memory,
                      const char* what, const std::source_location& where) {
  Scheduler& s = scheduler();
  Thread& f = running_thread(what);
  const unsigned lane = f.tid % 32;
  Warp& w = s.warps[f.tid / 32];
  auto bug = [&](const char* problem) {
    kernel_bug("%s at %s:%u, %s, warp %u lane %u, mask 0x%08x: %s", what,
               short_name(where.file_name()), where.line(), block_name(s).c_str(), f.tid / 32, lane,
               mask, problem);
  };
  unsigned long generation;
  int buffer;
  {
    Hidden hidden;
    if ((mask >> lane & 1u) == 0) bug("the calling lane is not in the mask");
    if ((mask & ~w.members) != 0) bug("the mask names lanes that do not exist in this block");
    if ((mask & w.exited) != 0) bug("the mask names a lane that has already exited");
    if (w.arrived != 0 && w.collective != nullptr) {
      bug((std::string("other lanes of the warp wait in ") + w.collective_what + " at " +
           short_name(w.collective_site.file_name()) + ":" +
           std::to_string(w.collective_site.line()) + ": lanes in divergent code")
              .c_str());
    }
    if (w.arrived != 0 && w.mask != mask) bug("lanes of the warp disagree on the mask");
    if (source >= 0 && (mask >> source & 1u) == 0)
      bug("the lane reads a lane that is not in the mask: the value is undefined");
    generation = w.generation;
    buffer = static_cast<int>(generation & 1);
    w.mask = mask;
    w.slot[buffer][lane] = value;
    if (w.arrived == 0) w.ballot[buffer] = 0;
    if (vote) w.ballot[buffer] |= 1u << lane;
  }
  if (orders_memory) tsan_release(&w.token[buffer]);
  {
    Hidden hidden;
    w.arrived |= 1u << lane;
    if (w.arrived == mask) {
      w.arrived = 0;
      ++w.generation;
      for (unsigned t = 32 * (f.tid / 32); t < std::min(s.threads, 32 * (f.tid / 32) + 32); ++t) {
        Thread& other = *s.thread_slots[t];
        if (other.state == ThreadState::AtWarp) wake(s, other);
      }
    } else {
      f.state = ThreadState::AtWarp;
      f.waiting_at = where;
      f.waiting_for = what;
    }
  }
  wait_until(s, f, [&] { return w.generation != generation; });
  if (orders_memory) tsan_acquire(&w.token[buffer]);
  Hidden hidden;
  return {source >= 0 ? w.slot[buffer][source] : value, w.ballot[buffer]};
}

void warp_instruction_bug(const char* what, const std::source_location& where,
                          const std::string& problem) {
  Scheduler& s = scheduler();
  const Thread& f = running_thread(what);
  kernel_bug("%s at %s:%u, %s, warp %u lane %u: %s", what, short_name(where.file_name()),
             where.line(), block_name(s).c_str(), f.tid / 32, f.tid % 32, problem.c_str());
}

void warp_collective(Combine combine, const std::uint32_t* in, std::uint32_t* out, const char* what,
                     const std::source_location& where) {
  Scheduler& s = scheduler();
  Thread& f = running_thread(what);
  const unsigned lane = f.tid % 32;
  const unsigned warp = f.tid / 32;
  Warp& w = s.warps[warp];
  auto site = [](const std::source_location& at) {
    return std::string(short_name(at.file_name())) + ":" + std::to_string(at.line());
  };
  unsigned long generation;
  int buffer;
  WarpExchange* x;
  {
    Hidden hidden;
    if (w.members != 0xffffffffu) {
      warp_instruction_bug(what, where,
                           "the warp has fewer than 32 threads (the block's size is not a "
                           "multiple of 32): all 32 lanes must execute a .aligned instruction");
    }
    if (w.exited != 0) {
      char lanes[16];
      std::snprintf(lanes, sizeof lanes, "0x%08x", w.exited);
      warp_instruction_bug(what, where,
                           std::string("lanes ") + lanes +
                               " of the warp have already exited: all 32 lanes must execute "
                               "a .aligned instruction");
    }
    if (w.arrived != 0 && w.collective == nullptr) {
      warp_instruction_bug(what, where,
                           "other lanes of the warp wait in a shuffle, vote or __syncwarp: "
                           "lanes in divergent code");
    }
    if (w.arrived != 0 && (w.collective != combine || w.collective_site.line() != where.line() ||
                           std::strcmp(w.collective_site.file_name(), where.file_name()) != 0)) {
      warp_instruction_bug(what, where,
                           std::string("other lanes of the warp wait in ") + w.collective_what +
                               " at " + site(w.collective_site) +
                               ": all 32 lanes must execute the same instruction (lanes in "
                               "divergent code)");
    }
    if (s.exchange.size() < s.warps.size()) s.exchange.resize(s.warps.size());
    if (!s.exchange[warp]) s.exchange[warp] = std::make_unique<WarpExchange>();
    x = s.exchange[warp].get();
    generation = w.generation;
    buffer = static_cast<int>(generation & 1);
    if (w.arrived == 0) {
      w.collective = combine;
      w.collective_what = what;
      w.collective_site = where;
      w.mask = 0xffffffffu;  // what thread_exited checks a returning lane against
    }
    std::memcpy(x->in[buffer].lane[lane], in, sizeof x->in[buffer].lane[lane]);
    w.arrived |= 1u << lane;
    if (w.arrived == 0xffffffffu) {
      combine(x->in[buffer], x->out[buffer]);
      w.arrived = 0;
      w.collective = nullptr;
      ++w.generation;
      for (unsigned t = 32 * warp; t < 32 * warp + 32; ++t) {
        Thread& other = *s.thread_slots[t];
        if (other.state == ThreadState::AtWarp) wake(s, other);
      }
    } else {
      f.state = ThreadState::AtWarp;
      f.waiting_at = where;
      f.waiting_for = what;
    }
  }
  wait_until(s, f, [&] { return w.generation != generation; });
  Hidden hidden;
  std::memcpy(out, x->out[buffer].lane[lane], sizeof x->out[buffer].lane[lane]);
}

}  // namespace tlemu::detail
