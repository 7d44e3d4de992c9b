// NCCL on the emulated GPUs: the calls towerlab makes (parallel/nccl_allreduce.cpp,
// parallel/nccl_communicator.cpp, parallel/nccl_check.h), with NCCL's names, values
// and semantics, for ranks that are THREADS OF ONE PROCESS.
//
// Ranks. A unique id (ncclGetUniqueId) names a rendezvous in a process-wide table;
// each rank's thread calls ncclCommInitRank(Config) with it, or one thread makes
// every rank with ncclCommInitAll. An id carries the process that made it: one from
// another process (sent over MPI, say) fails with ncclInvalidUsage and a message,
// since ranks in several processes are not emulated. As in NCCL, each rank needs a
// device of its own (two ranks on one device: ncclInvalidUsage), an id makes one
// communicator, and one thread driving several ranks brackets its calls with
// ncclGroupStart / ncclGroupEnd (the calls are queued at ncclGroupEnd).
//
// All-reduce. ncclAllReduce queues one operation on the rank's stream. When every
// rank's operation has reached the front of its stream, the last one to arrive
// combines the ranks' send buffers element by element in rank order (0, 1, ..., in
// the datatype's own arithmetic; ncclAvg divides the sum by the rank count), and
// every rank copies the result into its receive buffer (in place allowed). So every
// rank holds the same bits, run to run; for two ranks they are a + b, as NCCL's ring
// gives.
//
// Reduce-scatter and all-gather, the all-reduce's two halves, with NCCL's buffer
// shapes and the same machinery. ncclReduceScatter(send, recv, recvcount, ...): every
// rank's send buffer holds nranks blocks of recvcount elements; they are combined
// element by element in rank order (0, 1, ..., as the all-reduce combines them, so an
// element's sum is the all-reduce's bits), and rank r receives block r.
// ncclAllGather(send, recv, sendcount, ...): rank r's sendcount elements become block r
// of every rank's receive buffer of nranks * sendcount elements (copies, no
// arithmetic). In place means NCCL's one form, the rank's own block of the larger
// buffer (reduce-scatter: recvbuff == sendbuff + rank * recvcount; all-gather:
// sendbuff == recvbuff + rank * sendcount); any other overlap is refused
// (ncclInvalidArgument), since NCCL would read values it has already overwritten.
// A real NCCL ring may add a block's terms starting at another rank than 0: with
// three ranks or more its bits can differ from these (with two, a + b either way).
//
// ThreadSanitizer sees the all-to-all ordering a collective makes between the
// participants' streams (each rank's result depends on every rank's input), and no
// other: the rendezvous table and the communicators' bookkeeping are invisible to it.
//
// Checks NCCL leaves to a hang or to garbage, each reported to every rank as an
// asynchronous error (ncclCommGetAsyncError; later calls on the communicator return
// it) with a message (ncclGetLastError, and a line "emulated NCCL: ..." on stderr):
//   - the ranks' calls differ (count, datatype, operation): ncclInvalidUsage, e.g.
//     "rank 1 called ncclAllReduce with count 10, rank 0 with count 12", or are
//     different collectives: "rank 1 called ncclAllGather (count 8, ncclFloat32),
//     rank 0 called ncclReduceScatter (count 8, ncclFloat32, ncclSum)";
//   - a rank does not arrive within the timeout: ncclSystemError naming the ranks
//     missing; the ranks that waited finish their operation, buffers unchanged;
//   - a rank aborted or destroyed its communicator while others wait for it:
//     ncclRemoteError.
// The timeout is TOWERLAB_EMULATED_NCCL_TIMEOUT_S seconds (default 60; fractions
// allowed), or tlemu::set_nccl_timeout; it also bounds ncclCommInitRank's wait for
// the other ranks. None of these leaves a sticky CUDA error on the device (a stalled
// NCCL kernel does not either). Blocking communicators wait in the call;
// non-blocking ones (config.blocking = 0) return ncclInProgress from initialization
// and finalization and report completion through ncclCommGetAsyncError. Collectives
// are queued at once on either kind, so their calls and ncclGroupEnd return
// ncclSuccess.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>

#define NCCL_MAJOR 2
#define NCCL_MINOR 23
#define NCCL_PATCH 4
#define NCCL_SUFFIX "-towerlab-emulated"
#define NCCL_VERSION(X, Y, Z) \
  ((X) <= 2 && (Y) <= 8 ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

// ncclFloat16 and ncclBfloat16 are gathered (ncclAllGather copies them); their
// reductions are not emulated (ncclInvalidArgument).
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

// NCCL's fields in NCCL's order; only `blocking` and `commName` change anything here.
typedef struct ncclConfig_v21700 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                         \
  {                                                                                     \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT             \
  }

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);

// Rank `rank` of `nranks` on the current device. Blocking: returns once every rank has
// joined (or the timeout has passed: ncclSystemError, *comm null).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
// ndev ranks, rank i on devlist[i] (devices 0..ndev-1 when devlist is null).
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
// Waits for the communicator's queued operations (non-blocking: ncclInProgress).
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// Ends the communicator at once: its operations waiting for other ranks finish (the
// buffers unchanged), the other ranks' collectives that wait for it fail.
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

const char* ncclGetErrorString(ncclResult_t result);
// The last error's message: the communicator's, else the calling thread's ("" if none).
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);

// Rank r receives block r (recvcount elements) of the ranks' send buffers (nranks *
// recvcount elements each) combined in rank order.
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
// Block r (sendcount elements) of every rank's recvbuff (nranks * sendcount) := rank r's
// sendbuff.
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
