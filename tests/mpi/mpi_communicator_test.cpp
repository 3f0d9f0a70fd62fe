// MpiCommunicator on its own (label mpi): rank()/size() of the duplicate, all_gather in rank
// order for odd sizes and zero bytes, all-gathers larger than the piece size (the INT_MAX path,
// emulated with tiny pieces), device buffers refused with kInvalidArgument, bad constructor
// arguments, and the duplicate's isolation: a message the caller left pending on the original
// communicator is neither matched nor disturbed by detops' traffic.
#include <cstdint>
#include <cstring>
#include <vector>

#include "detops/mpi.h"
#include "mpi_test_util.h"

namespace {

using detops::Device;
using detops::Error;
using detops::ErrorCode;
using detops::MpiCommunicator;

unsigned char pattern(int rank, std::size_t i) { return static_cast<unsigned char>(rank * 37 + i * 11 + 5); }

void check_gather(MpiCommunicator& comm, std::size_t bytes, const char* what) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<unsigned char> send(bytes), recv(bytes * size + 3, 0xAB);
  for (std::size_t i = 0; i < bytes; ++i) send[i] = pattern(rank, i);
  comm.all_gather(send.data(), recv.data(), bytes, Device::cpu(), nullptr);
  int wrong = 0;
  for (int r = 0; r < size; ++r)
    for (std::size_t i = 0; i < bytes; ++i) wrong += recv[r * bytes + i] != pattern(r, i);
  for (std::size_t i = bytes * size; i < recv.size(); ++i) wrong += recv[i] != 0xAB;  // nothing past the end
  MPI_EXPECT(wrong == 0, "%s: all_gather of %zu bytes: %d wrong bytes", what, bytes, wrong);
}

void run(int, char**) {
  const int world = detops::test::world_size(), me = detops::test::world_rank();

  // A message the caller leaves in flight on MPI_COMM_WORLD (tag 0, any source) while detops
  // gathers: with a duplicated communicator neither side can receive the other's bytes.
  const int right = (me + 1) % world, left = (me + world - 1) % world;
  int user_out = 1000 + me, user_in = -1;
  MPI_Request user_requests[2];
  MPI_Irecv(&user_in, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &user_requests[0]);
  MPI_Isend(&user_out, 1, MPI_INT, right, 0, MPI_COMM_WORLD, &user_requests[1]);

  {
    MpiCommunicator comm(MPI_COMM_WORLD);
    MPI_EXPECT(comm.rank() == me && comm.size() == world, "rank %d size %d", comm.rank(), comm.size());
    MPI_EXPECT(std::strcmp(comm.name(), "mpi") == 0, "name %s", comm.name());
    MPI_EXPECT(!comm.accepts_device_memory(), "accepts_device_memory");
    int compare = -1;
    MPI_Comm_compare(comm.comm(), MPI_COMM_WORLD, &compare);
    MPI_EXPECT(compare == MPI_CONGRUENT, "the communicator is not a duplicate (MPI_Comm_compare %d)", compare);
    MPI_Errhandler handler;
    MPI_Comm_get_errhandler(comm.comm(), &handler);
    MPI_EXPECT(handler == MPI_ERRORS_RETURN, "the duplicate's error handler is not MPI_ERRORS_RETURN");
    MPI_Errhandler_free(&handler);

    for (std::size_t bytes : {std::size_t{1}, std::size_t{8}, std::size_t{32}, std::size_t{1001}}) check_gather(comm, bytes, "whole");
    check_gather(comm, 0, "zero bytes");
    MPI_EXPECT(comm.sequence() == 0, "sequence %llu", static_cast<unsigned long long>(comm.sequence()));

    try {
      int a = 0, b[64];
      comm.all_gather(&a, b, sizeof a, Device::cuda(0), nullptr);
      MPI_EXPECT(false, "device buffers were accepted");
    } catch (const Error& e) {
      MPI_EXPECT(e.code() == ErrorCode::kInvalidArgument, "device buffers: code %d: %s", static_cast<int>(e.code()),
                 e.what());
    }
  }
  {
    // Pieces: 7-byte pieces of 1001- and 14-byte blocks (exact multiple) and 3-byte blocks (one piece).
    MpiCommunicator comm(MPI_COMM_WORLD, 7);
    for (std::size_t bytes : {std::size_t{1001}, std::size_t{14}, std::size_t{3}, std::size_t{8}}) check_gather(comm, bytes, "pieces");
  }

  MPI_Waitall(2, user_requests, MPI_STATUSES_IGNORE);
  MPI_EXPECT(user_in == 1000 + left, "the caller's message was disturbed: received %d, expected %d", user_in, 1000 + left);

  // Constructor arguments.
  try {
    MpiCommunicator comm(MPI_COMM_NULL);
    MPI_EXPECT(false, "MPI_COMM_NULL was accepted");
  } catch (const Error& e) {
    MPI_EXPECT(e.code() == ErrorCode::kInvalidArgument, "MPI_COMM_NULL: code %d", static_cast<int>(e.code()));
  }
  try {
    MpiCommunicator comm(MPI_COMM_WORLD, 0);
    MPI_EXPECT(false, "max_message_bytes 0 was accepted");
  } catch (const Error& e) {
    MPI_EXPECT(e.code() == ErrorCode::kInvalidArgument, "max_message_bytes 0: code %d", static_cast<int>(e.code()));
  }

  // A sub-communicator (even world ranks, odd world ranks): rank and size are the caller's.
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half);
  {
    MpiCommunicator comm(half);
    int hr = 0, hs = 0;
    MPI_Comm_rank(half, &hr);
    MPI_Comm_size(half, &hs);
    MPI_EXPECT(comm.rank() == hr && comm.size() == hs, "split: rank %d/%d, expected %d/%d", comm.rank(), comm.size(), hr, hs);
    check_gather(comm, 5, "split");
  }
  MPI_Comm_free(&half);
}

}  // namespace

int main(int argc, char** argv) { return detops::test::mpi_main(argc, argv, run); }
