// Scratch memory of one call: the one owner every op uses, in front ends and CUDA backends alike
// (CUB's temporary-storage idea: a layout sized first, then carved from one buffer).
//
//   WorkspaceLayout l; l.add<T>(n); ...        sizes the arrays (internal/common.h)
//   workspace_size_with_slack(l.bytes())       what an op's *_workspace_size() reports
//   Scratch s(op, l.bytes(), device, ctx, given, {{"x", &x}, ...});
//   s.bind(l); T* a = l.take<T>(); ...         carves the arrays, each kWorkspaceAlign-aligned
//
// The base is rounded up to kWorkspaceAlign whatever the caller's buffer or the allocator returned
// (an allocator may return 8-byte-aligned memory; the records carved from it need 16 bytes and
// more), which is why every request carries kWorkspaceAlign - 1 bytes of slack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>

#include "detops/context.h"
#include "detops/tensor.h"
#include "internal/common.h"

namespace detops {
namespace internal {

inline constexpr std::size_t kWorkspaceAlign = WorkspaceLayout::kAlign;

/// Bytes to request for a layout of `layout_bytes` so that it fits from any base address (0 stays 0).
inline std::size_t workspace_size_with_slack(std::size_t layout_bytes) {
  return layout_bytes == 0 ? 0 : layout_bytes + (kWorkspaceAlign - 1);
}

/// A tensor of a call, named for messages.
struct NamedView {
  const char* name;
  const TensorView* view;
};

/// Scratch memory for one call on `device`, stream-ordered on ctx.cuda_stream: the caller's
/// Workspace when one is given (it must hold workspace_size_with_slack(layout_bytes) bytes and
/// share no byte with `views`, the call's tensors: the op writes it while it reads them), otherwise
/// memory from ctx.allocator (default_allocator() when null), released on scope exit.
class Scratch {
 public:
  Scratch(const char* op, std::size_t layout_bytes, Device device, const Context& ctx, Workspace given = {},
          std::initializer_list<NamedView> views = {}, const char* size_query = "the op's *_workspace_size()")
      : device_(device), stream_(ctx.cuda_stream) {
    const std::size_t need = workspace_size_with_slack(layout_bytes);
    if (need == 0) return;
    if (given.data) {
      if (given.bytes < need)
        fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; expected at least {} (see {})", op, given.bytes,
             need, size_query);
      const auto w0 = reinterpret_cast<std::uintptr_t>(given.data);  // unrelated allocations: compare integers
      for (const NamedView& v : views) {
        if (!v.view->defined() || v.view->numel() == 0 || v.view->device != device) continue;
        const auto v0 = reinterpret_cast<std::uintptr_t>(v.view->data);
        if (w0 < v0 + static_cast<std::uintptr_t>(v.view->span_bytes()) && v0 < w0 + need)
          fail(ErrorCode::kInvalidArgument, "{}: workspace [{}, +{} bytes) overlaps {} in memory; expected disjoint "
               "memory", op, given.data, need, v.name);
      }
      raw_ = given.data;
    } else {
      alloc_ = ctx.allocator ? ctx.allocator : &default_allocator();
      try {
        raw_ = alloc_->allocate(need, device, stream_);
      } catch (const std::bad_alloc&) {  // a caller's allocator (operator new inside it): kOutOfMemory
        fail(ErrorCode::kOutOfMemory, "{}: workspace: cannot allocate {} bytes on {}: the allocator threw "
             "std::bad_alloc", op, need, to_string(device));
      } catch (const Error& e) {  // the default allocator's failure, which does not know the op
        if (e.code() != ErrorCode::kOutOfMemory) throw;
        fail(ErrorCode::kOutOfMemory, "{}: {}", op, e.what());
      }
      if (!raw_) fail(ErrorCode::kOutOfMemory, "{}: the allocator returned no memory for {} bytes of workspace", op, need);
      bytes_ = need;
    }
    const auto addr = reinterpret_cast<std::uintptr_t>(raw_);
    aligned_ = static_cast<unsigned char*>(raw_) + (kWorkspaceAlign - addr % kWorkspaceAlign) % kWorkspaceAlign;
  }
  ~Scratch() {
    if (alloc_ && raw_) alloc_->deallocate(raw_, bytes_, device_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  /// The aligned base (nullptr for an empty layout).
  void* data() const { return aligned_; }
  /// Binds `layout` (the one whose bytes() sized this scratch) to the aligned base.
  void bind(WorkspaceLayout& layout) const { layout.bind(aligned_); }
  /// The aligned memory as a Workspace of the layout's size.
  Workspace workspace(std::size_t layout_bytes) const { return {aligned_, aligned_ ? layout_bytes : 0}; }

 private:
  Device device_;
  void* stream_;
  Allocator* alloc_ = nullptr;
  void* raw_ = nullptr;
  std::size_t bytes_ = 0;
  unsigned char* aligned_ = nullptr;
};

}  // namespace internal
}  // namespace detops
