#!/usr/bin/env python3
"""Mutation check of the CUDA step sequences (issue 28): each mutation edits code the GPU runs
(src/internal/*device*.h: a launch argument, a grid size, a zero fill, the sort's bit range, the
order of two steps, the workspace's carving), rebuilds the op's emulated test and expects it to
fail. Not part of CI (a rebuild per mutation, about 7 s each here); run it after changing a step
sequence or its emulated test:

    scripts/mutate_cuda_steps.py [--build build] [--only roi]   # a configured build with tests

Each file is restored after its mutation, also when the script is interrupted. Equivalent
mutants are left out: flipping a thread-order flag (phase 3's, the atomic scatter's) changes which
thread writes which element, not any element's sum order, so no result can show it; a larger
sentinel than needed still sorts last and is skipped; FrozenBatchNorm2d's generic bodies where the
vector ones fit give the same bits by design, and so do SyncBatchNorm's generic apply in place of
a flat one and a block-stride reduction over fewer blocks.
"""

import argparse
import pathlib
import subprocess
import sys

D = "src/internal/deform_conv2d_device.h"
S = "src/internal/device_steps.h"
SORT = """  dev.sort_pairs(b.temp, b.temp_bytes, b.records.keys, b.sorted_keys, b.records.ids, b.sorted_ids, n,
                 detail::gather_key_bits(sentinel));
"""
PERM = """  dev.launch("gather_permute_records", n,
             GatherPermuteBody<A>{b.sorted_ids, b.records.weights, b.records.sources, b.sorted_weights,
                                  b.sorted_sources});
"""
# (name, file, original text, mutated text): the deform_conv2d sequence and the engine's phases.
DEFORM_CONV2D = [
    ("drop the grad_input zero fill", D, "void zero_grad_input() const { zero_fill<T>(dev, call.grads.grad_input); }",
     "void zero_grad_input() const {}"),
    ("drop the running sums' zero fill", D, "if (n > 0) dev.zero(p, sizeof(A) * static_cast<std::size_t>(n));",
     "(void)p; (void)n;"),
    ("wrong launch argument: columns of the previous image", D, "ColumnBody<T>{f, n0, Q, transposed, col}",
     "ColumnBody<T>{f, n0 > 0 ? n0 - 1 : n0, Q, transposed, col}"),
    ("wrong launch argument: bias sums never stored", D, "BiasBody<T>{go, Q, sums, last,", "BiasBody<T>{go, Q, sums, false,"),
    ("grid one thread short: offsets", D, "images * s().offset_groups * s().taps() * s().positions(),\n               OffsetBody",
     "images * s().offset_groups * s().taps() * s().positions() - 1,\n               OffsetBody"),
    ("shrink the enumerated records", D, 'dev.launch("deform_enumerate", points,', 'dev.launch("deform_enumerate", points - 1,'),
    ("sort by one bit too few", S, "detail::gather_key_bits(sentinel));\n  dev.launch(\"gather_permute",
     "detail::gather_key_bits(sentinel) - 1);\n  dev.launch(\"gather_permute"),
    ("drop the run lengths' zero fill", S, "  dev.zero(b.run_lengths, static_cast<std::size_t>(n) * sizeof(std::int64_t));\n", ""),
    ("swap the sort and the permutation", S, SORT + PERM, PERM + SORT),
    ("swap the scan and the run-length encode", S,
     "  dev.run_length_encode(b.temp, b.temp_bytes, b.sorted_keys, b.run_keys, b.run_lengths, b.num_runs, n);\n  dev.exclusive_sum(b.temp, b.temp_bytes, b.run_lengths, b.run_offsets, n);\n",
     "  dev.exclusive_sum(b.temp, b.temp_bytes, b.run_lengths, b.run_offsets, n);\n  dev.run_length_encode(b.temp, b.temp_bytes, b.sorted_keys, b.run_keys, b.run_lengths, b.num_runs, n);\n"),
    ("no temporary storage reserved", D, "add_gather<A>(l, deform_exact_records(call.shape), temp_bytes);",
     "add_gather<A>(l, deform_exact_records(call.shape), 0);"),
    ("phase 3 over half the runs", D, "static_cast<std::int64_t>(sentinel) + 1);", "static_cast<std::int64_t>(sentinel) + 1) / 2;"),
    #("phase 3 in the other thread order", D, "gather_sum(dev, sa, gather.num_runs, max_runs, channels_innermost(call.grads.grad_input),",
    ("atomic scatter over one row", D, 'dev.launch("deform_scatter", s().rows() * a.Q,', 'dev.launch("deform_scatter", a.Q,'),
    ("gemm grid from the wrong rows per thread", D, "((g.M + detail::kDeformGemmRows - 1) / detail::kDeformGemmRows) * g.N",
     "((g.M + 2 * detail::kDeformGemmRows - 1) / (2 * detail::kDeformGemmRows)) * g.N"),
]

G = "src/internal/grid_sample_device.h"
GRID_SAMPLE = [
    ("drop the grad_input zero fill", G, "    zero_fill<T>(dev, call.grad_input);\n", ""),
    ("forward grid one thread short", G, 'dev.launch("grid_sample_forward", call.output.numel(),',
     'dev.launch("grid_sample_forward", call.output.numel() - 1,'),
    ("wrong launch argument: enumerate the first chunk's images", G, "EnumerateBody<T>{a, n0, sentinel, b.records}",
     "EnumerateBody<T>{a, 0, sentinel, b.records}"),
    ("records of the last chunk sized as a full one", G, "const std::int64_t points = std::min(ch.images, s.N - n0) * s.Ho * s.Wo;",
     "const std::int64_t points = ch.images * s.Ho * s.Wo;"),
    ("sentinel one short", G, "const auto sentinel = static_cast<std::uint64_t>(ch.positions);",
     "const auto sentinel = static_cast<std::uint64_t>(ch.positions) - 1;"),
    ("grad_grid over the first image only", G, 'dev.launch("grid_sample_grad_grid", s.N * s.Ho * s.Wo,',
     'dev.launch("grid_sample_grad_grid", s.Ho * s.Wo,'),
    ("atomic scatter over half the points", G, 'dev.launch("grid_sample_scatter", n,', 'dev.launch("grid_sample_scatter", n / 2,'),
]

M = "src/internal/ms_deform_attn_device.h"
MS_DEFORM_ATTN = [
    ("drop grad_value's zero fill", M, '  dev.launch("msda_zero_value", n,', '  if (false) dev.launch("msda_zero_value", n,'),
    ("records of the first chunk's planes in every chunk", M, "RecordsBody<T, Loc>{a, plane0, sentinel, buf.records}",
     "RecordsBody<T, Loc>{a, 0, sentinel, buf.records}"),
    ("sums aimed at the first chunk's planes", M, "msda_value_target(call, plane0));", "msda_value_target(call, 0));"),
    ("sentinel one short", M, "const auto sentinel = static_cast<std::uint64_t>(planes * sh.S);",
     "const auto sentinel = static_cast<std::uint64_t>(planes * sh.S) - 1;"),
    ("location gradients for the first batch only", M, 'dev.launch("msda_location_grad", sh.B * sh.Q * sh.M * sh.L * sh.P,',
     'dev.launch("msda_location_grad", sh.Q * sh.M * sh.L * sh.P,'),
    ("atomic scatter over one channel", M, 'dev.launch("msda_scatter", sh.B * sh.Q * sh.M * sh.D,',
     'dev.launch("msda_scatter", sh.B * sh.Q * sh.M,'),
    ("forward one thread short", M, 'dev.launch("msda_forward", call.output.numel(),', 'dev.launch("msda_forward", call.output.numel() - 1,'),
]

F = "src/internal/frozen_batch_norm_device.h"
FROZEN_BN = [
    ("vector bodies with the other layout's lanes", F,
     'if (plan.nhwc) dev.launch("frozen_bn_forward_vec", nvec, ForwardVecBody<T, V, kAdd, kRelu, true>{plan.args});',
     'if (plan.nhwc) dev.launch("frozen_bn_forward_vec", nvec, ForwardVecBody<T, V, kAdd, kRelu, false>{plan.args});'),
    ("backward vector grid one vector short", F,
     'else dev.launch("frozen_bn_backward_vec", nvec, BackwardVecBody', 'else dev.launch("frozen_bn_backward_vec", nvec - 1, BackwardVecBody'),
    ("generic forward one thread short", F, 'dev.launch("frozen_bn_forward", n, ForwardBody<T>{p});',
     'dev.launch("frozen_bn_forward", n - 1, ForwardBody<T>{p});'),
    ("the residual dropped from the generic bodies", F, "make_frozen_bn_args<T>(call, kAdd, kRelu);",
     "make_frozen_bn_args<T>(call, false, kRelu);"),
]

R = "src/internal/roi_align_rotated_device.h"
RD = "src/internal/roi_device.h"
ROI_ALIGN_ROTATED = [
    ("count over K entries, not K + 1", R, 'dev.launch("rotated_count", s.K + 1,', 'dev.launch("rotated_count", s.K,'),
    ("every chunk counts the first images' rois", R, "CountBody<A>{rois, s, images, counts}",
     "CountBody<A>{rois, s, detail::ImageRange{0, images.end - images.begin}, counts}"),
    ("records not reset to the sentinel", R, "    gather_init(dev, g, cap, sentinel);\n", ""),
    ("truncated phase 3 over half the runs", R, 'dev.launch("rotated_truncated_gather", max_runs * s.C,',
     'dev.launch("rotated_truncated_gather", max_runs * s.C / 2,'),
    ("truncated buffer not zeroed", RD, "        dev.zero(buf, static_cast<std::size_t>(total) * sizeof(double));\n", ""),
    ("truncated store one element short", RD, 'dev.launch("roi_truncated_store", total,', 'dev.launch("roi_truncated_store", total - 1,'),
    ("roi check starts its first bad row at 0", RD, "dev.copy_to_device(first_bad, &none, sizeof(none));",
     "const unsigned long long zero = 0;\n  dev.copy_to_device(first_bad, &zero, sizeof(zero));"),
    ("sample total over K - 1 rois", RD, "dev.reduce_sum(temp, sum_bytes, counts, sums, K);",
     "dev.reduce_sum(temp, sum_bytes, counts, sums, K - 1);"),
    ("atomic grad_input not zeroed", RD, "      case BackwardMode::kAtomic:\n        zero_fill<T>(dev, grad_input);\n",
     "      case BackwardMode::kAtomic:\n"),
]

A = "src/internal/roi_align_device.h"
ROI_ALIGN = [
    ("slots not initialised", A, '  dev.launch("roi_align_init_slots", cap, InitSlotsBody<A>{b.slots, sentinel});\n', ""),
    ("extras not permuted", A, '  dev.launch("roi_align_permute_extras", cap, PermuteExtrasBody<A>{b.sorted.ids, b.slots, b.sorted});\n', ""),
    ("max pooling's winner test dropped from phase 3", A, "detail::roi_gather_target(ga), ga.active);",
     "detail::roi_gather_target(ga));"),
    ("grad_input zero fill after phase 1 dropped", A, "  zero_fill<T>(dev, call.features);\n  // Phase 1", "  // Phase 1"),
    ("argmax strides dropped from the scatter", A, "a.am = call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0};\n  a.shape = call.shape;\n  a.max_pool = call.max_pool;\n  a.channels_last = channels_innermost(call.pooled);\n  using Add",
     "a.am = Strides4{0, 0, 0, 0};\n  a.shape = call.shape;\n  a.max_pool = call.max_pool;\n  a.channels_last = channels_innermost(call.pooled);\n  using Add"),
    ("float64 truncated phase 3 over half the runs", A, 'dev.launch("roi_align_truncated_gather", max_runs * s.C,',
     'dev.launch("roi_align_truncated_gather", max_runs * s.C / 2,'),
    ("roi check over one row short", A, 'dev.launch("roi_align_check", s.K,', 'dev.launch("roi_align_check", s.K - 1,'),
]

B = "src/internal/sync_batch_norm_device.h"
SYNC_BATCH_NORM = [
    ("chunk units one short (NHWC)", B, 'dev.launch_occupied("sbn_moments_units", units,',
     'dev.launch_occupied("sbn_moments_units", units - 1,'),
    ("exponent words preset to 0", B, "sbn_device::FillWordsBody{call.out, detail::kSbnZeroExponent}",
     "sbn_device::FillWordsBody{call.out, 0}"),
    ("exact reduce with the count off by one", B, "ExactReduceBody{detail::SbnExactReduceArgs{a.partial, g, count, record}}",
     "ExactReduceBody{detail::SbnExactReduceArgs{a.partial, g, count + 1, record}}"),
    ("num_batches_tracked bumped before finalize reads it", B,
     """  sbn_device::with_depth(args.ranks, [&](auto depth) {
    dev.launch("sbn_finalize", args.channels, sbn_device::FinalizeBody<decltype(depth)::value>{args});
  });
  if (args.num_batches_tracked && args.running_mean.data)  // after every channel has read it
    dev.launch("sbn_bump_batches", 1, sbn_device::BumpBatchesBody{args});""",
     """  if (args.num_batches_tracked && args.running_mean.data)
    dev.launch("sbn_bump_batches", 1, sbn_device::BumpBatchesBody{args});
  sbn_device::with_depth(args.ranks, [&](auto depth) {
    dev.launch("sbn_finalize", args.channels, sbn_device::FinalizeBody<decltype(depth)::value>{args});
  });"""),
    ("gradient coefficients for C - 1 channels", B, 'dev.launch("sbn_grad_coef", g.C,', 'dev.launch("sbn_grad_coef", g.C - 1,'),
    ("backward exponents from the forward pass", B,
     "if (backward) sbn_device::order_free<T, detail::SbnOrderFreePass::kScalesBackward>",
     "if (backward) sbn_device::order_free<T, detail::SbnOrderFreePass::kScalesForward>"),
    ("tree merging the other ping-pong buffer first", B,
     "TreeBody<SbnSums>{detail::SbnTreeArgs<SbnSums>{a, b, g, count, record}}",
     "TreeBody<SbnSums>{detail::SbnTreeArgs<SbnSums>{b, a, g, count, record}}"),
]

SUITES = [("detops_deform_conv2d_emulated_test", DEFORM_CONV2D), ("detops_grid_sample_emulated_test", GRID_SAMPLE),
          ("detops_sync_batch_norm_emulated_test", SYNC_BATCH_NORM),
          ("detops_roi_emulated_test", ROI_ALIGN),
          ("detops_ms_deform_attn_emulated_test", MS_DEFORM_ATTN),
          ("detops_frozen_batch_norm_emulated_test", FROZEN_BN),
          ("detops_roi_emulated_test", ROI_ALIGN_ROTATED)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", default="", help="only the suites whose target contains this text (e.g. roi)")
    args = ap.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    build = (root / args.build).resolve()
    missed = 0
    for target, mutations in SUITES:
        if args.only not in target:
            continue
        for name, path, old, new in mutations:
            p = root / path
            text = p.read_text()
            if text.count(old) != 1:
                print(f"{target}: {name}: the original text occurs {text.count(old)} times; update the mutation")
                missed += 1
                continue
            p.write_text(text.replace(old, new))
            try:
                b = subprocess.run(["cmake", "--build", str(build), "--target", target], capture_output=True, text=True)
                if b.returncode != 0:
                    print(f"{target}: {name}: the mutant does not build\n{b.stdout[-1500:]}")
                    missed += 1
                    continue
                r = subprocess.run([str(build / "tests" / target), "--gtest_brief=1"], capture_output=True, text=True)
                caught = r.returncode != 0
                missed += not caught
                print(f"{target}: {name}: {'caught' if caught else 'NOT CAUGHT'} (exit {r.returncode})", flush=True)
            finally:
                p.write_text(text)
        subprocess.run(["cmake", "--build", str(build), "--target", target], capture_output=True)
    print(f"{missed} mutations not caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
