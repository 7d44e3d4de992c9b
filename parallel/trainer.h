// The multi-device trainer: tower parallelism as TensorFlow 1.x's multi-GPU
// examples build it in a graph (cifar10_multi_gpu_train.py), done natively. The
// user writes one tower function: given a Tower (its index, device, tape and its
// replica of the shared variables) and its slice of the batch, it builds the
// forward pass and returns the loss, the outputs and values to log. A step runs
// these phases, one private function each, in this order (Trainer::run):
//   1. split: the batch among the towers (sizes differ by at most one; nothing dropped);
//   2. run towers: each on its own thread and stream with its own tape: forward, and
//      backward with the loss weighted by the tower's share of the samples;
//   3. reduce gradients: ring all-reduce of the flat gradient buffers (with gradient
//      buckets, during phase 2 instead: the same bits);
//   4. average moving statistics: by the batch-norm policy;
//   5. reduce across processes: with a ProcessGroup only;
//   6. guard: NaN and infinity in the loss and the gradient (NumericGuard; under
//      fp16 also the loss scale's overflow check, LossScale);
//   7. update and broadcast: the gradient unscaled (fp16) and clipped, the optimizer
//      on the master, new values to every replica;
//   8. gather outputs: outputs in the input's order, the mean loss, the logs.
// So N towers, and P processes of M towers, take the same step as one device on
// the whole batch, to float rounding. docs/trainer.md tells the whole story,
// docs/processes.md what changes across processes (step() and evaluate() are then
// collective: every rank calls them in the same order with the same global batch).
//
// Memory ordering: the master is updated on the trainer's master stream, and the
// constructor, step() and broadcast() return only once that stream has finished,
// so the master's values, gradients and optimizer slots may then be read or written
// from any stream of their device with no event to wait for; writes from outside
// must be complete before the next step() or broadcast().
//
// Every tower is on the host or every tower is on GPUs (a mix is NotSupported: the
// ring copies between neighbours on one tower's stream). The master may be on
// either; by default it is on the first tower's device. Or it is sharded across
// the towers (MasterPlacement::Sharded, docs/master_placement.md): phase 3 is then
// the ring's reduce-scatter, and phase 7 each tower's update of its slice followed
// by the ring's all-gather; the same bits as a master on one device.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/checkpoint.h"
#include "../autograd/context.h"
#include "../autograd/optimizer.h"
#include "../autograd/tape.h"
#include "../autograd/variables.h"
#include "batch_split.h"
#include "cross_process_path.h"
#include "precision.h"

namespace towerlab {

// The trainer's parts, defined where it is built (parallel/trainer.cpp): an
// embedding program includes none of them.
class BucketReducer;
class NcclAllReduce;
class NcclCommunicator;
class ProcessExchange;
class ProcessGroup;
class Ring;
class ShardedMaster;
class ShardedNccl;
class ThreadTeam;
class Trace;

// What a tower function sees.
struct Tower {
  int index;
  Device device;
  const Stream& stream;
  Tape& tape;
  VariableStore& variables;
  bool training;
  std::int64_t batch_size;  // samples in this tower's slice (> 0: empty towers are not run)
  BatchNormSync* batchnorm_sync = nullptr;  // set when batch norm is synchronized
  // Where this slice sits in the run, for ops that draw random numbers per sample
  // (dropout, kernels/dropout.h): its first sample's index in the whole batch (of
  // every process), the number of steps taken before this one, and the run's seed.
  std::int64_t first_sample = 0;
  std::int64_t step = 0;
  std::uint64_t seed = 0;

  Context context() const {
    return Context{tape, variables, training, batchnorm_sync, index, first_sample, step, seed};
  }
  Var variable(const std::string& name) const { return context().variable(name); }
  // A slice tensor as a constant on this tower's tape.
  Var input(const Tensor& t, std::string name = "input") const {
    return tape.constant(t, std::move(name));
  }
};

// What a tower function returns.
struct TowerResult {
  Var loss;                         // required: the tower's total loss (one element)
  std::vector<Var> outputs;         // optional: each [n_i, ...], concatenated over towers
  std::map<std::string, Var> logs;  // optional: scalars to log, from the last non-empty tower
};

// `batch` is a list of tensors sharing their first dimension (images, labels, ...);
// the tower receives rows [begin, end) of each, on its device.
using TowerFn = std::function<TowerResult(const Tower& tower, const std::vector<Tensor>& batch)>;

// Ring: towerlab's ring all-reduce (any devices, virtual ones included).
// ReduceToOne: gather to one device, sum and broadcast (the average_gradients of
// TensorFlow's multi-GPU examples), for comparison.
// Nccl: NCCL's all-reduce, for comparison; one tower per physical GPU, two or more.
enum class AllReduce { Ring, ReduceToOne, Nccl };
enum class BatchNormStats { Average, Tower0 };
// Local: each tower normalizes its own slice (as tf.layers.batch_normalization in a
// tower does, and most frameworks).
// Sync: per-channel statistics are combined across towers in the forward and the
// backward pass, weighted by each tower's real sample count, so N towers normalize
// exactly as one device on the whole batch.
enum class BatchNormMode { Local, Sync };
// What a training step does when its loss or its averaged gradient holds a NaN or
// an infinity. The check reads the flat gradient once on the device that holds it
// after the all-reduce and brings one index back to the host.
//   Stop (the default): throw NumericError naming the global step, the loss of
//        every tower and the first variable whose gradient is not finite, with the
//        element and its value. Nothing is updated: the variables, the moving
//        statistics and the optimizer's state stay as they were before the step,
//        so the trainer is usable (e.g. to skip the batch, or lower the rate).
//   Skip: the same check; the step changes nothing, StepResult::skipped says so,
//        a warning with the same description goes to the log, and
//        Trainer::skipped_steps() counts it. Training goes on with the next batch.
//   Off:  no check; non-finite values flow into the variables.
enum class NumericGuard { Stop, Skip, Off };
// Where the master variables and the optimizer's slots live (docs/master_placement.md).
//   OneDevice: all of them on TrainerOptions::master.
//   Sharded: tower k holds the FP32 master values and the optimizer's slots of one
//     slice of the flat buffer (the chunk the ring's reduce-scatter sums at tower
//     k, parallel/sharded_master.h) on its own device, and updates it on its own
//     stream; the ring's all-gather carries the new values to every tower. Each
//     device holds 1/N of the slots, the traffic is an all-reduce's, and the bits
//     are OneDevice's. Needs AllReduce::Ring and TrainerOptions::master unset
//     (InvalidArgument). Across processes the job's towers own a slice each, and
//     the slices' sums and new values travel through the host (the processes'
//     reduce-scatter and all-gather) or, on NCCL, through tower 0's device buffers
//     (ncclReduceScatter and ncclAllGather, parallel/sharded_nccl.h). master(),
//     optimizer() and the checkpoints see a host copy gathered on demand (see
//     Trainer::master()); across processes optimizer() is then a collective call
//     (every process makes it, as save_state), and gradients() holds the summed
//     gradient in this process's slices only.
enum class MasterPlacement { OneDevice, Sharded };

struct TrainerOptions {
  std::vector<Device> devices{Device::cpu()};  // one tower each; repeats are virtual devices
  // Where the master variables live; by default the first tower's device (as
  // placed), so GPU towers keep the update and the broadcast on the GPU.
  std::optional<Device> master;
  MasterPlacement master_placement = MasterPlacement::OneDevice;
  AllReduce reduction = AllReduce::Ring;
  BatchNormStats batchnorm_stats = BatchNormStats::Average;
  BatchNormMode batchnorm = BatchNormMode::Local;
  // A device that is not present: an error listing those that are (false), or a
  // warning and the first available device of the same kind, else the CPU (true).
  bool soft_placement = false;
  // Prints where every variable and each tower's work is placed.
  bool log_placement = false;
  std::ostream* log = nullptr;  // placement log and warnings; std::clog when null
  std::uint64_t seed = 0;       // initial values of the variables, and dropout's masks
  NumericGuard numeric_guard = NumericGuard::Stop;
  // The processes that train this model together (not owned; it must outlive the
  // trainer); nullptr: this process alone. See the top of this file.
  ProcessGroup* process_group = nullptr;
  // Gradient buckets (parallel/buckets.h), with AllReduce::Ring: the flat gradient
  // is cut into ranges of at least this many bytes (in reverse declaration order),
  // each reduced (within the process, then across processes) as soon as every
  // tower's backward has completed it, while the backward of earlier layers goes
  // on. 0, or at least the whole gradient, gives one bucket: the gradient reduced
  // after the backward. Either way the step gives the same bits. Every process must
  // use the same value. 25 MiB, as PyTorch's DDP: each bucket costs a fixed
  // latency (a ring of 2(n-1) synchronized steps, across processes one more call
  // with its arrival messages), which only large buckets amortize; a model with
  // less gradient (FashionNet has 1.7 MB) stays one bucket.
  std::int64_t bucket_bytes = std::int64_t(25) << 20;
  // How phase 5 moves the gradient and moving statistics between processes: NCCL
  // on tower 0's device buffers when it can (Auto), or always staged on the host.
  // Decided once, at construction; the placement log says which and why.
  CrossProcessPath cross_process = CrossProcessPath::Auto;
  // Clipping by the global norm (PyTorch's clip_grad_norm_), at the start of phase
  // 7: with c > 0, when the averaged gradient's norm |g| (over every trainable
  // value) exceeds c, the whole gradient is scaled by c / (|g| + 1e-6) before the
  // update. |g| is computed once per step, from the sums of squares of the sharded
  // master's slices (of every process) added in their order on the host, whatever
  // the placement, so the master on one device, a sharded master and every process
  // see the same bits; the step reports it (StepResult::grad_norm). 0: off.
  // Negative or not finite: InvalidArgument.
  double clip_grad_norm = 0.0;
  // The precision policy (parallel/precision.h, docs/precision.md). Fp32: today's
  // float32, bit for bit. Bf16: the GEMM-class ops multiply bfloat16 with float32
  // sums, each tower rounding its replica once per step; the master, the optimizer's
  // slots, the gradients and everything between the towers stay float32. Fp16: the
  // same with float16, and dynamic loss scaling (LossScale, parallel/precision.h):
  // a step whose scaled gradient overflows is skipped on every tower and process,
  // whatever numeric_guard says (Off included: the loss scale needs the gradient's
  // check; numeric_guard still decides what a non-finite loss does). Tf32: float32
  // tensors, the matmul/linear GEMMs and the convolutions (grouped ones excepted) on
  // CUDA's TF32 tensor cores, Fp32's bits on CPU towers. Every process must use the same; a
  // checkpoint restores under any precision.
  Precision precision = Precision::Fp32;
  // Fp16: the clean steps in a row after which the loss scale doubles (GradScaler's
  // growth_interval); at least 1.
  std::int64_t loss_scale_growth_interval = LossScale::kGrowthInterval;
  // What the gradient's reduction carries between towers and processes
  // (parallel/ring_contributions.h, docs/precision.md). Float32: the ring's partial
  // sums, as always. BFloat16: each tower's gradient rounded to bfloat16 once and
  // the contributions summed in float32 in tower order (then, across processes,
  // each process's sum rounded once and summed in rank order): half the bytes in
  // the reduce-scatter, 3/4 in an all-reduce. Needs AllReduce::Ring and, across
  // processes, host staging (NotSupported otherwise: NCCL's reductions sum
  // partial sums in an order of their own). Moving statistics stay float32. Any
  // other dtype: NotSupported. Every process must use the same.
  DType reduce_dtype = DType::Float32;
};

struct StepResult {
  double loss = 0.0;  // sample-weighted mean of the towers' losses (every rank's)
  // Per output: this process's towers' rows in input order, on the CPU: rows
  // [slices.front().begin, slices.back().end) of the batch (all of it without a
  // ProcessGroup; none on a rank without samples).
  std::vector<Tensor> outputs;
  std::map<std::string, double> logs;  // this process's last non-empty tower's log values
  std::int64_t samples = 0;            // in the (global) batch
  std::vector<TowerSlice> slices;      // this process's towers' slices of the batch
  // Nothing was updated: NumericGuard::Skip found a NaN or infinity, or (fp16) the
  // scaled gradient overflowed.
  bool skipped = false;
  // Fp16: the factor this step's gradient seed was multiplied by, and whether the
  // scaled gradient held an infinity or NaN (the step skipped, the scale halved for
  // the next: Trainer::loss_scale()). 1 and false in other precisions and evaluation.
  double loss_scale = 1.0;
  bool overflow = false;
  // The averaged gradient's global norm before clipping, with
  // TrainerOptions::clip_grad_norm set (0 otherwise, and in evaluation).
  double grad_norm = 0.0;
};

class Trainer {
 public:
  Trainer(const VariableSet& variables, TowerFn tower_fn, Optimizer optimizer,
          TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One training step on `batch` (CPU or any device; see TowerFn).
  StepResult step(const std::vector<Tensor>& batch);
  // A forward pass in inference mode (moving statistics, no gradients, no update):
  // the loss, outputs and logs.
  StepResult evaluate(const std::vector<Tensor>& batch);

  // What the last step left.
  double loss() const { return last_loss_; }       // of the last step
  const Tensor& gradients() const;                 // the averaged flat gradient (master)
  Tensor gradient(const std::string& name) const;  // one variable's averaged gradient
  // The non-trainable variables each step updates (batch-norm moving statistics).
  std::vector<std::string> updated_variables() const;
  const std::map<std::string, double>& tower_log() const { return last_logs_; }
  // Steps that NumericGuard::Skip left out (not the loss scale's overflow skips).
  std::int64_t skipped_steps() const { return skipped_steps_; }
  // Fp16: the next step's loss scale and the clean steps since it last changed.
  const LossScale& loss_scale() const { return loss_scale_; }

  // The master variables; complete whenever no trainer call is running (see the top).
  // Sharded (MasterPlacement::Sharded): a copy on the host, gathered from the
  // towers' slices on the first call after a step (values and the averaged
  // gradient; the moving statistics are kept there whole); writes to it reach the
  // slices and the replicas at broadcast() (restore_state and a checkpoint load
  // followed by broadcast(), as always), and are lost at the next step without it.
  VariableStore& master();
  const VariableStore& master() const;
  // Tower i's copy of the variables (equal to the master's after every step). CPU
  // towers of a master on the host, not sharded, share one memory: their values
  // are views of the master's (VariableStore::shares_values_with), so a write to
  // the master's values is theirs at once; the rest of this contract holds as is.
  // A replica's gradient is the trainer's working memory: after a step tower 0's
  // holds the averaged gradient (the towers' weighted sum) and, where phase 3
  // reduces to tower 0 (those CPU towers, Ring::reduce), the others partial sums;
  // gradients() is the master's copy of the average. In one memory the update
  // takes the average from tower 0 by trading buffers (VariableStore::swap_grads),
  // so after a step that updated, tower 0's holds the master's previous one.
  const VariableStore& replica(std::size_t i) const;
  // The stream the master's initialization, gradient copy, update and broadcast run
  // on. Work a caller submits to it runs before the next update. Sharded: the host
  // copy's stream (the updates run on the towers' streams).
  const Stream& master_stream() const { return *master_stream_; }
  // The optimizer: its hyper-parameters, step count and slots. Sharded: its slots
  // are gathered from the towers on the first call after a step, into the host
  // copy (released at the next step), and reach the towers at broadcast(). Across
  // processes that first call is collective (every process makes it); steps() and
  // learning_rate() read the same without gathering anything.
  Optimizer& optimizer();
  // Updates applied so far, and the learning rate of the next one.
  std::int64_t steps() const { return steps_taken(); }
  double learning_rate() const;
  MasterPlacement master_placement() const { return options_.master_placement; }
  // What holds master values and optimizer slots, and how many bytes of each.
  struct MasterMemory {
    std::string holder;  // "master", "tower 0", ..., "host copy" (sharded)
    Device device;
    std::int64_t value_bytes = 0;  // FP32 master values
    std::int64_t slot_bytes = 0;   // the optimizer's slots (none before the first step)
  };
  std::vector<MasterMemory> master_memory() const;
  const std::vector<Device>& devices() const { return devices_; }
  std::size_t num_towers() const { return devices_.size(); }

  // Copies the master's values (and state) to every replica: after a checkpoint load.
  // Returns when the copies (and all earlier work on the master stream) are done.
  void broadcast();

  // The whole training state, for resuming a run exactly (parallel/trainer_state.cpp):
  // the master variables (moving statistics included), the optimizer's slots and
  // step count (so the learning-rate schedule's position), the numeric guard's
  // skipped steps, under fp16 the loss scale and its clean steps, and the
  // fingerprint of what changes a step. Nothing else changes
  // between steps: the initial values are drawn once from the seed, and no op draws
  // random numbers after that. `metadata` is the caller's own position (epoch, batch
  // in the epoch, ...). Collective with a process group, like save_checkpoint
  // (parallel/collective_checkpoint.h): rank 0 writes the file atomically and every
  // rank returns or throws alike.
  void save_state(const std::string& path, const std::map<std::string, std::string>& metadata = {});
  // Restores what save_state wrote and copies it to every replica; returns the file's
  // metadata in CheckpointInfo. A truncated or malformed file is an IoError before
  // anything changes; one whose data fails its checksum is an IoError after the load
  // (restore another, or start over). Refused before anything changes (InvalidArgument
  // naming the first difference) when the file's fingerprint differs in what changes
  // a step (the variables, the optimizer and its schedule, batch norm, the numeric
  // guard, the seed) or its metadata differs from `expected` (the caller's
  // step-changing options, e.g. the global batch). The towers, the processes, the
  // master's device, the reduction, the buckets and the precision may differ (with local batch norm
  // not the job's tower count: each tower normalizes its own slice): the steps then
  // agree with the uninterrupted run's to float rounding instead of bit for bit.
  CheckpointInfo restore_state(const std::string& path,
                               const std::map<std::string, std::string>& expected = {});
  // What restore_state compares: the fingerprint without the layout (see above).
  std::string state_fingerprint() const;
  // Records the next steps in `trace` (nullptr stops recording).
  void set_trace(Trace* trace);

 private:
  struct TowerState;
  // A step (training) or an evaluation: the phases below, in order. Their numbers
  // and names are parallel/trainer_phases.h's.
  StepResult run(const std::vector<Tensor>& batch, bool training);
  // 1. The batch checked and split among the ranks and this rank's towers.
  StepResult split(const std::vector<Tensor>& batch) const;
  // 2. Every tower's forward (and backward) on its own thread; then (read_losses,
  // called after 3 and 4 are queued) their losses into losses_.
  void run_towers(const std::vector<Tensor>& batch, const std::vector<TowerSlice>& slices,
                  bool training);
  void read_losses(const std::vector<TowerSlice>& slices);
  // The sample-weighted mean of every rank's towers' losses (losses_).
  double mean_loss(std::int64_t samples) const;
  // 3. The towers' flat gradients summed (options_.reduction).
  void reduce_gradients();
  // 4. The moving statistics per options_.batchnorm_stats.
  void average_moving_statistics(const StepResult& result);
  // 5. One allreduce_sum over the processes of exchange_'s buffer (see
  // parallel/process_exchange.h); with nccl_processes_, the gradient and statistics
  // go in an NCCL call after it. Sharded: the gradient's part reduce-scattered, the
  // rest all-reduced (parallel/sharded_master.h).
  void reduce_across_processes(const StepResult& result, bool training);
  // Sharded: every tower's ring chunk of its flat gradient into `gradient` (host,
  // or tower 0's), which then holds the process's summed gradient.
  void stage_ring_chunks(const Tensor& gradient) const;
  // 5 on NCCL, after the host call: the gradient all-reduced, or (sharded)
  // reduce-scattered with each tower's slice read back; the statistics all-reduced.
  void reduce_on_nccl(const std::string& step);
  // More than one gradient bucket: phase 3 runs on the reducer thread.
  bool bucketed() const { return buckets_ != nullptr; }
  // The reducer thread of a bucketed step (see phase 3).
  void reduce_buckets();
  // 6. NumericGuard, and under fp16 the loss scale's check and update: true when
  // the update may go ahead; Stop throws, Skip and an overflow mark `result`
  // skipped and put the replicas back to the master's state.
  bool guard(StepResult& result);
  // 7. The optimizer on the master, then the master copied to every replica.
  // Sharded: each tower's slice updated on its stream, then the ring's all-gather.
  void update_and_broadcast();
  void update_slices_and_gather();
  // broadcast(), whose rounding of the one working copy (one memory) is left out
  // when the update wrote it already (`working_rounded`).
  void broadcast_values(bool working_rounded);
  // 7 begins with the gradient unscaled (fp16: times 1 / the loss scale) and
  // clipped by the global norm (TrainerOptions::clip_grad_norm): returns the
  // averaged gradient's norm, having scaled it when the norm exceeds the limit.
  double unscale_and_clip_gradients();
  // The averaged gradient times `coefficient` where it is held: tower 0's flat
  // gradient, or (sharded) each tower's slice.
  void scale_gradients(double coefficient);
  // Sharded across processes: the towers' new slices into the host copy, every
  // process's gathered into it (ProcessGroup::allgather_chunks), then to every replica.
  void gather_across_processes();
  // Its twin on NCCL (parallel/sharded_nccl.h).
  void gather_on_nccl();
  bool sharded() const { return shards_ != nullptr; }
  // Updates applied so far (the optimizer's, or the shards').
  std::int64_t steps_taken() const;
  // Sharded: the host copy's values and averaged gradient, and the optimizer's
  // slots, brought up to date with the slices when a step has moved them.
  void gather_values() const;
  // Across processes a collective call: every process's slots are gathered.
  void gather_slots();
  // The first non-finite element of the averaged flat gradient and its value, or
  // {-1, 0}: tower 0's whole gradient, or (sharded) each tower's slice, the
  // smallest index of every process's (a collective call across processes).
  std::pair<std::int64_t, float> first_nonfinite_gradient() const;
  // 8. The outputs in input order and the last non-empty tower's logs.
  void gather_outputs(StepResult& result) const;
  // Tower i's forward (and backward) on its own thread. A stand-in (`is_stand_in`) runs its rows
  // only to make the synchronized batch-norm calls of a rank without samples: its
  // loss, gradient and outputs count for nothing (run_towers).
  void run_tower(std::size_t i, const std::vector<Tensor>& batch, const TowerSlice& slice,
                 bool training, BatchNormSync* sync, bool is_stand_in);
  void check_batch(const std::vector<Tensor>& batch) const;
  // The reduced loss, and the reduced gradient, against NumericGuard: "" when
  // finite, else what is not (the tower losses; the first variable and element).
  std::string nonfinite_loss(const StepResult& result) const;
  std::string nonfinite_gradient() const;
  // The constructor's fingerprint comparison across the process group.
  void check_processes_agree() const;
  void log_placement() const;
  std::ostream& log() const;

  const VariableSet& variables_;
  TowerFn tower_fn_;
  Optimizer optimizer_;
  TrainerOptions options_;
  std::vector<Device> devices_;
  Device master_device_;
  std::unique_ptr<Stream> master_stream_;
  std::unique_ptr<VariableStore> master_;
  std::vector<std::unique_ptr<TowerState>> towers_;
  std::unique_ptr<Ring> ring_;
  // The gradient's ring when it carries bfloat16 contributions (reduce_dtype);
  // null: ring_ (float32). Moving statistics and all-gathers of values take ring_.
  std::unique_ptr<Ring> contribution_ring_;
  std::unique_ptr<NcclAllReduce> nccl_;
  std::unique_ptr<ThreadTeam> workers_;  // one thread per tower
  Trace* trace_ = nullptr;
  double last_loss_ = 0.0;
  std::map<std::string, double> last_logs_;
  std::int64_t skipped_steps_ = 0;
  LossScale loss_scale_;
  int rank_ = 0, ranks_ = 1;  // in options_.process_group
  // The last step's loss of every tower of every rank, [rank * towers + tower]; 0
  // for an empty tower. Filled by run_towers, summed over the ranks in phase 5.
  std::vector<float> losses_;
  // The gradient buckets and their reducer (parallel/buckets.h); null when the
  // gradient is one bucket (unbucketed).
  std::unique_ptr<BucketReducer> buckets_;
  // The reducer makes each bucket's cross-process call (see the top).
  bool buckets_across_processes_ = false;
  // Phase 5's buffer and its layout; null without a process group.
  std::unique_ptr<ProcessExchange> exchange_;
  // Phase 5's device-buffer path between processes; null: staged on the host.
  std::unique_ptr<NcclCommunicator> nccl_processes_;
  std::string cross_process_path_;  // why phase 5 takes its path (placement log)
  // MasterPlacement::Sharded: the towers' slices; master_ is then the host copy,
  // and these say whether it (values, gradient) and optimizer_'s slots hold the
  // slices' state or a step has moved them since.
  std::unique_ptr<ShardedMaster> shards_;
  // Sharded across processes on NCCL (parallel/sharded_nccl.h); null otherwise.
  std::unique_ptr<ShardedNccl> shards_nccl_;
  // The length of the host-staged exchange buffer, whose ring frames the slices
  // across processes on either path (sharded_slices()); 0 for one process.
  std::int64_t slices_frame_ = 0;
  mutable bool values_gathered_ = true;
  bool slots_gathered_ = true;
  // CPU towers of a master on the host, not sharded: one memory, so the replicas'
  // values are the master's and their working copy one, tower 0's, rounded by the
  // update as it writes the values (Optimizer::step's rounded copy), elsewhere in
  // broadcast() (VariableStore::share_values): phase 7 copies no values. The
  // master keeps a gradient of its own: the one its last update applied, which a
  // skipped step leaves as it was in every placement.
  bool one_memory_ = false;
};

// Resolves a requested device: itself when present; with soft placement, the
// first present device of its kind (else the CPU) and a warning on `log`;
// without it, DeviceError listing the devices present.
Device place_device(Device requested, bool soft_placement, std::ostream& log);

}  // namespace towerlab
