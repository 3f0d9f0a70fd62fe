// Helpers of the MPI test programs: checks that count failures per rank and print them with the
// rank, and a main() wrapper that initializes MPI, runs the test and turns failures, uncaught
// exceptions and disagreement between ranks into the process's exit status (0 = pass).
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>

#include "detops/error.h"

namespace detops {
namespace test {

inline int& mpi_failures() {
  static int n = 0;
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

#define MPI_EXPECT(cond, ...)                                                                    \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      ++::detops::test::mpi_failures();                                                          \
      std::fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", ::detops::test::world_rank(), \
                   __FILE__, __LINE__, #cond);                                                   \
      std::fprintf(stderr, __VA_ARGS__);                                                         \
      std::fputc('\n', stderr);                                                                  \
    }                                                                                            \
  } while (0)

/// Runs body(argc, argv) between MPI_Init and MPI_Finalize. Exit status 0 only if no rank failed
/// (every rank learns the total); an exception escaping body aborts the job (its collectives
/// would otherwise leave the other ranks waiting).
template <class Body>
int mpi_main(int argc, char** argv, Body&& body) {
  MPI_Init(&argc, &argv);
  try {
    body(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "[rank %d] uncaught detops::Error (code %d): %s\n", world_rank(), static_cast<int>(e.code()),
                 e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int local = mpi_failures(), total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::printf("%s: %d rank(s), %d failed check(s)\n", total == 0 ? "PASS" : "FAIL", world_size(), total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

}  // namespace test
}  // namespace detops
