// MpiCommunicator: detops collectives (SyncBatchNorm) over MPI, for CPU ranks. Optional component:
// link detops::mpi (built when CMake finds MPI; DETOPS_MPI=AUTO/ON/OFF) and call MPI_Init first.
//
//   MPI_Init(&argc, &argv);
//   {
//     detops::MpiCommunicator comm(MPI_COMM_WORLD);   // duplicates MPI_COMM_WORLD
//     detops::sync_batch_norm_forward(x, params, y, save_mean, save_invstd, &comm);
//   }                                                  // destroy it before MPI_Finalize
//   MPI_Finalize();
//
// Determinism: the only collective is MPI_Allgather of bytes, which moves data and computes
// nothing, so results do not depend on the MPI implementation, its algorithm choices (Open MPI's
// coll/tuned or coll/han, Intel MPI's I_MPI_ADJUST_*) or the network: the ranks merge what they
// gather themselves, in rank order.
//
// Failures: an MPI error is returned, not fatal, on the communicator's duplicate
// (MPI_ERRORS_RETURN) and thrown as detops::Error(kCommunication) with MPI_Error_string's text.
// MPI has no timeouts: a rank that never calls the collective leaves the others waiting, and a rank
// that dies is handled by the launcher (mpirun ends the job when a process exits without
// MPI_Finalize). SyncBnOptions::check_ranks turns disagreements between live ranks (channels,
// dtype, mode, invalid arguments on one rank) into errors on every rank instead.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>

#include "detops/communicator.h"

namespace detops {

class MpiCommunicator final : public Communicator {
 public:
  /// Largest message MPI_Allgather is given at once: counts are int. Larger all-gathers are sent
  /// in pieces of at most this many bytes per rank.
  static constexpr std::size_t kMaxMessageBytes = static_cast<std::size_t>(INT_MAX);

  /// Duplicates `comm` (MPI_Comm_dup, collective over comm: every rank of comm constructs its
  /// MpiCommunicator together) so that detops' messages can never match the caller's, and sets
  /// MPI_ERRORS_RETURN on the duplicate. rank() and size() are those of comm. MPI must be
  /// initialized; a failure of the duplication itself is handled by comm's error handler (by
  /// default fatal) and, if it returns, thrown as Error(kCommunication). Throws
  /// Error(kInvalidArgument) if MPI is not initialized (or already finalized) or comm is
  /// MPI_COMM_NULL. `max_message_bytes` (>= 1) lowers the piece size of large all-gathers; tests
  /// use it to exercise that path on small messages.
  explicit MpiCommunicator(MPI_Comm comm, std::size_t max_message_bytes = kMaxMessageBytes);
  /// Frees the duplicate (unless MPI is already finalized). Destroy it before MPI_Finalize.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// MPI_Allgather of MPI_BYTE on host memory (device must be Device::cpu(); detops stages
  /// device data through the host itself, since accepts_device_memory() is false). Blocks until
  /// recv is complete. Calls from several threads at once need MPI_THREAD_MULTIPLE and distinct
  /// MpiCommunicators (MPI orders collectives per communicator). Throws Error(kInvalidArgument)
  /// for device memory, Error(kCommunication) when MPI reports an error.
  void all_gather(const void* send, void* recv, std::size_t bytes, Device device, void* cuda_stream) override;
  bool accepts_device_memory() const override { return false; }
  const char* name() const override { return "mpi"; }

  /// The duplicated communicator detops uses (owned by this object).
  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t max_message_bytes_ = kMaxMessageBytes;
};

}  // namespace detops
