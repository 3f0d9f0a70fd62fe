// MpiCommunicator (detops/mpi.h): the all-gather of detops collectives over a duplicated MPI_Comm.
#include "detops/mpi.h"

#include <algorithm>
#include <string>

#include "internal/common.h"

namespace detops {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(std::max(length, 0)));
}

/// Throws Error(kCommunication) naming the call and this rank (-1 while not yet known).
void mpi_check(int rc, const char* what, int rank, int size) {
  if (rc == MPI_SUCCESS) return;
  if (rank < 0)
    internal::fail(ErrorCode::kCommunication, "mpi: {} failed: {} (error code {})", what, mpi_error_text(rc), rc);
  internal::fail(ErrorCode::kCommunication, "mpi rank {} of {}: {} failed: {} (error code {})", rank, size, what,
                 mpi_error_text(rc), rc);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::size_t max_message_bytes)
    : max_message_bytes_(std::min(max_message_bytes, kMaxMessageBytes)) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    internal::fail(ErrorCode::kInvalidArgument, "MpiCommunicator: MPI is {}; call MPI_Init first",
                   finalized ? "already finalized" : "not initialized");
  if (comm == MPI_COMM_NULL) internal::fail(ErrorCode::kInvalidArgument, "MpiCommunicator: comm is MPI_COMM_NULL");
  if (max_message_bytes_ == 0)
    internal::fail(ErrorCode::kInvalidArgument, "MpiCommunicator: max_message_bytes is 0; expected >= 1");

  // The duplication reports through the caller's handler on `comm`; everything after it through
  // ours. Intercommunicators are refused: all_gather would exchange with the remote group.
  int inter = 0;
  mpi_check(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter", -1, -1);
  if (inter) internal::fail(ErrorCode::kInvalidArgument, "MpiCommunicator: comm is an intercommunicator");
  mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", -1, -1);
  try {
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", -1, -1);
    mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1, -1);
    mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", -1, -1);
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);  // errors ignored: no throw here
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::size_t bytes, Device device, void*) {
  if (!device.is_cpu())
    internal::fail(ErrorCode::kInvalidArgument,
                   "MpiCommunicator::all_gather: buffers on {}; expected host memory (the caller stages device "
                   "data, accepts_device_memory() is false)",
                   to_string(device));
  if (bytes == 0) return;  // every rank passes the same bytes, so every rank returns here
  if (bytes <= max_message_bytes_) {
    const int count = static_cast<int>(bytes);
    mpi_check(MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_), "MPI_Allgather", rank_, size_);
    return;
  }
  // Larger than an int count (or the test's limit): gather pieces [offset, offset + piece) of
  // every rank's block. Each rank's piece lands at recv + r * bytes + offset through a receive
  // type of `piece` bytes whose extent is `bytes`.
  for (std::size_t offset = 0; offset < bytes;) {
    const std::size_t piece = std::min(max_message_bytes_, bytes - offset);
    MPI_Datatype block = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    mpi_check(MPI_Type_contiguous(static_cast<int>(piece), MPI_BYTE, &block), "MPI_Type_contiguous", rank_, size_);
    const int rc = MPI_Type_create_resized(block, 0, static_cast<MPI_Aint>(bytes), &strided);
    MPI_Type_free(&block);
    mpi_check(rc, "MPI_Type_create_resized", rank_, size_);
    const char* what = "MPI_Type_commit";
    int result = MPI_Type_commit(&strided);
    if (result == MPI_SUCCESS) {
      what = "MPI_Allgather";
      result = MPI_Allgather(static_cast<const unsigned char*>(send) + offset, static_cast<int>(piece), MPI_BYTE,
                             static_cast<unsigned char*>(recv) + offset, 1, strided, comm_);
    }
    MPI_Type_free(&strided);
    mpi_check(result, what, rank_, size_);
    offset += piece;
  }
}

}  // namespace detops
