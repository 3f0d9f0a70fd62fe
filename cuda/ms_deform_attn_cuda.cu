// CUDA backend of multi-scale deformable attention: the entry points, the level table's upload
// (a small buffer of the call's own) and read_levels (the op's one documented wait). The steps
// are written once over the device interface (src/internal/ms_deform_attn_device.h) and run here
// on CudaDevice (cuda/cuda_device.cuh), all on the caller's stream;
// tests/ms_deform_attn_emulated_test.cpp runs the same steps on the emulated device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "internal/ms_deform_attn_backend.h"
#include "internal/ms_deform_attn_device.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

// ---------------------------------------------------------------------------------------------
// Host helpers

/// The level table on the device, from the checked host copy (pageable memory: the copy is
/// staged before cudaMemcpyAsync returns, so the host vector may go).
class DeviceLevels {
 public:
  DeviceLevels(const MsdaCall& call, const Context& ctx)
      : scratch_(call.op, bytes(call), call.value.device, ctx) {
    if (call.levels.empty()) return;
    DETOPS_CUDA_CHECK(cudaMemcpyAsync(scratch_.data(), call.levels.data(), call.levels.size() * sizeof(detail::MsdaLevel),
                                      cudaMemcpyHostToDevice, stream_of(ctx)),
                      call.op);
  }
  const detail::MsdaLevel* data() const { return static_cast<const detail::MsdaLevel*>(scratch_.data()); }

 private:
  static std::size_t bytes(const MsdaCall& call) { return call.levels.size() * sizeof(detail::MsdaLevel); }
  Scratch scratch_;
};

/// Copies the bytes of a small int64 tensor (on the device or the host) into `span`, indexed by
/// its strides; a device copy is enqueued on the stream (the caller waits once for all).
void enqueue_read(const TensorView& v, std::vector<std::int64_t>& span, const Context& ctx, const char* op) {
  const std::int64_t bytes = v.numel() == 0 ? 0 : v.span_bytes();
  span.resize(static_cast<std::size_t>(bytes / 8));
  if (bytes == 0) return;
  if (v.device.is_cpu()) {
    std::memcpy(span.data(), v.data, static_cast<std::size_t>(bytes));
    return;
  }
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(span.data(), v.data, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost,
                                    stream_of(ctx)),
                    op);
}

void read_levels(const MsdaCall& call, std::int64_t* shapes, std::int64_t* starts, const Context& ctx) {
  DeviceGuard guard(call.value.device.index, call.op);
  const std::int64_t L = call.shape.L;
  std::vector<std::int64_t> ss, ls;
  enqueue_read(call.spatial_shapes, ss, ctx, call.op);
  enqueue_read(call.level_start_index, ls, ctx, call.op);
  DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)), call.op);  // the one documented wait
  for (std::int64_t l = 0; l < L; ++l) {
    shapes[2 * l] = ss[static_cast<std::size_t>(l * call.spatial_shapes.strides[0])];
    shapes[2 * l + 1] = ss[static_cast<std::size_t>(l * call.spatial_shapes.strides[0] + call.spatial_shapes.strides[1])];
    starts[l] = ls[static_cast<std::size_t>(l * call.level_start_index.strides[0])];
  }
}

void forward(const MsdaCall& call, const Context& ctx) {
  DeviceGuard guard(call.value.device.index, call.op);
  const DeviceLevels levels(call, ctx);
  const CudaDevice dev{ctx, call.op};
  dispatch_msda(call.value.dtype, call.sampling_locations.dtype, [&](auto t, auto loc) {
    msda_forward_on<decltype(t), decltype(loc)>(dev, call, levels.data());
  });
}

std::size_t backward_workspace(const MsdaCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  DeviceGuard guard(call.value.device.index, call.op);  // CUB's temp sizes depend on the device
  const Context ctx{};                                   // a size query enqueues nothing
  return msda_backward_workspace_on(CudaDevice{ctx, call.op}, call, mode);
}

void backward(const MsdaCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.value.device.index, call.op);
  const DeviceLevels levels(call, ctx);
  const CudaDevice dev{ctx, call.op};
  dispatch_msda(call.value.dtype, call.sampling_locations.dtype, [&](auto t, auto loc) {
    msda_backward_on<decltype(t), decltype(loc)>(dev, call, mode, levels.data(), ws);
  });
}

}  // namespace

extern const MsdaBackend kMsDeformAttnCuda = {read_levels, forward, backward_workspace, backward};

}  // namespace internal
}  // namespace detops
