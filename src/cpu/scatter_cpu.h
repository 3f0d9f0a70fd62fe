// What the scatter-form backwards of the bilinear-gather ops (RoIAlign, RoIAlignRotated) share
// on the CPU: one scatter step into an accumulator, the zero fill of a strided grad_input, and the
// truncated mode's double buffer (its layout, and its final rounding into grad_input).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "detops/detail/roi_align_kernels.h"
#include "internal/common.h"

namespace detops {
namespace internal {

/// *p += v with one rounding to Target: from the accumulator type directly where V is it (float
/// for 16-bit targets: the same bits as through double, whose round-to-odd step is exact for a
/// float), through double otherwise.
template <class Target, class V>
inline void scatter_add(Target* p, V v) {
  const V sum = static_cast<V>(to_acc(*p)) + v;
  if constexpr (std::is_same_v<V, acc_t<Target>>) *p = from_acc<Target>(sum);
  else *p = static_cast<Target>(from_double<Target>(static_cast<double>(sum)));
}

/// Calls f(offset of the element, its NCHW linear index) for every element of a strided 4-d
/// view, in parallel over the first two dims.
template <class T, class F>
inline void for_each_element(const TensorView& v, const Context& ctx, F&& f) {
  const std::int64_t outer = v.sizes[0] * v.sizes[1];
  parallel_for(outer, 1, ctx.resolved_threads(), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const std::int64_t n = i / v.sizes[1], c = i % v.sizes[1];
      for (std::int64_t y = 0; y < v.sizes[2]; ++y)
        for (std::int64_t x = 0; x < v.sizes[3]; ++x)
          f(n * v.strides[0] + c * v.strides[1] + y * v.strides[2] + x * v.strides[3],
            ((n * v.sizes[1] + c) * v.sizes[2] + y) * v.sizes[3] + x);
    }
  });
}

/// v[n, c, y, x] = from_double<T>(buf[n * bs.s0 + c * bs.s1 + y * bs.s2 + x * bs.s3]) for a
/// contiguous double buffer, NCHW or NHWC (bs.s1 == 1), and a view v of any strides: the
/// truncated mode's final rounding. Tiles of kTile positions x every channel, so that a
/// channels-last v is written a cache-resident tile at a time (walking channel planes over the
/// whole view would write each line of an NHWC output once per channel it holds, far apart in
/// time). An NHWC buffer is read a row of channels at a time.
template <class T>
inline void store_rounded(const double* buf, const detail::Strides4& bs, const TensorView& v, const Context& ctx) {
  constexpr std::int64_t kTile = 64;
  const std::int64_t N = v.sizes[0], C = v.sizes[1], W = v.sizes[3], HW = v.sizes[2] * W;
  const std::int64_t tiles = (HW + kTile - 1) / kTile;
  const std::int64_t bp = bs.s3;  // buffer stride of one position (contiguous: s2 == W * s3)
  const std::int64_t vc = v.strides[1];
  const bool channels_inner = bs.s1 == 1 && vc == 1 && C > 1;
  T* out = static_cast<T*>(v.data);
  parallel_for(N * tiles, 1, ctx.resolved_threads(), [&](std::int64_t b, std::int64_t e) {
    std::int64_t off[kTile];
    for (std::int64_t i = b; i < e; ++i) {
      const std::int64_t n = i / tiles, p0 = i % tiles * kTile, len = std::min(kTile, HW - p0);
      for (std::int64_t j = 0; j < len; ++j)
        off[j] = n * v.strides[0] + (p0 + j) / W * v.strides[2] + (p0 + j) % W * v.strides[3];
      const double* src = buf + n * bs.s0 + p0 * bp;
      if (channels_inner) {
        for (std::int64_t j = 0; j < len; ++j) {
          const double* row = src + j * bp;
          T* dst = out + off[j];
          for (std::int64_t c = 0; c < C; ++c) dst[c] = from_double<T>(row[c]);
        }
        continue;
      }
      for (std::int64_t c = 0; c < C; ++c) {
        const double* plane = src + c * bs.s1;
        T* dst = out + c * vc;
        for (std::int64_t j = 0; j < len; ++j) dst[off[j]] = from_double<T>(plane[j * bp]);
      }
    }
  });
}

/// The truncated mode's dense double buffer (truncated_buffer_bytes), laid out like grad_input:
/// NHWC when its channels are contiguous (the scatter then adds rows of channels, as the atomic
/// mode does in grad_input itself), NCHW otherwise. Each element receives its adds in the same
/// order in either layout, so the bits do not depend on it.
inline detail::Strides4 truncated_buffer_strides(const TensorView& grad_input, const detail::RoiAlignShape& s) {
  return channels_innermost(grad_input) ? detail::Strides4{s.H * s.W * s.C, 1, s.W * s.C, s.C}
                                        : detail::Strides4{s.C * s.H * s.W, s.H * s.W, s.W, 1};
}

template <class T>
inline void zero_fill(const TensorView& v, const Context& ctx) {
  T* p = static_cast<T*>(v.data);
  if (v.is_contiguous() || (v.layout() == Layout::kNHWC && v.span_bytes() == v.numel() * static_cast<std::int64_t>(sizeof(T)))) {
    std::memset(static_cast<void*>(p), 0, static_cast<std::size_t>(v.numel()) * sizeof(T));
    return;
  }
  for_each_element<T>(v, ctx, [&](std::int64_t off, std::int64_t) { p[off] = from_acc<T>(acc_t<T>(0)); });
}

}  // namespace internal
}  // namespace detops
