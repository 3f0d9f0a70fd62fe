// The communicator interface SyncBatchNorm is built on, and the in-process engine.
//
// detops needs one collective: an all-gather of a few bytes per rank, in rank order. It never
// asks an engine to reduce floating-point numbers, so results do not depend on the algorithm an
// engine picks (ring, tree, NVLS, ...): every rank receives the same bytes and merges them itself
// in rank order. Engines:
//   ThreadGroup        ranks are threads of one process (tests, one process driving several GPUs)
//   MpiCommunicator    detops/mpi.h, CPU ranks over MPI (optional component detops::mpi)
//   NcclCommunicator   detops/nccl.h, CUDA ranks over a caller-owned ncclComm_t (detops::nccl)
// A caller may implement Communicator over any other engine (gloo, a framework's process group).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "detops/tensor.h"

namespace detops {

class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank, in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks (>= 1).
  virtual int size() const = 0;
  /// Gathers `bytes` bytes from every rank into `recv` (size() * bytes), rank r's bytes at offset
  /// r * bytes. Every rank calls it with the same `bytes`. With device == Device::cpu() both
  /// buffers are host memory and the call returns when `recv` is complete; with a CUDA device both
  /// are that device's memory and the work is ordered on `cuda_stream` (only engines that return
  /// true from accepts_device_memory() are given device memory). Failures and timeouts throw
  /// detops::Error (kCommunication).
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, Device device, void* cuda_stream) = 0;
  /// Whether all_gather takes device memory. For engines that do not, detops stages device data
  /// through host memory (a copy each way and one wait on the op's stream).
  virtual bool accepts_device_memory() const { return false; }
  /// Engine name for messages, e.g. "thread-group", "mpi", "nccl".
  virtual const char* name() const = 0;

  /// The sequence number of the next detops collective op on this communicator (1, 2, ...). Ops
  /// that check rank agreement send it in their header, so a rank that skipped or added a call is
  /// reported instead of pairing its data with another layer's.
  std::uint64_t next_sequence() { return ++sequence_; }
  std::uint64_t sequence() const { return sequence_; }

 private:
  std::uint64_t sequence_ = 0;
};

/// Ranks as threads of one process. Create one ThreadGroup for `size` ranks, then give each
/// thread its communicator(rank). An all-gather waits at most `timeout` for the other ranks; on
/// a timeout, or after abort(), every waiting and later call on any rank throws
/// detops::Error(kCommunication) naming the ranks that did not arrive (no hang).
class ThreadGroup {
 public:
  explicit ThreadGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const;
  /// The communicator of `rank`; it refers to this group, which must outlive it. Device buffers
  /// are staged through the host by the op (accepts_device_memory() is false).
  std::unique_ptr<Communicator> communicator(int rank);
  /// Makes every pending and future all_gather of the group throw (a rank that failed outside
  /// detops can call it so the others do not wait for the timeout).
  void abort(const std::string& reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace detops
