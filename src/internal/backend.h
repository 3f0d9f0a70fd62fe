// The seam between an op's front end (src/<op>.cpp) and its backends: one table of function
// pointers per op and device, looked up by the tensors' device (the idea of ATen's DispatchStub).
//
//   src/internal/<op>_backend.h   struct <Op>Backend { ... };  extern const <Op>Backend k<Op>Cpu, k<Op>Cuda;
//   src/cpu/<op>_cpu.cpp          const <Op>Backend k<Op>Cpu = {...};   (at the bottom of the file)
//   cuda/<op>_cuda.cu             const <Op>Backend k<Op>Cuda = {...};
//   src/<op>.cpp                  constexpr OpBackends<<Op>Backend> kBackends{&k<Op>Cpu, DETOPS_CUDA_BACKEND(k<Op>Cuda)};
//                                 ... backend_for(kBackends, device, op).forward(call, ctx);
//
// A CPU-only build never names k<Op>Cuda (the macro gives nullptr), so a CUDA backend needs no
// stub: backend_for() reports ErrorCode::kNotCompiled for a CUDA tensor.
#pragma once

#include "detops/error.h"
#include "detops/tensor.h"
#include "internal/common.h"

#if defined(DETOPS_WITH_CUDA)
#define DETOPS_CUDA_BACKEND(table) (&(table))
#else
#define DETOPS_CUDA_BACKEND(table) nullptr
#endif

namespace detops {
namespace internal {

/// An op's backend tables by device type (cuda is nullptr when the build has no CUDA backend).
template <class Table>
struct OpBackends {
  const Table* cpu;
  const Table* cuda;
};

/// The table for `device`, or ErrorCode::kNotCompiled naming `op`.
template <class Table>
const Table& backend_for(const OpBackends<Table>& backends, Device device, const char* op) {
  if (device.is_cpu()) return *backends.cpu;
  if (!backends.cuda)
    fail(ErrorCode::kNotCompiled, "{}: this build of detops has no CUDA backend (configure with DETOPS_CUDA=ON)", op);
  return *backends.cuda;
}

}  // namespace internal
}  // namespace detops
