// libFuzzer target: the tensor API (TensorView's constructors, Tensor::empty/zeros, numel,
// span_bytes, describe, is_contiguous, layout) on arbitrary ranks, sizes, strides and dtypes,
// and an op (frozen_batch_norm_forward) on views built by assigning the fields directly. Every
// call either succeeds with counts that agree with a 128-bit recomputation, or raises
// detops::Error; an extent that does not fit in int64 must be an Error (never a wrapped count);
// no real allocation above 4 MiB is attempted.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "detops/detops.h"

using namespace detops;

namespace {

struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  /// Mostly small values, sometimes near a power of two up to 2^63, sometimes negative.
  std::int64_t extent() {
    const std::uint8_t k = u8();
    if (k < 160) return k % 9;
    if (k < 220) return static_cast<std::int64_t>((std::uint64_t{1} << (u8() % 63)) + (u8() % 3) - 1);
    if (k < 240) return -static_cast<std::int64_t>(u8() % 4) - 1;
    return INT64_MAX - (u8() % 4);
  }
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tensor_fuzz: %s\n", what);
  std::abort();
}

/// (numel, span in bytes) in 128 bits, or false when the view is not one the library accepts.
bool reference_extent(int rank, const std::int64_t* sizes, const std::int64_t* strides, std::size_t es,
                      __int128* numel, __int128* span) {
  if (rank < 0 || rank > kMaxRank) return false;
  __int128 n = 1, last = 0, product = 1;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return false;
    n *= sizes[d];
    product *= sizes[d] == 0 ? 1 : sizes[d];
    if (product > INT64_MAX) return false;
    if (sizes[d] > 0) last += static_cast<__int128>(sizes[d] - 1) * strides[d];
  }
  if (n != 0 && last > INT64_MAX) return false;  // an empty view addresses nothing
  *numel = n;
  *span = n == 0 ? 0 : (last + 1) * static_cast<__int128>(es);
  return *span <= INT64_MAX;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes r{data, size};
  const int rank = r.u8() % 8;  // 7 is over kMaxRank
  const DType dt = static_cast<DType>(r.u8() % 6);
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(rank)), strides(sizes.size());
  for (auto& s : sizes) s = r.extent();
  for (auto& s : strides) s = r.extent();
  static float buffer[1 << 10];

  // Constructors: the vector, pointer and (for rank <= 6) contiguous forms.
  for (int form = 0; form < 3; ++form) {
    try {
      TensorView v = form == 0   ? TensorView(buffer, dt, Device::cpu(), sizes, strides)
                     : form == 1 ? TensorView(buffer, dt, Device::cpu(), rank, sizes.data(), strides.data())
                                 : TensorView(buffer, dt, Device::cpu(), sizes);
      __int128 n = 0, span = 0;
      const std::int64_t* st = v.strides;
      if (!reference_extent(v.rank, v.sizes, st, dtype_size(v.dtype), &n, &span))
        fail("a constructor accepted a view whose extent does not fit");
      if (v.numel() != n || v.span_bytes() != span) fail("numel or span_bytes disagree with the 128-bit count");
      (void)v.describe();
      (void)v.is_contiguous();
      (void)v.layout();
    } catch (const Error&) {
    }
  }

  // Tensor::empty/zeros: an oversized request is an Error; small ones are allocated.
  {
    const std::vector<std::int64_t>& dense = sizes;
    __int128 n = 1;
    bool ok = rank <= kMaxRank;
    for (auto s : dense) {
      if (s < 0) ok = false;
      n *= s < 0 ? 0 : s;
      if (n > (__int128{1} << 62)) n = __int128{1} << 62;
    }
    __int128 product = 1;  // the library also refuses sizes whose product (0 counted as 1) overflows
    for (auto s : dense) product = std::min<__int128>(product * (s > 1 ? s : 1), __int128{1} << 64);
    const bool bounded = product <= INT64_MAX;
    const bool small = ok && bounded && n * 8 <= (1 << 22);
    const bool huge = ok && n * static_cast<__int128>(dtype_size(dt)) > (__int128{1} << 58);
    if (small || huge || !ok) {
      try {
        Tensor t = r.u8() % 2 ? Tensor::zeros(dense, dt) : Tensor::empty(dense, dt);
        if (huge) fail("Tensor::empty allocated a request above 2^58 bytes");
        if (static_cast<__int128>(t.nbytes()) != n * static_cast<__int128>(dtype_size(dt)))
          fail("Tensor::empty's byte count disagrees with the 128-bit count");
      } catch (const Error& e) {
        if (small) {
          std::fprintf(stderr, "tensor_fuzz: %s\n", e.what());
          fail("Tensor::empty refused a small valid request");
        }
      }
    }
  }

  // An op on a view built field by field (bypassing the constructors): within the buffer it may
  // run; an extent past int64 must be refused.
  if (rank == 4) {
    TensorView x;
    x.data = buffer;
    x.dtype = DType::kFloat32;
    x.rank = 4;
    for (int d = 0; d < 4; ++d) {
      x.sizes[d] = sizes[static_cast<std::size_t>(d)];
      x.strides[d] = strides[static_cast<std::size_t>(d)];
    }
    __int128 n = 0, span = 0;
    const bool fits = reference_extent(4, x.sizes, x.strides, 4, &n, &span);
    const bool in_buffer = fits && span <= static_cast<__int128>(sizeof(buffer)) / 2;
    if (in_buffer || !fits) {
      static float out[1 << 10];
      TensorView y = x;
      y.data = out;
      const std::int64_t C = x.sizes[1] < 0 ? 0 : x.sizes[1];
      std::vector<float> scale(static_cast<std::size_t>(C > 64 ? 1 : C), 1.0f), shift(scale.size(), 0.0f);
      const TensorView s(scale.data(), DType::kFloat32, Device::cpu(), {static_cast<std::int64_t>(scale.size())});
      const TensorView t(shift.data(), DType::kFloat32, Device::cpu(), {static_cast<std::int64_t>(shift.size())});
      bool threw = false;
      try {
        Context ctx;
        ctx.num_threads = 1;
        frozen_batch_norm_forward(x, s, t, y, FrozenBnEpilogue::kNone, {}, ctx);
      } catch (const Error&) {
        threw = true;
      }
      if (!fits && !threw) fail("frozen_batch_norm_forward accepted a view whose extent does not fit");
    }
  }
  return 0;
}
