// CPU backend of FrozenBatchNorm2d: one pass over memory, multi-threaded. When every tensor of
// the call shares one dense layout, NCHW walks contiguous planes with a scalar scale/shift and
// NHWC walks contiguous channel rows with vector scale/shift; both inner loops are branch-free
// in the epilogue (a template parameter) and vectorize. Anything else uses the shared generic
// element bodies. The arithmetic is the shared helpers' in every path.
#include <algorithm>

#include "detops/detail/frozen_batch_norm_math.h"
#include "internal/common.h"
#include "internal/frozen_batch_norm_backend.h"

namespace detops {
namespace internal {

namespace {

template <class T, bool kAdd, bool kRelu>
void forward_plane(const T* x, const T* r, T* y, acc_t<T> s, acc_t<T> b, std::int64_t n) {
  using A = acc_t<T>;
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = from_acc<T>(detail::frozen_bn_apply(to_acc(x[i]), s, b, kAdd ? to_acc(r[i]) : A(0), kAdd, kRelu));
}

template <class T, bool kAdd, bool kRelu>
void forward_row(const T* x, const T* r, T* y, const acc_t<T>* s, const acc_t<T>* b, std::int64_t C) {
  using A = acc_t<T>;
  for (std::int64_t c = 0; c < C; ++c)
    y[c] = from_acc<T>(detail::frozen_bn_apply(to_acc(x[c]), s[c], b[c], kAdd ? to_acc(r[c]) : A(0), kAdd, kRelu));
}

template <class T, bool kRelu>
void backward_plane(const T* gy, const T* yv, T* gx, T* gr, acc_t<T> s, std::int64_t n) {
  using A = acc_t<T>;
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = gy[i];
    const bool passed = !kRelu || to_acc(yv[i]) > A(0);
    gx[i] = from_acc<T>(detail::frozen_bn_grad(to_acc(g), s, passed));
    if (gr) gr[i] = passed ? g : from_acc<T>(A(0));
  }
}

template <class T, bool kRelu>
void backward_row(const T* gy, const T* yv, T* gx, T* gr, const acc_t<T>* s, std::int64_t C) {
  using A = acc_t<T>;
  for (std::int64_t c = 0; c < C; ++c) {
    const T g = gy[c];
    const bool passed = !kRelu || to_acc(yv[c]) > A(0);
    gx[c] = from_acc<T>(detail::frozen_bn_grad(to_acc(g), s[c], passed));
    if (gr) gr[c] = passed ? g : from_acc<T>(A(0));
  }
}

template <class T, bool kAdd, bool kRelu>
void run_typed(const FrozenBnCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const TensorView& ref = call.a;
  const std::int64_t N = ref.sizes[0], C = ref.sizes[1], H = ref.sizes[2], W = ref.sizes[3];
  const T* a = static_cast<const T*>(call.a.data);
  const T* b = static_cast<const T*>(call.b.data);
  T* out = static_cast<T*>(call.out.data);
  T* out2 = static_cast<T*>(call.out2.data);
  const A* scale = static_cast<const A*>(call.scale.data);
  const A* shift = static_cast<const A*>(call.shift.data);
  const int threads = ctx.resolved_threads();

  const DenseLayout dense = frozen_bn_dense_layout(call);
  if (dense != DenseLayout::kNone) {
    if (dense == DenseLayout::kNHWC) {  // rows of C contiguous channels
      parallel_for(N * H * W, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(C, 1)), threads,
                   [&](std::int64_t lo, std::int64_t hi) {
                     for (std::int64_t p = lo; p < hi; ++p) {
                       const std::int64_t o = p * C;
                       if (!call.backward) forward_row<T, kAdd, kRelu>(a + o, b ? b + o : nullptr, out + o, scale, shift, C);
                       else backward_row<T, kRelu>(a + o, b ? b + o : nullptr, out + o, out2 ? out2 + o : nullptr, scale, C);
                     }
                   });
    } else {  // planes of H*W contiguous elements
      const std::int64_t HW = H * W;
      parallel_for(N * C, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(HW, 1)), threads,
                   [&](std::int64_t lo, std::int64_t hi) {
                     for (std::int64_t p = lo; p < hi; ++p) {
                       const std::int64_t o = p * HW, c = p % C;
                       if (!call.backward)
                         forward_plane<T, kAdd, kRelu>(a + o, b ? b + o : nullptr, out + o, scale[c], shift[c], HW);
                       else
                         backward_plane<T, kRelu>(a + o, b ? b + o : nullptr, out + o, out2 ? out2 + o : nullptr, scale[c], HW);
                     }
                   });
    }
    return;
  }
  // Any strides: the shared element bodies.
  const detail::FrozenBnArgs<T> p = make_frozen_bn_args<T>(call, kAdd, kRelu);
  parallel_for(N * C * H * W, 1 << 14, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      if (!call.backward) detail::frozen_bn_forward_element(i, p);
      else detail::frozen_bn_backward_element(i, p);
    }
  });
}

}  // namespace

void frozen_bn_cpu(const FrozenBnCall& call, const Context& ctx) {
  dispatch_floating(call.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (call.epilogue) {
      case FrozenBnEpilogue::kNone: run_typed<T, false, false>(call, ctx); break;
      case FrozenBnEpilogue::kRelu: run_typed<T, false, true>(call, ctx); break;
      case FrozenBnEpilogue::kAddRelu:
        if (call.backward) run_typed<T, false, true>(call, ctx);  // the backward only needs the mask
        else run_typed<T, true, true>(call, ctx);
        break;
    }
  });
}

}  // namespace internal
}  // namespace detops
