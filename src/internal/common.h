// Library-private helpers: error raising with fmt, dtype dispatch, the CPU parallel loop, and
// workspace carving. Not installed.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "detops/dtype.h"
#include "detops/error.h"
#include "detops/tensor.h"

namespace detops {
namespace internal {

template <class... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

/// Channels innermost in memory: a 4-d [N, C, H, W] view whose channel stride is 1 (and C > 1),
/// the test every backend uses to pick its channels-last walk (TensorView::layout() agrees).
inline bool channels_innermost(const TensorView& v) { return v.rank == 4 && v.strides[1] == 1 && v.sizes[1] > 1; }

/// Calls f(T{}) with T the C++ type of a floating dtype.
template <class F>
decltype(auto) dispatch_floating(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kFloat16: return f(Half{});
    case DType::kBFloat16: return f(BFloat16{});
    default: break;
  }
  fail(ErrorCode::kInvalidArgument, "internal: dtype {} is not floating", dtype_name(t));
}

/// Starts the worker threads of parallel_for: std::thread.
struct StartStdThread {
  template <class Fn>
  void operator()(std::vector<std::thread>& pool, Fn&& fn) const {
    pool.emplace_back(std::forward<Fn>(fn));
  }
};

/// Runs f(begin, end) over [0, n) split into at most `threads` contiguous chunks of at least
/// `grain` items, on threads started for this call by `start` (the caller's thread takes the
/// first chunk). Chunks are disjoint, so results never depend on the thread count unless f makes
/// them. When a thread cannot be started (resource limits: std::system_error, bad_alloc), the
/// caller's thread runs the chunks left over: slower, same result, nothing left half-written.
/// start(pool, fn) appends a thread running fn to pool, or throws.
template <class Start, class F>
void parallel_for_with(Start&& start, std::int64_t n, std::int64_t grain, int threads, F&& f) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t chunks = std::min<std::int64_t>(std::max(threads, 1), (n + grain - 1) / grain);
  if (chunks <= 1) {
    f(std::int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(chunks));
  pool.reserve(static_cast<std::size_t>(chunks - 1));
  auto run = [&](std::int64_t i) {
    try {
      f(n * i / chunks, n * (i + 1) / chunks);
    } catch (...) {
      errors[static_cast<std::size_t>(i)] = std::current_exception();
    }
  };
  std::int64_t started = 1;
  try {
    for (; started < chunks; ++started) start(pool, [&run, started] { run(started); });
  } catch (...) {
    // no more threads: the chunks [started, chunks) run below on this thread (unless the starter
    // failed after its thread was in the pool: that thread runs its chunk)
    if (static_cast<std::int64_t>(pool.size()) == started) ++started;
  }
  run(0);
  for (std::int64_t i = started; i < chunks; ++i) run(i);
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, int threads, F&& f) {
  parallel_for_with(StartStdThread{}, n, grain, threads, std::forward<F>(f));
}

/// Lays out several arrays in one workspace buffer (256-byte aligned each). Call add() for every
/// array to learn the total; then bind() to a base pointer and take() them in the same order.
class WorkspaceLayout {
 public:
  static constexpr std::size_t kAlign = 256;
  template <class T>
  std::size_t add(std::int64_t count) {
    const std::size_t off = total_;
    total_ += round_up(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)) * sizeof(T));
    offsets_.push_back(off);
    return off;
  }
  std::size_t add_bytes(std::size_t bytes) {
    const std::size_t off = total_;
    total_ += round_up(bytes);
    offsets_.push_back(off);
    return off;
  }
  std::size_t bytes() const { return total_; }
  void bind(void* base) {
    base_ = static_cast<unsigned char*>(base);
    next_ = 0;
  }
  template <class T>
  T* take() {
    return reinterpret_cast<T*>(base_ + offsets_[next_++]);
  }

 private:
  static std::size_t round_up(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
  std::vector<std::size_t> offsets_;
  std::size_t total_ = 0;
  unsigned char* base_ = nullptr;
  std::size_t next_ = 0;
};

}  // namespace internal
}  // namespace detops
