#include "parallel/cluster.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>

#include "engine/clock.h"
#include "engine/error.h"
#include "parallel/ring_schedule.h"

#if TOWERLAB_WITH_MPI
#include <mpi.h>
#include <unistd.h>

#include <csignal>
#endif

namespace towerlab {

namespace {

// The number of ranks the launcher started, when this process was started by one.
std::optional<int> launched_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  if (std::getenv("PMIX_RANK") != nullptr) return 0;  // a PMIx launcher: MPI says how many
  return std::nullopt;
}

std::chrono::milliseconds deadline_from_environment(std::chrono::milliseconds fallback) {
  const char* text = std::getenv("TOWERLAB_MPI_DEADLINE_S");
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  TL_CHECK(end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0 && seconds < 1e9,
           InvalidArgument,
           "TOWERLAB_MPI_DEADLINE_S must be a positive number of seconds, got '" << text << "'");
  return std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(seconds * 1000)));
}

}  // namespace

#if TOWERLAB_WITH_MPI

namespace {

constexpr int kArrivalTag = 1;
constexpr int kAbortTag = 2;
constexpr int kAbortBytes = 1024;
// One MPI message carries at most INT_MAX elements; broadcasts go in pieces of this.
constexpr std::size_t kBroadcastPiece = std::size_t(1) << 30;

std::atomic<bool> g_mpi_cluster_alive{false};

// What a rank says when mpirun stops it with SIGTERM (it does so to every rank when
// one dies, then sends SIGKILL a second later): its rank and the collective call
// it was in. A signal handler may not allocate or lock, so the call's name is kept
// in fixed buffers: Mpi::begin writes the one not published and then publishes it
// (a lock-free index), so the handler reads a whole name unless two calls begin
// while it runs.
constexpr std::size_t kNoteBytes = 240;
std::array<std::array<char, kNoteBytes>, 2> g_call_names{};
std::atomic<int> g_call_name{-1};  // the published buffer; -1: no call yet
std::atomic<bool> g_in_call{false};
std::array<char, 48> g_rank_prefix{};  // "towerlab: rank 3 "
struct sigaction g_previous_sigterm;
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

void note_call(std::string_view what) {
  const int next = 1 - std::max(g_call_name.load(), 0);
  auto& name = g_call_names[std::size_t(next)];
  const std::size_t n = std::min(what.size(), kNoteBytes - 1);
  std::memcpy(name.data(), what.data(), n);
  name[n] = '\0';
  g_call_name.store(next);
  g_in_call.store(true);
}

// Appends the C string `text` to line[0, *used), within `capacity`.
void append(char* line, std::size_t capacity, std::size_t* used, const char* text) {
  while (*text != '\0' && *used + 1 < capacity) line[(*used)++] = *text++;
}

// One line on stderr, then the previous action (by default: terminate by SIGTERM)
// once this handler returns. Only async-signal-safe calls: write, sigaction, raise.
extern "C" void report_sigterm(int) {
  char line[kNoteBytes + 256];
  std::size_t used = 0;
  append(line, sizeof line, &used, g_rank_prefix.data());
  const int note = g_call_name.load();
  if (note < 0) {
    append(line, sizeof line, &used, "had made no collective call");
  } else {
    append(line, sizeof line, &used, g_in_call.load() ? "was in '" : "had finished '");
    append(line, sizeof line, &used, g_call_names[std::size_t(note)].data());
    append(line, sizeof line, &used, g_in_call.load() ? "'" : "', its last collective call,");
  }
  append(line, sizeof line, &used,
         " when SIGTERM stopped it (mpirun stops every rank when one dies)\n");
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line, used);
  ::sigaction(SIGTERM, &g_previous_sigterm, nullptr);
  ::raise(SIGTERM);  // blocked until this handler returns
}

// Installs report_sigterm unless the program ignores SIGTERM or handles it itself.
void install_sigterm_report(int rank) {
  const std::string prefix = "towerlab: rank " + std::to_string(rank) + " ";
  std::memcpy(g_rank_prefix.data(), prefix.c_str(), prefix.size() + 1);
  struct sigaction previous {};
  ::sigaction(SIGTERM, nullptr, &previous);
  if (previous.sa_handler != SIG_DFL || (previous.sa_flags & SA_SIGINFO) != 0) return;
  g_previous_sigterm = previous;
  struct sigaction action {};
  action.sa_handler = report_sigterm;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
}

void remove_sigterm_report() {
  struct sigaction current {};
  ::sigaction(SIGTERM, nullptr, &current);
  if (current.sa_handler == report_sigterm) ::sigaction(SIGTERM, &g_previous_sigterm, nullptr);
  g_call_name.store(-1);
  g_in_call.store(false);
}

std::string seconds_text(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << double(d.count()) / 1000.0 << " s";
  return os.str();
}

enum class Call : std::uint64_t {
  AllreduceFloat = 1,
  AllreduceDouble,
  Broadcast,
  Allgather,
  Barrier,
  ReduceScatterFloat,
  AllgatherChunksFloat
};

std::string describe(Call call, std::uint64_t count, std::uint64_t root) {
  switch (call) {
    case Call::AllreduceFloat:
      return "an all-reduce of " + std::to_string(count) + " floats";
    case Call::AllreduceDouble:
      return "an all-reduce of " + std::to_string(count) + " doubles";
    case Call::Broadcast:
      return "a broadcast of " + std::to_string(count) + " bytes from rank " + std::to_string(root);
    case Call::Allgather:
      return "an allgather";
    case Call::Barrier:
      return "a barrier";
    case Call::ReduceScatterFloat:
      return "a reduce-scatter of " + std::to_string(count) + " floats";
    case Call::AllgatherChunksFloat:
      return "an allgather of the chunks of " + std::to_string(count) + " floats";
  }
  return "call kind " + std::to_string(std::uint64_t(call));
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, std::size_t(length));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

}  // namespace

// The MPI side of a Cluster. Every call runs begin() (tell every peer which call
// this is), its own non-blocking requests polled by poll_until(), and end() (every
// peer's notice for this call received, ours delivered). After a failure nothing
// calls MPI again: requests may still point into buffers, and only MPI calls make
// progress on them, so they stay inert.
struct Cluster::Mpi {
  // What a rank announces on entering a call: its number, kind, size and root.
  using Notice = std::array<std::uint64_t, 4>;

  MPI_Comm data = MPI_COMM_NULL;     // the collectives' payloads
  MPI_Comm control = MPI_COMM_NULL;  // arrival and abort notices
  bool owns_init = false;            // MPI_Init_thread was ours, so MPI_Finalize is too
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds deadline{0};

  std::uint64_t calls = 0;  // calls completed
  std::string broken;       // the first failure; later calls repeat it
  std::string what;         // the current call, for messages
  Notice mine{};
  Clock::time_point start;

  std::vector<Notice> notices;  // per rank: its notice for the current call
  std::vector<MPI_Request> notice_recv;
  std::vector<MPI_Request> notice_send;
  std::vector<bool> arrived;
  Notice notice_out{};
  std::array<char, kAbortBytes> abort_in{};
  std::array<char, kAbortBytes> abort_out{};
  MPI_Request abort_recv = MPI_REQUEST_NULL;
  std::vector<MPI_Request> abort_send;
  std::vector<std::byte> scratch;  // the ring's incoming chunk

  [[noreturn]] void fail(const std::string& reason) {
    broken = what + ": " + reason;
    // Tell the peers, so that they stop now rather than at their own deadline. The
    // sends are not waited for: a peer that is gone must not hold this rank.
    const std::string text = "rank " + std::to_string(rank) + " gave up: " + reason;
    const std::size_t n = std::min<std::size_t>(text.size(), kAbortBytes - 1);
    std::memcpy(abort_out.data(), text.data(), n);
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank)
        MPI_Isend(abort_out.data(), int(n), MPI_CHAR, peer, kAbortTag, control, &abort_send[peer]);
    }
    throw CommunicationError(broken);
  }

  void check(int code, const char* call) {
    if (code != MPI_SUCCESS) fail(std::string(call) + " failed: " + mpi_error_text(code));
  }

  void post_notice_receives() {
    for (int peer = 0; peer < size; ++peer) {
      arrived[peer] = peer == rank;
      if (peer != rank)
        check(MPI_Irecv(notices[peer].data(), 4, MPI_UINT64_T, peer, kArrivalTag, control,
                        &notice_recv[peer]),
              "MPI_Irecv");
    }
  }

  // Takes in what the peers sent so far: notices of arrival (checked against this
  // rank's call) and another rank's abort.
  void poll_control() {
    for (int peer = 0; peer < size; ++peer) {
      if (arrived[peer]) continue;
      int flag = 0;
      check(MPI_Test(&notice_recv[peer], &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (!flag) continue;
      arrived[peer] = true;
      const Notice& theirs = notices[peer];
      if (theirs != mine) {
        fail("rank " + std::to_string(peer) + " made " +
             describe(Call(theirs[1]), theirs[2], theirs[3]) + " as its call #" +
             std::to_string(theirs[0]) + " where rank " + std::to_string(rank) + " made " +
             describe(Call(mine[1]), mine[2], mine[3]) + " as its call #" +
             std::to_string(mine[0]) + ": every rank must make the same calls in the same order");
      }
    }
    int flag = 0;
    MPI_Status status;
    check(MPI_Test(&abort_recv, &flag, &status), "MPI_Test");
    if (flag) {
      int length = 0;
      MPI_Get_count(&status, MPI_CHAR, &length);
      broken = what + ": " + std::string(abort_in.data(), std::size_t(std::max(length, 0)));
      throw CommunicationError(broken);
    }
  }

  [[noreturn]] void fail_late() {
    std::vector<int> late;
    for (int peer = 0; peer < size; ++peer) {
      if (!arrived[peer]) late.push_back(peer);
    }
    if (!late.empty()) {
      fail(rank_list(late) + " did not arrive within " + seconds_text(deadline) + " (rank " +
           std::to_string(rank) + " waited in " + describe(Call(mine[1]), mine[2], mine[3]) + ")");
    }
    fail(describe(Call(mine[1]), mine[2], mine[3]) + " did not complete within " +
         seconds_text(deadline) + " although every rank arrived: a rank died in it, or the " +
         "network stalled");
  }

  // Polls until done() holds, taking in notices and aborts, and fails once the
  // call has run past the deadline. Spins first (a collective of the ring is
  // usually done within microseconds), then sleeps between polls so that a long
  // wait does not take a core from the ranks being waited for.
  void poll_until(const std::function<bool()>& done) {
    const Clock::time_point waiting_since = Clock::now();
    while (!done()) {
      poll_control();
      const Clock::time_point now = Clock::now();
      if (now - start > deadline) fail_late();
      if (now - waiting_since > std::chrono::microseconds(200))
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void wait(std::span<MPI_Request> requests, const char* call) {
    poll_until([&] {
      int flag = 0;
      check(MPI_Testall(int(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE), call);
      return flag != 0;
    });
  }

  void begin(Call call, std::uint64_t count, std::uint64_t root, std::string_view call_name) {
    if (!broken.empty()) {
      throw CommunicationError(std::string(call_name) +
                               ": the process group failed earlier: " + broken);
    }
    what = std::string(call_name);
    note_call(what);
    mine = {calls, std::uint64_t(call), count, root};
    notice_out = mine;
    start = Clock::now();
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank)
        check(MPI_Isend(notice_out.data(), 4, MPI_UINT64_T, peer, kArrivalTag, control,
                        &notice_send[peer]),
              "MPI_Isend");
    }
  }

  void end() {
    wait(notice_send, "MPI_Isend");
    poll_until([&] { return std::find(arrived.begin(), arrived.end(), false) == arrived.end(); });
    ++calls;
    post_notice_receives();
    g_in_call.store(false);
  }
};

Cluster::Cluster(ClusterOptions options) : deadline_(deadline_from_environment(options.deadline)) {
  const std::optional<int> launched = launched_size();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!launched && !initialized) return;  // a process of its own: no MPI
  TL_CHECK(!g_mpi_cluster_alive.exchange(true), NotSupported,
           "Cluster: one Cluster per process; another one is alive");
  try {
    int finalized = 0;
    MPI_Finalized(&finalized);
    TL_CHECK(!finalized, NotSupported,
             "Cluster: MPI was finalized in this process and cannot start again");
    auto mpi = std::make_unique<Mpi>();
    int provided = 0;
    if (!initialized) {
      const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      TL_CHECK(code == MPI_SUCCESS, CommunicationError,
               "Cluster: MPI_Init_thread failed: " << mpi_error_text(code));
      mpi->owns_init = true;
    } else {
      MPI_Query_thread(&provided);
    }
    TL_CHECK(provided >= MPI_THREAD_SERIALIZED, NotSupported,
             "Cluster: MPI provides thread level " << provided << ", below MPI_THREAD_SERIALIZED");
    // Errors come back as codes (and become CommunicationError) instead of MPI's
    // default of aborting the job with its own message.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    auto init_check = [](int code, const char* call) {
      TL_CHECK(code == MPI_SUCCESS, CommunicationError,
               "Cluster: " << call << " failed: " << mpi_error_text(code));
    };
    init_check(MPI_Comm_dup(MPI_COMM_WORLD, &mpi->data), "MPI_Comm_dup");
    init_check(MPI_Comm_dup(MPI_COMM_WORLD, &mpi->control), "MPI_Comm_dup");
    MPI_Comm_rank(mpi->data, &mpi->rank);
    MPI_Comm_size(mpi->data, &mpi->size);
    MPI_Comm node = MPI_COMM_NULL;
    init_check(
        MPI_Comm_split_type(mpi->data, MPI_COMM_TYPE_SHARED, mpi->rank, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    rank_ = mpi->rank;
    size_ = mpi->size;
    mpi->deadline = deadline_;
    mpi->notices.resize(std::size_t(size_));
    mpi->notice_recv.assign(std::size_t(size_), MPI_REQUEST_NULL);
    mpi->notice_send.assign(std::size_t(size_), MPI_REQUEST_NULL);
    mpi->abort_send.assign(std::size_t(size_), MPI_REQUEST_NULL);
    mpi->arrived.assign(std::size_t(size_), false);
    mpi->what = "Cluster";
    mpi->post_notice_receives();
    mpi->check(MPI_Irecv(mpi->abort_in.data(), kAbortBytes, MPI_CHAR, MPI_ANY_SOURCE, kAbortTag,
                         mpi->control, &mpi->abort_recv),
               "MPI_Irecv");
    mpi_ = std::move(mpi);
    install_sigterm_report(rank_);
  } catch (...) {
    g_mpi_cluster_alive = false;
    throw;
  }
}

Cluster::~Cluster() {
  if (!mpi_) return;
  remove_sigterm_report();
  if (!mpi_->broken.empty()) {
    // Requests of the failed call may still name this object's buffers, and
    // MPI_Finalize would wait for the rank that was lost: leave MPI as it is (and
    // this object's memory to it) and let mpirun end the job when the process exits.
    (void)mpi_.release();
    return;
  }
  for (MPI_Request* request : {&mpi_->abort_recv}) {
    MPI_Cancel(request);
    MPI_Wait(request, MPI_STATUS_IGNORE);
  }
  for (MPI_Request& request : mpi_->notice_recv) {
    if (request == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&mpi_->control);
  MPI_Comm_free(&mpi_->data);
  if (mpi_->owns_init) MPI_Finalize();
  g_mpi_cluster_alive = false;
}

template <typename T>
void Cluster::ring_allreduce(std::span<T> values, std::string_view what, ReduceFrame frame,
                             RingHalves halves) {
  const Call call = halves == RingHalves::ReduceScatter ? Call::ReduceScatterFloat
                    : halves == RingHalves::AllGather   ? Call::AllgatherChunksFloat
                    : std::is_same_v<T, float>          ? Call::AllreduceFloat
                                                        : Call::AllreduceDouble;
  Mpi& m = *mpi_;
  m.begin(call, values.size(), 0, what);
  const int p = size_, r = rank_;
  const std::size_t n = values.size();
  const std::size_t total = frame.total == 0 ? n : frame.total;
  if (frame.offset + n > total) {
    m.fail("an all-reduce of " + std::to_string(n) + " values at offset " +
           std::to_string(frame.offset) + " of a buffer of " + std::to_string(total));
  }
  // The towers' ring's schedule, over the ranks, with the whole buffer's chunks.
  const auto offset = std::int64_t(frame.offset);
  const RingSchedule schedule(p, std::int64_t(total), offset, offset + std::int64_t(n));
  if (schedule.largest_chunk() > INT_MAX) {
    m.fail("an all-reduce of " + std::to_string(n) + " values has chunks over INT_MAX elements");
  }
  m.scratch.resize(std::size_t(schedule.largest_chunk() + 1) * sizeof(T));
  T* incoming = reinterpret_cast<T*>(m.scratch.data());
  // Chunk c of the values (within `values`) and its length.
  auto at = [&](std::int64_t chunk) {
    return values.data() + (schedule.chunk(chunk).begin - offset);
  };
  auto count = [&](std::int64_t chunk) { return int(schedule.chunk(chunk).size()); };
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  const MPI_Datatype type = mpi_type<T>();
  std::array<MPI_Request, 2> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  for (const RingStep& step : schedule.steps(r)) {
    // The reduce-scatter receives into `incoming` and adds; the all-gather
    // receives the finished chunk straight over this rank's.
    const bool gather = step.phase == RingPhase::AllGather;
    if ((gather && halves == RingHalves::ReduceScatter) ||
        (!gather && halves == RingHalves::AllGather)) {
      continue;
    }
    m.check(MPI_Irecv(gather ? at(step.receive) : incoming, count(step.receive), type, left, 0,
                      m.data, &requests[0]),
            "MPI_Irecv");
    m.check(MPI_Isend(at(step.send), count(step.send), type, right, 0, m.data, &requests[1]),
            "MPI_Isend");
    m.wait(requests, gather ? "the ring's allgather" : "the ring's reduce-scatter");
    if (!gather) {
      // Arrives carrying the sum of the ranks before this one, in the schedule's
      // order; this rank's values are added last.
      T* mine = at(step.receive);
      for (int i = 0; i < count(step.receive); ++i) mine[i] = incoming[i] + mine[i];
    }
  }
  m.end();
}

void Cluster::allreduce_sum(std::span<float> values, std::string_view what, ReduceFrame frame) {
  if (mpi_) ring_allreduce(values, what, frame, RingHalves::Both);
}

void Cluster::allreduce_sum(std::span<double> values, std::string_view what) {
  if (mpi_) ring_allreduce(values, what, ReduceFrame{}, RingHalves::Both);
}

void Cluster::reduce_scatter_sum(std::span<float> values, std::string_view what,
                                 ReduceFrame frame) {
  if (mpi_) ring_allreduce(values, what, frame, RingHalves::ReduceScatter);
}

void Cluster::allgather_chunks(std::span<float> values, std::string_view what, ReduceFrame frame) {
  if (mpi_) ring_allreduce(values, what, frame, RingHalves::AllGather);
}

void Cluster::broadcast(std::span<std::byte> bytes, int root, std::string_view what) {
  TL_CHECK(root >= 0 && root < size_, InvalidArgument,
           what << ": broadcast from rank " << root << " in a group of " << size_);
  if (!mpi_) return;
  Mpi& m = *mpi_;
  m.begin(Call::Broadcast, bytes.size(), std::uint64_t(root), what);
  std::size_t at = 0;
  do {  // an empty broadcast still synchronizes, as on every other rank
    const std::size_t n = std::min(kBroadcastPiece, bytes.size() - at);
    MPI_Request request = MPI_REQUEST_NULL;
    m.check(MPI_Ibcast(bytes.data() + at, int(n), MPI_BYTE, root, m.data, &request), "MPI_Ibcast");
    m.wait({&request, 1}, "MPI_Ibcast");
    at += n;
  } while (at < bytes.size());
  m.end();
}

std::vector<std::string> Cluster::allgather(std::string_view mine, std::string_view what) {
  if (!mpi_) return {std::string(mine)};
  Mpi& m = *mpi_;
  m.begin(Call::Allgather, 0, 0, what);
  const int p = size_;
  const std::int64_t my_size = std::int64_t(mine.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(p));
  MPI_Request request = MPI_REQUEST_NULL;
  m.check(MPI_Iallgather(&my_size, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, m.data, &request),
          "MPI_Iallgather");
  m.wait({&request, 1}, "MPI_Iallgather");
  std::vector<int> counts(static_cast<std::size_t>(p)), offsets(static_cast<std::size_t>(p));
  std::int64_t total = 0;
  for (int i = 0; i < p; ++i) {
    offsets[std::size_t(i)] = int(total);
    counts[std::size_t(i)] = int(sizes[std::size_t(i)]);
    total += sizes[std::size_t(i)];
    if (total > INT_MAX) m.fail("an allgather of more than INT_MAX bytes");
  }
  std::string all(std::size_t(total), '\0');
  m.check(MPI_Iallgatherv(mine.data(), int(mine.size()), MPI_CHAR, all.data(), counts.data(),
                          offsets.data(), MPI_CHAR, m.data, &request),
          "MPI_Iallgatherv");
  m.wait({&request, 1}, "MPI_Iallgatherv");
  m.end();
  std::vector<std::string> result;
  for (int i = 0; i < p; ++i)
    result.push_back(
        all.substr(std::size_t(offsets[std::size_t(i)]), std::size_t(counts[std::size_t(i)])));
  return result;
}

void Cluster::barrier(std::string_view what) {
  if (!mpi_) return;
  Mpi& m = *mpi_;
  m.begin(Call::Barrier, 0, 0, what);
  MPI_Request request = MPI_REQUEST_NULL;
  m.check(MPI_Ibarrier(m.data, &request), "MPI_Ibarrier");
  m.wait({&request, 1}, "MPI_Ibarrier");
  m.end();
}

#else  // !TOWERLAB_WITH_MPI: always a process of its own

struct Cluster::Mpi {};

Cluster::Cluster(ClusterOptions options) : deadline_(deadline_from_environment(options.deadline)) {
  const std::optional<int> launched = launched_size();
  TL_CHECK(!launched || *launched <= 1, NotSupported,
           "Cluster: this process was started as one of several MPI ranks, but towerlab was "
           "built without MPI (TOWERLAB_MPI=OFF); rebuild with MPI or run without mpirun");
}

Cluster::~Cluster() = default;

void Cluster::allreduce_sum(std::span<float>, std::string_view, ReduceFrame) {}
void Cluster::allreduce_sum(std::span<double>, std::string_view) {}
void Cluster::reduce_scatter_sum(std::span<float>, std::string_view, ReduceFrame) {}
void Cluster::allgather_chunks(std::span<float>, std::string_view, ReduceFrame) {}

void Cluster::broadcast(std::span<std::byte>, int root, std::string_view what) {
  TL_CHECK(root == 0, InvalidArgument,
           what << ": broadcast from rank " << root << " in a group of 1");
}

std::vector<std::string> Cluster::allgather(std::string_view mine, std::string_view) {
  return {std::string(mine)};
}

void Cluster::barrier(std::string_view) {}

#endif

Device Cluster::default_device() const {
  const int gpus = cuda_device_count();
  return gpus > 0 ? Device::cuda(local_rank_ % gpus) : Device::cpu();
}

}  // namespace towerlab
