# Tests of the detops_torch package itself: exports, registered op schemas, version, and the torch-version guard that runs before _C.so is loaded.
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import detops_torch
from _util import TORCH_VERSION, _version_tuple

STABLE = getattr(detops_torch._build_info, "ABI", "classic") == "stable"

SOURCE_TREE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
CSRC = os.path.join(SOURCE_TREE, "bindings", "torch", "csrc")


def _defined_ops():
    """The op names bindings/torch/csrc defines (``m.def("name(...``), when the tests run from the
    source tree; None from an installed wheel's test run outside it."""
    if not os.path.isdir(CSRC):
        return None
    names = []
    for path in sorted(glob.glob(os.path.join(CSRC, "*.cpp"))):
        with open(path) as f:
            names += re.findall(r'm\.def\(\s*"(\w+)\(', f.read())
    return names


def _schema(name):
    return getattr(torch.ops.detops, name).default._schema


class ExportsTest(unittest.TestCase):
    def test_public_names(self):
        # Derived from the op packages (detops_torch/_ops/<op>): each one's __all__ is exported at the
        # top level, and each one's parts are what the namespaces of the same name hold.
        from detops_torch import _ops

        for op, package in _ops.packages():
            self.assertTrue(package.__all__, op)
            for name in package.__all__:
                self.assertIn(name, detops_torch.__all__)
                self.assertIs(getattr(detops_torch, name), getattr(package, name), name)
            for kind in _ops.PARTS:
                part = getattr(package, kind, None)
                for name in getattr(part, "__all__", ()):
                    self.assertIs(getattr(getattr(detops_torch, kind), name), getattr(part, name), f"{kind}.{name}")
        for name in ("convert", "compat", "functional", "nn", "distributed", "DetopsError", "DetopsAssertionError",
                     "DetopsOutOfMemoryError", "__version__"):
            self.assertIn(name, detops_torch.__all__)
        for name in detops_torch.__all__:
            self.assertTrue(hasattr(detops_torch, name), name)
        self.assertEqual(len(set(detops_torch.__all__)), len(detops_torch.__all__))
        for name in ("ROIAlign", "RoIAlign", "FrozenBatchNorm2d", "register_mmcv"):
            self.assertTrue(hasattr(detops_torch.compat, name), f"compat.{name}")
        self.assertTrue(callable(detops_torch.convert))
        self.assertTrue(issubclass(detops_torch.SyncBatchNorm, torch.nn.SyncBatchNorm))
        self.assertTrue(issubclass(detops_torch.compat.FrozenBatchNorm2d, detops_torch.FrozenBatchNorm2d))

    def test_version(self):
        from detops_torch import _build_info

        self.assertEqual(detops_torch.__version__, _build_info.DETOPS_VERSION)
        self.assertRegex(detops_torch.__version__, r"^\d+\.\d+\.\d+")
        if _build_info.ABI == "stable":  # one build serves every torch from the floor up
            self.assertGreaterEqual(TORCH_VERSION, _version_tuple(_build_info.TORCH_FLOOR))
            self.assertGreaterEqual(TORCH_VERSION, _version_tuple(_build_info.TORCH_VERSION))
        else:  # a source build serves exactly its torch
            self.assertEqual(_build_info.ABI, "classic")
            self.assertEqual(_build_info.TORCH_VERSION, torch.__version__)
        header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "include", "detops",
                              "version.h")
        if os.path.exists(header):  # running from the source tree: the package reports the library's version
            with open(header) as f:
                text = f.read()
            parts = [re.search(rf"DETOPS_VERSION_{p}\s+(\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
            self.assertEqual(detops_torch.__version__, ".".join(parts))

    def test_every_op_is_registered_with_a_fake_kernel(self):
        from detops_torch import _ops, _registry

        for name in _registry.FAKES:
            self.assertEqual(_schema(name).name, f"detops::{name}")
        self.assertEqual(len(set(_registry.FAKES)), len(_registry.FAKES))
        defined = _defined_ops()
        if defined is not None:  # the source tree: every schema there with a tensor has its fake
            with_tensors = [n for n in defined if any("Tensor" in str(a.type) for a in _schema(n).arguments)]
            self.assertEqual(sorted(with_tensors), sorted(_registry.FAKES))
            with open(os.path.join(SOURCE_TREE, "CMakeLists.txt")) as f:
                cmake_ops = re.search(r"set\(DETOPS_OPS\s+([^)]*)\)", f.read()).group(1).split()
            self.assertEqual(sorted(cmake_ops), sorted(_ops.OPS))  # one op, one package, one .cpp
            for op in _ops.OPS:
                self.assertTrue(os.path.exists(os.path.join(CSRC, op + ".cpp")), op)

    def test_ops_are_registered_with_torchvision_positional_order(self):
        ours = [a.name for a in _schema("roi_align").arguments]
        self.assertEqual(ours[:7], ["input", "rois", "spatial_scale", "pooled_height", "pooled_width",
                                    "sampling_ratio", "aligned"])
        try:
            import torchvision  # noqa: F401

            theirs = [a.name for a in torch.ops.torchvision.roi_align.default._schema.arguments]
            self.assertEqual(ours[:len(theirs)], theirs)
        except ImportError:  # pragma: no cover
            pass
        for a in _schema("roi_align").arguments[7:]:
            self.assertIsNotNone(a.default_value, f"extra argument {a.name} must have a default")

    def test_deform_conv2d_has_torchvision_positional_order(self):
        ours = [a.name for a in _schema("deform_conv2d").arguments]
        self.assertEqual(ours[:14], ["input", "weight", "offset", "mask", "bias", "stride_h", "stride_w", "pad_h",
                                     "pad_w", "dilation_h", "dilation_w", "groups", "offset_groups", "use_mask"])
        try:
            import torchvision  # noqa: F401

            theirs = [a.name for a in torch.ops.torchvision.deform_conv2d.default._schema.arguments]
            self.assertEqual(ours[:len(theirs)], theirs)
        except ImportError:  # pragma: no cover
            pass
        for a in _schema("deform_conv2d").arguments[14:]:
            self.assertIsNotNone(a.default_value, f"extra argument {a.name} must have a default")


class StableAbiTest(unittest.TestCase):
    """The wheel's _C.so uses torch's stable ABI only: no C++ symbol of torch (at::, c10::,
    torch::) is undefined in it, so no torch release can break it by changing one."""

    @unittest.skipUnless(detops_torch._build_info.ABI == "stable", "the classic layer uses torch's C++ API")
    @unittest.skipUnless(shutil.which("nm"), "needs binutils' nm")
    def test_no_torch_cxx_symbol_is_undefined(self):
        library = torch.ops.detops.roi_align.default  # loaded
        self.assertIsNotNone(library)
        path = detops_torch._library_path()
        out = subprocess.run(["nm", "-D", "--undefined-only", "--demangle", path], check=True,
                             capture_output=True, text=True).stdout
        cxx = [line for line in out.splitlines() if re.search(r"\b(at|c10|torch|caffe2)::", line)]
        self.assertEqual(cxx, [], f"{path} needs torch's C++ API")
        self.assertIn("aoti_torch", out)  # the C shim is what it uses instead


class VersionGuardTest(unittest.TestCase):
    """A _C.so built for another torch can abort the interpreter, so __init__ compares versions
    first. Simulated with a temporary copy of the package whose _build_info names another torch
    and whose _C.so is not a library at all: if the guard did not run first, loading it would fail
    with a different error."""

    def _import_copy(self, build_info, with_build_info=True):
        src = os.path.dirname(os.path.abspath(detops_torch.__file__))
        tmp = tempfile.mkdtemp(prefix="detops_guard_")
        self.addCleanup(shutil.rmtree, tmp, True)
        pkg = os.path.join(tmp, "detops_torch_copy")
        os.mkdir(pkg)
        for f in os.listdir(src):
            if f.endswith(".py") and f != "_build_info.py":
                shutil.copy(os.path.join(src, f), pkg)  # follows symlinks
        if with_build_info:
            with open(os.path.join(pkg, "_build_info.py"), "w") as f:
                f.write(build_info)
        with open(os.path.join(pkg, "_C.so"), "wb") as f:
            f.write(b"not a shared library")
        name = "detops_torch_copy"
        spec = importlib.util.spec_from_file_location(name, os.path.join(pkg, "__init__.py"),
                                                      submodule_search_locations=[pkg])
        module = importlib.util.module_from_spec(spec)
        saved = dict(sys.modules)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            for key in list(sys.modules):
                if key not in saved:
                    del sys.modules[key]

    def test_mismatched_torch_version_raises_import_error_naming_both(self):
        with self.assertRaises(ImportError) as ctx:
            self._import_copy('TORCH_VERSION = "0.9.9+other"\nCUDA = False\nDETOPS_VERSION = "0.1.0"\n')
        msg = str(ctx.exception)
        self.assertIn("0.9.9+other", msg)
        self.assertIn(torch.__version__, msg)
        self.assertIn("pip install --no-build-isolation", msg)  # the rebuild command

    @unittest.skipUnless(torch.version.cuda is None, "needs a torch without CUDA")
    def test_cuda_build_on_a_cpu_torch_raises(self):
        with self.assertRaisesRegex(ImportError, "built with CUDA"):
            self._import_copy(f'TORCH_VERSION = "{torch.__version__}"\nCUDA = True\nDETOPS_VERSION = "0.1.0"\n')

    def test_missing_build_info_raises(self):
        with self.assertRaisesRegex(ImportError, "_build_info.py"):
            self._import_copy("", with_build_info=False)

    def test_stable_abi_below_its_floor_raises_import_error_naming_both(self):
        with self.assertRaises(ImportError) as ctx:
            self._import_copy('ABI = "stable"\nTORCH_VERSION = "99.0.0"\nTORCH_FLOOR = "99.0"\nCUDA = False\n'
                              'DETOPS_VERSION = "0.1.0"\n')
        msg = str(ctx.exception)
        self.assertIn("torch >= 99.0", msg)
        self.assertIn(torch.__version__, msg)
        self.assertIn("pip install 'torch>=99.0'", msg)  # the fix

    def test_stable_abi_serves_every_torch_from_its_floor(self):
        # A floor below the running torch and another build version: the guard lets it load.
        with self.assertRaises(OSError):
            self._import_copy('ABI = "stable"\nTORCH_VERSION = "2.11.0"\nTORCH_FLOOR = "1.0"\nCUDA = False\n'
                              'DETOPS_VERSION = "0.1.0"\n')

    @unittest.skipUnless(torch.version.cuda is not None, "needs a torch with CUDA")
    def test_cuda_major_mismatch_raises(self):
        with self.assertRaisesRegex(ImportError, "CUDA 99.0"):
            self._import_copy(f'ABI = "stable"\nTORCH_VERSION = "2.11.0"\nTORCH_FLOOR = "1.0"\nCUDA = True\n'
                              f'CUDA_VERSION = "99.0"\nDETOPS_VERSION = "0.1.0"\n')

    def test_matching_version_reaches_the_loader(self):
        # Control: with the right version the guard passes and the (bogus) library is loaded, so
        # the errors above really come from the guard.
        with self.assertRaises(OSError):
            self._import_copy(f'TORCH_VERSION = "{torch.__version__}"\nCUDA = False\nDETOPS_VERSION = "0.1.0"\n')


if __name__ == "__main__":
    unittest.main()


class ErrorTypeTest(unittest.TestCase):
    """Issue 27: one detops error type that satisfies detops' callers (ValueError) and the peers'
    tests (torchvision's and mmcv's RuntimeError, their Python asserts' AssertionError), the same
    in both layers."""

    def test_the_types(self):
        self.assertTrue(issubclass(detops_torch.DetopsError, ValueError))
        self.assertTrue(issubclass(detops_torch.DetopsError, RuntimeError))
        self.assertTrue(issubclass(detops_torch.DetopsAssertionError, detops_torch.DetopsError))
        self.assertTrue(issubclass(detops_torch.DetopsAssertionError, AssertionError))
        self.assertTrue(issubclass(detops_torch.DetopsOutOfMemoryError, MemoryError))
        self.assertFalse(issubclass(detops_torch.DetopsOutOfMemoryError, detops_torch.DetopsError))

    def test_every_entry_raises_detops_error(self):
        # The op library's C++ errors (ValueError in the classic layer, a tagged RuntimeError in
        # the stable one) and the Python checks reach the caller as DetopsError.
        x = torch.randn(2, 4, 8, 8)
        rois = torch.tensor([[0.0, 0, 0, 3, 3]])
        grid = torch.rand(2, 3, 3, 2) * 2 - 1
        cases = {
            "roi_align mode": lambda: detops_torch.roi_align(x, rois, 2, backward_mode="bogus"),
            "roi_align op": lambda: detops_torch.roi_align(x[0], rois, 2),
            "RoIAlign": lambda: detops_torch.RoIAlign(2, 1.0, 2)(x[0], rois),
            "roi_align_rotated": lambda: detops_torch.roi_align_rotated(x, torch.zeros(1, 6), 2, angle_unit="bogus"),
            "grid_sample": lambda: detops_torch.grid_sample(x, grid[:1], align_corners=False),
            "ms_deform_attn": lambda: detops_torch.ms_deform_attn(torch.zeros(1, 4, 1, 2), torch.tensor([[2, 3]]),
                                                                  torch.tensor([0]), torch.zeros(1, 1, 1, 1, 1, 2),
                                                                  torch.zeros(1, 1, 1, 1, 1)),
            "deform_conv2d": lambda: detops_torch.deform_conv2d(x, torch.zeros(2, 18, 6, 6), torch.zeros(3, 4, 3, 3),
                                                                stride=(0, 1)),
            "FrozenBatchNorm2d": lambda: detops_torch.FrozenBatchNorm2d(3)(x),
            "frozen_batch_norm": lambda: detops_torch.functional.frozen_batch_norm(x, torch.ones(4), torch.zeros(4),
                                                                                   "bogus"),
        }
        for name, fn in cases.items():
            with self.subTest(name), self.assertRaises(detops_torch.DetopsError):
                fn()

    def test_float_inputs_named_with_the_float_dtypes(self):
        # A bool or complex input named "output" and listed int32/int64 as accepted (issue 27).
        for dtype in (torch.bool, torch.complex64, torch.int32):
            x = torch.zeros(1, 2, 4, 4, dtype=dtype)
            cases = [("input", lambda: detops_torch.roi_align(x, torch.zeros(1, 5), 2)),
                     ("input", lambda: detops_torch.roi_align_rotated(x, torch.zeros(1, 6), 2)),
                     ("input", lambda: detops_torch.grid_sample(x, torch.zeros(1, 2, 2, 2), align_corners=False)),
                     ("input", lambda: detops_torch.deform_conv2d(x, torch.zeros(1, 18, 2, 2),
                                                                  torch.zeros(1, 2, 3, 3, dtype=dtype))),
                     ("value", lambda: detops_torch.ms_deform_attn(torch.zeros(1, 6, 1, 2, dtype=dtype),
                                                                   torch.tensor([[2, 3]]), torch.tensor([0]),
                                                                   torch.zeros(1, 1, 1, 1, 1, 2),
                                                                   torch.zeros(1, 1, 1, 1, 1, dtype=dtype))),
                     ("x", lambda: detops_torch.functional.frozen_batch_norm(x, torch.ones(2), torch.zeros(2)))]
            for arg, fn in cases:
                with self.subTest(dtype=dtype, arg=arg):
                    with self.assertRaises(detops_torch.DetopsError) as caught:
                        fn()
                    message = str(caught.exception)
                    self.assertIn(arg + " has dtype", message)
                    self.assertIn("expected float32, float64, float16 or bfloat16", message)
                    self.assertNotIn("output", message)
                    self.assertNotIn("int64", message)

    def test_peers_assertions_and_messages(self):
        # torchvision asserts the box shapes; its tests expect AssertionError.
        x = torch.rand(1, 1, 8, 8)
        with self.assertRaises(AssertionError):
            detops_torch.roi_align(x, torch.tensor([[0.0, 0, 3, 3]]), (2, 2))
        with self.assertRaises(AssertionError):
            detops_torch.roi_align(x, [torch.tensor([[0.0, 0, 3]])], (2, 2))
        # detectron2 and mmcv assert the rois' columns.
        for layer, columns in ((detops_torch.compat.ROIAlign(2, 1.0, 2), 4), (detops_torch.ROIAlignRotated(2, 1.0, 2), 5),
                               (detops_torch.RoIAlignRotated(2, 1.0), 5)):
            with self.subTest(type(layer).__name__), self.assertRaises(AssertionError):
                layer(x, torch.zeros(1, columns))
        # torchvision's deform_conv2d message fragment, as a RuntimeError.
        layer = detops_torch.DeformConv2d(2, 2, 3, padding=1)
        with self.assertRaisesRegex(RuntimeError, "the shape of the offset"):
            layer(torch.rand(1, 2, 5, 5), torch.rand(1, 2, 5, 5))
        # mmcv's DCNv1 asserts that its im2col step (capped at the batch) divides the batch.
        x, offset = torch.rand(3, 2, 5, 5), torch.zeros(3, 18, 5, 5)
        pack = detops_torch.DeformConv2dPack(2, 2, 3, padding=1, im2col_step=2)
        plain = detops_torch.compat.DeformConv2d(2, 2, 3, padding=1, im2col_step=2)
        for name, run in (("DeformConv2dPack", lambda n: pack(x[:n])), ("DeformConv2d", lambda n: plain(x[:n], offset[:n]))):
            with self.subTest(name):
                with self.assertRaisesRegex(AssertionError, "batch size must be divisible by im2col_step"):
                    run(3)
                run(2)  # 2 % 2 == 0
                run(1)  # the step is capped at the batch: 1 % 1 == 0

    def test_double_backward_raises_detops_error_where_the_layer_can(self):
        x = torch.randn(1, 2, 6, 6, requires_grad=True)
        out = detops_torch.roi_align(x, torch.tensor([[0.0, 0, 0, 4, 4]]), 2)
        g = torch.randn(out.shape, requires_grad=True)
        (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
        # The stable layer's Python autograd raises DetopsError; the classic layer's C++ autograd
        # raises torch's RuntimeError (it cannot raise a Python type): both are RuntimeErrors.
        expected = detops_torch.DetopsError if STABLE else RuntimeError
        with self.assertRaisesRegex(expected, "double backward"):
            gx.sum().backward()

    def test_cpu_out_of_memory_is_not_cuda(self):
        # An adaptive grid too large for memory on the CPU raised torch.cuda.OutOfMemoryError (issue 27).
        with self.assertRaises(MemoryError) as caught:
            detops_torch.roi_align(torch.randn(2, 4, 16, 16), torch.tensor([[0.0, 0, 0, 1e12, 1e12]]), 7)
        self.assertIsInstance(caught.exception, detops_torch.DetopsOutOfMemoryError)
        if not hasattr(torch, "OutOfMemoryError"):  # torch < 2.5: torch.cuda's is the only one
            self.assertNotIsInstance(caught.exception, torch.cuda.OutOfMemoryError)
        message = str(caught.exception)
        for part in ("roi_align", "rois[0]", "4194305x4194305"):
            self.assertIn(part, message)


class PythonLayerTest(unittest.TestCase):
    """What the stable layer does in Python because the stable ABI cannot carry it."""

    def test_nondeterminism_alert_follows_torch_mode(self):
        from detops_torch import _registry

        was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        self.addCleanup(torch.use_deterministic_algorithms, was, warn_only=warn_only)
        torch.use_deterministic_algorithms(False)
        _registry.alert_not_deterministic("detops::x backward")  # off: nothing
        torch.use_deterministic_algorithms(True)
        with self.assertRaisesRegex(RuntimeError, r"detops::x backward does not have a deterministic implementation"):
            _registry.alert_not_deterministic("detops::x backward")
        torch.use_deterministic_algorithms(True, warn_only=True)
        with self.assertWarnsRegex(UserWarning, "backward_mode='exact'"):
            _registry.alert_not_deterministic("detops::x backward")

    def test_tagged_errors_become_the_detops_types(self):
        from detops_torch import _registry

        error = _registry.translated(RuntimeError("[detops:ValueError] detops::op: x is bad"))
        self.assertIsInstance(error, detops_torch.DetopsError)
        self.assertEqual(str(error), "detops::op: x is bad")
        oom = _registry.translated(RuntimeError("[detops:OutOfMemoryError] detops::op: 8 GiB"))
        self.assertIsInstance(oom, detops_torch.DetopsOutOfMemoryError)
        self.assertIsInstance(oom, MemoryError)
        if hasattr(torch, "OutOfMemoryError"):  # torch's device-neutral one (torch >= 2.5)
            self.assertIsInstance(oom, torch.OutOfMemoryError)
        plain = RuntimeError("something else")
        self.assertIs(_registry.translated(plain), plain)
        # The classic layer's types (TORCH_CHECK_VALUE, c10::OutOfMemoryError) too.
        self.assertIsInstance(_registry.translated(ValueError("detops::op: x is bad")), detops_torch.DetopsError)
        torch_oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
        self.assertIsInstance(_registry.translated(torch_oom("detops::op: 8 GiB")), MemoryError)

    def test_errors_through_every_entry_are_value_errors(self):
        # Through the op directly, with and without autograd, and through its backward op.
        x = torch.randn(1, 2, 5, 5, requires_grad=True)
        rois = torch.tensor([[0.0, 0, 0, 3, 3]])
        with self.assertRaisesRegex(ValueError, "backward_mode"):
            torch.ops.detops.roi_align(x, rois, 1.0, 2, 2, 2, True, "bogus")
        with torch.no_grad(), self.assertRaisesRegex(ValueError, "backward_mode"):
            torch.ops.detops.roi_align(x, rois, 1.0, 2, 2, 2, True, "bogus")
        with self.assertRaisesRegex(ValueError, "rois"):
            torch.ops.detops.roi_align(x, rois[:, :4], 1.0, 2, 2, 2, True)
        with self.assertRaisesRegex(ValueError, "grad"):
            torch.ops.detops._roi_align_backward(torch.zeros(1, 2, 2), rois, 1.0, 2, 2, 1, 2, 5, 5, 2, True)
