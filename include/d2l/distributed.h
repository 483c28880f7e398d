#pragma once

// d2l::distributed (link d2l::distributed, which brings d2l::train; built
// with D2L_BUILD_DISTRIBUTED, on by default where the Gloo headers are
// found): data-parallel training of
// the library's models on LibTorch's own distributed engine, c10d.
//
//   * `init_process_group`: a c10d Gloo group (NCCL for CUDA where the build
//     has it) from a TCP or file rendezvous, with a timeout and errors that
//     say which rank did what;
//   * `broadcast_parameters`: every rank starts from rank 0's weights;
//   * `GradientReducer`: gradients all-reduced in buckets, each launched from
//     an autograd hook as soon as its last gradient is computed, so that
//     communication overlaps the rest of the backward pass;
//   * `train_seq2seq`: the book's training loop, each rank on its share of
//     every batch, only rank 0 printing and calling the callbacks;
//   * `LaunchOptions`, `spawn_local`: the launcher (command-line flags or
//     torchrun's environment variables; N local processes on loopback).
//
// The group type is c10d's: `c10d::ProcessGroup` on LibTorch 1.x and
// `c10d::Backend` (what `ProcessGroupGloo` and `ProcessGroupNCCL` derive
// from) on 2.x, so a group made by other code works as well.

#include <d2l/encoder_decoder.h>
#include <d2l/nmt_data.h>
#include <d2l/torch_version.h>
#include <d2l/train.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#if D2L_TORCH_VERSION_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace d2l::distributed {

#if D2L_TORCH_VERSION_AT_LEAST(2, 0)
using Group = ::c10d::Backend;
#else
using Group = ::c10d::ProcessGroup;
#endif
using GroupPtr = c10::intrusive_ptr<Group>;

/// Who this process is and where the others meet. `from_environment()` reads
/// torchrun's variables; `parse` takes the same from command-line flags.
struct LaunchOptions {
  /// Number of processes in the group (1: no group at all).
  TORCH_ARG(int64_t, world_size) = 1;
  /// This process's rank, in [0, world_size).
  TORCH_ARG(int64_t, rank) = 0;
  /// "ADDR:PORT" of the TCP store: rank 0 hosts it there, unless
  /// `agent_store`.
  TORCH_ARG(std::string, master) = "";
  /// The store at `master` is hosted by the launcher (spawn_local, or
  /// torchrun's agent), and rank 0 is one of its clients. Set from torchrun's
  /// TORCHELASTIC_USE_AGENT_STORE=True.
  TORCH_ARG(bool, agent_store) = false;
  /// The TCPStore server's backend: "libuv" (LibTorch 2.3+ built with libuv),
  /// "classic", or "auto": libuv where this LibTorch can start it
  /// (tcp_store_backends()), else classic; a libuv server that fails is
  /// retried as classic within the timeout. USE_LIBUV=0/1 (PyTorch's
  /// variable) sets classic/libuv.
  TORCH_ARG(std::string, tcp_store) = "auto";
  /// A file every rank can reach (a shared file system), used instead of
  /// `master`. It must not exist before the first rank starts.
  TORCH_ARG(std::string, file_store) = "";
  /// How long the rendezvous and every collective may wait for another rank
  /// before this one gives up with an error.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// "gloo", "nccl" or "auto" (NCCL for a CUDA `device` when built with it).
  TORCH_ARG(std::string, backend) = "auto";
  /// `--spawn N` on the command line: start N local processes (spawn_local).
  TORCH_ARG(int64_t, spawn) = 0;

 public:
  /// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
  /// TORCHELASTIC_USE_AGENT_STORE (torchrun's names), USE_LIBUV (PyTorch's),
  /// and D2L_DIST_TIMEOUT_MS (1 ms to a year); variables that are not set
  /// keep the defaults. Malformed values throw c10::Error naming the variable.
  static LaunchOptions from_environment();

  /// Takes `--world-size N`, `--rank R`, `--master ADDR:PORT`,
  /// `--file-store PATH`, `--dist-timeout SECONDS`, `--backend NAME`,
  /// `--tcp-store NAME` and `--spawn N` out of `args` (the rest stay, in order), starting from
  /// `from_environment()`. A flag without a value or with a bad one throws
  /// c10::Error naming the flag and the value.
  static LaunchOptions parse(std::vector<std::string>& args);

  /// Whether this process is one of several (world_size > 1).
  bool distributed() const { return world_size_ > 1; }
  /// The flags that reproduce these options (for a child process).
  std::vector<std::string> to_args() const;
};

/// The TCPStore server backends this process's LibTorch can start, best
/// first: {"libuv", "classic"} or {"classic"} (found once, by starting a
/// server on a free loopback port).
std::vector<std::string> tcp_store_backends();

/// Whether this build of d2l::distributed can make NCCL groups (LibTorch 2.x
/// built with CUDA, and NCCL's headers found at build time).
bool nccl_available();

/// The group of `options`: a TCPStore at `master` (hosted by rank 0, or by
/// the launcher with `agent_store`) or a
/// FileStore, then a ProcessGroupGloo, or a ProcessGroupNCCL for a CUDA
/// `device` (backend "auto" or "nccl") where the build has NCCL. The socket
/// binds to loopback when `master` is a loopback address, to
/// GLOO_SOCKET_IFNAME when that is set, and else to this host's name, as
/// PyTorch does. Throws c10::Error naming the rank when the options are
/// inconsistent or not every rank joins within `timeout`.
GroupPtr init_process_group(const LaunchOptions& options, torch::Device device = torch::kCPU);

/// Copies rank `root`'s parameters and buffers into every other rank's
/// `module` (one broadcast per tensor). Throws c10::Error naming the rank and
/// the tensor when a collective fails.
void broadcast_parameters(torch::nn::Module& module, const GroupPtr& group, int64_t root = 0);

/// All-reduce of `values` (summed in place) with errors that name the rank
/// and `what`.
void all_reduce_sum(const GroupPtr& group, torch::Tensor& values, const std::string& what);

/// The rows [begin, end) of a batch of `batch_size` that `rank` of
/// `world_size` takes: contiguous, sizes differing by at most one, in rank
/// order (a rank may get none when the batch is smaller than the group).
std::pair<int64_t, int64_t> shard_range(int64_t batch_size, int64_t rank, int64_t world_size);

struct GradientReducerOptions {
  /// Largest bucket, in bytes; a parameter larger than that gets a bucket of
  /// its own. Smaller buckets start communicating earlier; each costs one
  /// collective's latency.
  TORCH_ARG(int64_t, bucket_cap_bytes) = 1 << 20;
  /// Divide the summed gradients by the world size (a loss averaged over the
  /// batch); false keeps the sum (a loss summed over the batch, as the
  /// book's train_seq2seq).
  TORCH_ARG(bool, average) = true;
};

/// Sums the gradients of `parameters` across the ranks of `group` during the
/// backward pass. Buckets are formed in reverse order of `parameters` (the
/// order in which backward usually computes them), split by device and dtype;
/// a hook on every parameter copies its gradient into its bucket, and a
/// bucket whose last gradient arrived is all-reduced at once, in bucket order
/// on every rank. Use:
///
///     reducer.prepare_for_backward();
///     loss.backward();
///     reducer.finalize();   // .grad now holds the reduced gradients
///
/// `finalize` launches the buckets of parameters that got no gradient (with
/// zeros), waits for all, and replaces every parameter's `.grad` with the
/// result. One backward pass per prepare/finalize pair: a second gradient of
/// the same parameter before `finalize` throws c10::Error. A failed or
/// timed-out collective throws c10::Error naming the rank and the bucket.
/// The hooks are removed when the reducer is destroyed.
class GradientReducer {
 public:
  GradientReducer(std::vector<torch::Tensor> parameters, GroupPtr group,
                  GradientReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  void prepare_for_backward();
  void finalize();

  int64_t num_buckets() const;
  /// How many buckets the last backward pass launched from its hooks, before
  /// `finalize` (the overlap actually obtained).
  int64_t launched_during_backward() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

/// The book's `train_seq2seq` on `group`: the same initialisation, optimiser,
/// loss and clipping as `d2l::train_seq2seq`, with each rank taking its
/// `shard_range` of every batch (every rank's `data_iter` must be the same,
/// with the same seed). Rank 0's initial weights are broadcast; gradients of
/// the summed loss are summed by a GradientReducer before clipping, so that
/// every step is the single-process step on the whole batch. Loss and token
/// counts are summed across ranks: every rank returns the same result. Only
/// rank 0 prints and calls `options`' callbacks (progress, the loss curve).
/// The loop is d2l::train_seq2seq's, run through a TrainSeq2SeqSync.
TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const GroupPtr& group, const TrainSeq2SeqOptions& options = {},
                                 int64_t bucket_cap_bytes = 1 << 20);
/// The same on the module holder.
TrainSeq2SeqResult train_seq2seq(const EncoderDecoder& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const GroupPtr& group, const TrainSeq2SeqOptions& options = {},
                                 int64_t bucket_cap_bytes = 1 << 20);

/// Writes `module`'s parameters and buffers with torch::save to `path`
/// through a temporary file in the same directory renamed into place, so
/// that a reader (or a crash) never sees a partial checkpoint.
void save_checkpoint(torch::nn::Module& module, const std::string& path);

struct SpawnOptions {
  /// The group's size; `first_rank`..`first_rank + num_local - 1` start here.
  TORCH_ARG(int64_t, world_size) = 2;
  TORCH_ARG(int64_t, first_rank) = 0;
  /// Processes to start here; 0: all of the group.
  TORCH_ARG(int64_t, num_local) = 0;
  /// "ADDR:PORT" where rank 0 hosts the store; empty: this process hosts it
  /// on a free loopback port for as long as the children run, and they all
  /// connect to it (LaunchOptions::agent_store).
  TORCH_ARG(std::string, master) = "";
  /// The backend of the store this process hosts (LaunchOptions::tcp_store).
  TORCH_ARG(std::string, tcp_store) = "auto";
  /// Each process's stdout and stderr go to DIR/rank-R.log; empty: inherited.
  TORCH_ARG(std::string, log_dir) = "";
  /// After the first process fails, how long the others may take to end on
  /// their own (their collective timeout) before they are killed.
  TORCH_ARG(std::chrono::milliseconds, grace) = std::chrono::seconds(90);
  /// Extra environment variables "NAME=VALUE" for the children.
  TORCH_ARG(std::vector<std::string>, env) = {};
};

/// What became of each spawned process.
struct SpawnResult {
  /// Exit status per local process (128 + signal for a killed one).
  std::vector<int> exit_codes;
  /// Processes killed after `grace` ran out.
  std::vector<int64_t> killed_ranks;
  /// 0 when every process exited with 0, else the first failure's status.
  int exit_code = 0;
};

/// Starts `program` with `args` once per local rank, each given
/// `--world-size`, `--rank`, `--master` (appended) and the same as RANK,
/// WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and
/// TORCHELASTIC_USE_AGENT_STORE=True when this process hosts the store), and
/// waits for all of them.
/// `program` empty: this executable.
SpawnResult spawn_local(const std::string& program, const std::vector<std::string>& args,
                        const SpawnOptions& options);

}  // namespace d2l::distributed
