// CPU backend of FrozenBatchNorm2d: one pass over memory, multi-threaded. When every tensor of
// the call shares one dense layout, NCHW walks contiguous planes with a scalar scale/shift and
// NHWC walks contiguous channel rows with vector scale/shift; both inner loops are branch-free
// in the epilogue (a template parameter) and vectorize. Anything else uses the shared generic
// element bodies. The arithmetic is the shared helpers' in every path. float16 on a CPU with
// F16C (and Context::cpu_isa allowing AVX2) takes the dense walks through float staging blocks
// converted by the F16C instructions (internal/half_convert.h): the same bits, faster.
#include <algorithm>
#include <type_traits>

#include "detops/detail/frozen_batch_norm_math.h"
#include "internal/common.h"
#include "internal/frozen_batch_norm_backend.h"
#include "internal/half_convert.h"

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

/// float16 with F16C: a segment of n elements (a plane or a channels-last row) in blocks of
/// kStage, converted to float (x, and r when given), computed by f(xs, rs, ys, j0, len) with the
/// float loops above (the same float arithmetic the float16 loops do, since acc_t<Half> is
/// float), and converted back. The same bits as the direct loops: the conversions agree.
constexpr std::int64_t kStage = 512;
template <class F>
void staged(const HalfConvert& cv, const Half* x, const Half* r, Half* y, std::int64_t n, F&& f) {
  float xs[kStage], rs[kStage], ys[kStage];
  for (std::int64_t j0 = 0; j0 < n; j0 += kStage) {
    const std::int64_t len = std::min(kStage, n - j0);
    cv.to_float(x + j0, xs, len);
    if (r) cv.to_float(r + j0, rs, len);
    f(xs, r ? rs : nullptr, ys, j0, len);
    cv.to_half(ys, y + j0, len);
  }
}

/// The backward's grad_residual: grad_y where the ReLU passed (the element itself, NaN payloads
/// included), zero elsewhere.
inline void masked_copy(const Half* gy, const float* yv, Half* gr, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)  // a mask, not a select: GCC left the select a branch
    gr[i] = Half::from_bits(static_cast<std::uint16_t>(gy[i].bits & (0u - static_cast<unsigned>(yv[i] > 0.0f))));
}

/// The dense walks of run_typed for float16 through F16C (see staged).
template <bool kAdd, bool kRelu>
void run_half_staged(const FrozenBnCall& call, const Context& ctx, const HalfConvert& cv, std::optional<Layout> dense) {
  const TensorView& ref = call.input;
  const std::int64_t N = ref.sizes[0], C = ref.sizes[1], HW = ref.sizes[2] * ref.sizes[3];
  const detail::FrozenBnArgs<Half> arr = make_frozen_bn_args<Half>(call, kAdd, kRelu);  // the typed pointers
  const Half *a = arr.a, *b = arr.b;
  Half *out = arr.out, *out2 = arr.out2;
  const float *scale = arr.scale, *shift = arr.shift;
  const bool nhwc = dense == Layout::kNHWC;
  const std::int64_t segments = nhwc ? N * HW : N * C, len = nhwc ? C : HW;
  parallel_for(segments, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(len, 1)), ctx.resolved_threads(),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t p = lo; p < hi; ++p) {
                   const std::int64_t o = p * len, c = p % C;  // c: the plane's channel (NCHW)
                   if (!call.backward) {
                     staged(cv, a + o, b ? b + o : nullptr, out + o, len,
                            [&](const float* xs, const float* rs, float* ys, std::int64_t j0, std::int64_t n) {
                              if (nhwc) forward_row<float, kAdd, kRelu>(xs, rs, ys, scale + j0, shift + j0, n);
                              else forward_plane<float, kAdd, kRelu>(xs, rs, ys, scale[c], shift[c], n);
                            });
                   } else {  // a: grad_y, b: y (the ReLU mask), out: grad_x, out2: grad_residual
                     staged(cv, a + o, kRelu ? b + o : nullptr, out + o, len,
                            [&](const float* gs, const float* yv, float* gxs, std::int64_t j0, std::int64_t n) {
                              if (nhwc) backward_row<float, kRelu>(gs, yv, gxs, nullptr, scale + j0, n);
                              else backward_plane<float, kRelu>(gs, yv, gxs, nullptr, scale[c], n);
                              if (out2) {
                                if (kRelu) masked_copy(a + o + j0, yv, out2 + o + j0, n);
                                else std::copy(a + o + j0, a + o + j0 + n, out2 + o + j0);
                              }
                            });
                   }
                 }
               });
}

template <class T, bool kAdd, bool kRelu>
void run_typed(const FrozenBnCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const TensorView& ref = call.input;
  const std::int64_t N = ref.sizes[0], C = ref.sizes[1], H = ref.sizes[2], W = ref.sizes[3];
  const detail::FrozenBnArgs<T> arr = make_frozen_bn_args<T>(call, kAdd, kRelu);  // the typed pointers
  const T *a = arr.a, *b = arr.b;
  T *out = arr.out, *out2 = arr.out2;
  const A *scale = arr.scale, *shift = arr.shift;
  const int threads = ctx.resolved_threads();

  const std::optional<Layout> dense = frozen_bn_dense_layout(call);
  if constexpr (std::is_same_v<T, Half>) {
    if (const HalfConvert* cv = dense.has_value() ? half_convert_f16c(ctx) : nullptr) {
      run_half_staged<kAdd, kRelu>(call, ctx, *cv, dense);
      return;
    }
  }
  if (dense.has_value()) {
    if (dense == Layout::kNHWC) {  // rows of C contiguous channels
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
  const detail::FrozenBnArgs<T>& p = arr;
  parallel_for(N * C * H * W, 1 << 14, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      if (!call.backward) detail::frozen_bn_forward_element(i, p);
      else detail::frozen_bn_backward_element(i, p);
    }
  });
}

void run(const FrozenBnCall& call, const Context& ctx) {
  dispatch_floating(call.input.dtype, [&](auto tag) {
    dispatch_epilogue(call, [&](auto add, auto relu) { run_typed<decltype(tag), add(), relu()>(call, ctx); });
  });
}

}  // namespace

extern const FrozenBnBackend kFrozenBnCpu = {&run};

}  // namespace internal
}  // namespace detops
