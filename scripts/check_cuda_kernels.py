#!/usr/bin/env python3
"""Checks that every CUDA kernel's body runs on the CPU in a test (ctest detops_cuda_kernel_bodies).

No GPU is needed to test a kernel's logic when the kernel is a thin wrapper: its body is one call
into a __host__ __device__ helper, and a CPU test runs that helper over an emulated grid (as
tests/roi_emulated_test.cpp does). What only a GPU can check is then CUB, NCCL, streams and
the hardware. This script lists every __global__ function in cuda/*.cu and cuda/*.cuh (shared
engines such as the gather-backward one) and fails unless either
  (a) its body is a single call statement -- alone, or as the body of a DETOPS_GRID_STRIDE loop,
      after any __shared__ declarations -- into a helper whose name a cpu-labelled test source
      calls (tests/<name>_test.cpp other than *_cuda_test.cpp and large_*, the naming rule of
      tests/CMakeLists.txt, with the tests/ headers they include); or
  (b) it is in ALLOWED below, with the reason it cannot be such a wrapper.
An ALLOWED entry that names no kernel any more, or a kernel that now passes (a), is stale and
fails too, so the list only shrinks. Comments and string literals are ignored; templates,
multi-line signatures, __launch_bounds__ and attributes are parsed.

Usage: check_cuda_kernels.py [--root DIR] [--self-test]
  --self-test  first run the parser's own cases (synthetic sources), then the check.
"""

import argparse
import pathlib
import re
import sys

# "file:kernel" -> why its body is not a helper call that a CPU test runs. Keep each reason about
# what only a GPU has (CUB's device-side outputs, NCCL's gathered buffers), not about work left.
ALLOWED = {
}

# The device interface's one kernel (src/internal/device_steps.h, cuda/cuda_device.cuh): its body
# calls its functor parameter, a step body of src/internal/*device*.h. It passes when a
# cpu-labelled test runs the steps on the emulated device (includes tests/emulated_device.h).
GENERIC = {"cuda_device.cuh:run_body_kernel", "cuda_device.cuh:run_body_occupied_kernel",
           "cuda_device.cuh:run_group_kernel"}
EMULATED_DEVICE = "emulated_device.h"

# CUDA backends (cuda/<op>_cuda.cu) whose steps are not yet written over the device interface:
# they still define or launch kernels themselves (their emulated tests mirror the launches by
# hand). A backend that launches nothing itself is a step sequence and must leave this list; the
# list only shrinks (issue 28).
NOT_YET_STEPS = {
}

GRID_STRIDE = "DETOPS_GRID_STRIDE"
SKIP_CALLS = {"__launch_bounds__", "__attribute__", "alignas", "__declspec", "__maxnreg__", "__cluster_dims__"}


# ---------------------------------------------------------------------------------------------
# Lexing: comments and preprocessor lines blanked, string/char literal contents blanked, newlines
# kept (so offsets map to the original line numbers).

def strip_source(text):
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor directive, with its continuation lines
            while i < n:
                if text[i] == "\n" and text[i - 1] != "\\":
                    break
                out.append("\n" if text[i] == "\n" else " ")
                i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # a digit separator: 1'000'000
                out.append(" ")
                i += 1
                continue
            m = re.match(r'R"([^()\s]{0,16})\(', text[i - 1:i + 20]) if c == '"' and i > 0 and text[i - 1] == "R" else None
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                end = n if end < 0 else end + len(m.group(1)) + 2
            else:
                end = i + 1
                while end < n and text[end] != c:
                    end += 2 if text[end] == "\\" else 1
                end = min(end + 1, n)
            out.append(c + "".join("\n" if ch == "\n" else " " for ch in text[i + 1:end - 1]) + c)
            i = end
            continue
        if c == "\n":
            line_start = True
        out.append(c)
        i += 1
    return "".join(out)


def match_close(s, i, open_ch, close_ch):
    """Index just past the bracket that closes the one at s[i] (balanced on that pair)."""
    assert s[i] == open_ch
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_ch:
            depth += 1
        elif s[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError(f"unbalanced {open_ch}{close_ch} at offset {i}")


def skip_ws(s, i):
    while i < len(s) and s[i].isspace():
        i += 1
    return i


# ---------------------------------------------------------------------------------------------
# Kernels

class Kernel:
    def __init__(self, file, line, name, body):
        self.file, self.line, self.name, self.body = file, line, name, body
        self.helper = None     # the called helper, as written (qualified, without template arguments)
        self.problem = None    # why the body is not a single helper call
        self.tests = []        # cpu-labelled test files that call the helper


def find_kernels(text, file):
    """Every __global__ function definition in text (already stripped)."""
    kernels = []
    for m in re.finditer(r"\b__global__\b", text):
        i = m.end()
        name = None
        while i < len(text):
            if text[i] == "[" and text.startswith("[[", i):
                i = match_close(text, i, "[", "]")
                continue
            if text[i] in ";{}":
                break  # not a function: a macro defining __global__, or malformed
            if text[i] == "(":
                before = re.search(r"([A-Za-z_]\w*)\s*$", text[:i])
                ident = before.group(1) if before else None
                if ident in SKIP_CALLS or ident is None:
                    i = match_close(text, i, "(", ")")
                    continue
                name = ident
                break
            i += 1
        if name is None:
            continue
        i = skip_ws(text, match_close(text, i, "(", ")"))
        while i < len(text) and text[i] not in "{;":  # const, noexcept, trailing attributes
            i += 1
        if i >= len(text) or text[i] == ";":
            continue  # a declaration; the definition is found on its own
        end = match_close(text, i, "{", "}")
        kernels.append(Kernel(file, text.count("\n", 0, m.start()) + 1, name, text[i + 1:end - 1]))
    return kernels


def split_statements(body):
    """Top-level statements of a block body: (text, is_block) pairs. A DETOPS_GRID_STRIDE(...)
    loop header and the statement after it form one statement."""
    stmts, i, n = [], skip_ws(body, 0), len(body)
    while i < n:
        start = i
        m = re.match(GRID_STRIDE + r"\s*\(", body[i:])
        if m:
            i = skip_ws(body, match_close(body, i + m.end() - 1, "(", ")"))
        if i < n and body[i] == "{":
            i = match_close(body, i, "{", "}")
        else:
            depth = 0
            while i < n:
                c = body[i]
                if c in "([{":
                    depth += 1
                elif c in ")]}":
                    depth -= 1
                elif c == ";" and depth == 0:
                    i += 1
                    break
                i += 1
        stmts.append(body[start:i].strip())
        i = skip_ws(body, i)
    return [s for s in stmts if s and s != ";"]


CALLEE = re.compile(r"(?:::\s*)?[A-Za-z_]\w*(?:\s*::\s*(?:template\s+)?[A-Za-z_]\w*)*")


def single_call(stmt):
    """The callee of a statement that is one call (`f(...);`, `ns::f<T, 2>(...);`), else None."""
    m = CALLEE.match(stmt)
    if not m:
        return None
    callee = re.sub(r"\s+", "", re.sub(r"::\s*template\s+", "::", m.group(0)))
    if callee.split("::")[-1] in ("return", "if", "for", "while", "do", "switch", "const", "auto", "sizeof"):
        return None
    i = skip_ws(stmt, m.end())
    if i < len(stmt) and stmt[i] == "<":
        depth = 0
        while i < len(stmt):
            depth += {"<": 1, ">": -1}.get(stmt[i], 0)
            if stmt[i] == "(":
                i = match_close(stmt, i, "(", ")") - 1
            i += 1
            if depth == 0:
                break
        i = skip_ws(stmt, i)
    if i >= len(stmt) or stmt[i] != "(":
        return None
    try:
        end = match_close(stmt, i, "(", ")")
    except ValueError:
        return None
    return callee if stmt[end:].strip() == ";" else None


def analyse(k):
    stmts = [s for s in split_statements(k.body) if not re.match(r"(extern\s+)?__shared__\b", s)]
    if len(stmts) != 1:
        k.problem = f"the body has {len(stmts)} statements, not one call"
        return
    stmt = stmts[0]
    m = re.match(GRID_STRIDE + r"\s*\(", stmt)
    if m:
        stmt = stmt[match_close(stmt, m.end() - 1, "(", ")"):].strip()
    while stmt.startswith("{") and stmt.endswith("}"):
        inner = split_statements(stmt[1:-1])
        if len(inner) != 1:
            k.problem = f"the loop body has {len(inner)} statements, not one call"
            return
        stmt = inner[0]
    callee = single_call(stmt)
    if callee is None:
        k.problem = "the body is not a call: " + " ".join(stmt.split())[:90]
        return
    k.helper = callee


# ---------------------------------------------------------------------------------------------
# CPU tests

def cpu_test_sources(tests_dir):
    """tests/<name>_test.cpp with label cpu by tests/CMakeLists.txt's naming rule."""
    return sorted(p for p in tests_dir.glob("*_test.cpp")
                  if not p.name.endswith("_cuda_test.cpp") and not p.name.startswith("large_"))


def test_text(path, tests_dir, seen=None):
    """A test source with the tests/ headers it includes (recursively), stripped."""
    seen = set() if seen is None else seen
    if path in seen:
        return ""
    seen.add(path)
    raw = path.read_text(encoding="utf-8", errors="replace")
    text = strip_source(raw)
    for inc in re.findall(r'^\s*#\s*include\s*"([^"]+)"', raw, re.M):
        if pathlib.PurePosixPath(inc).name == EMULATED_DEVICE:
            text += "\n" + EMULATED_DEVICE  # the test runs step sequences on the emulated device
        for base in (path.parent, tests_dir):
            cand = (base / inc).resolve()
            if cand.is_file() and tests_dir.resolve() in cand.parents:
                text += "\n" + test_text(cand, tests_dir, seen)
                break
    return text


def calls(text, helper):
    """Whether text calls the helper by its unqualified name (f(...) or f<...>(...))."""
    name = helper.split("::")[-1].strip()
    return re.search(r"(?<![\w.>])" + re.escape(name) + r"\s*[<(]", text) is not None


# ---------------------------------------------------------------------------------------------
# The check

def check(kernels, tests, allowed):
    """Judges every kernel and allow-list entry: a list of (verdict, name, report line), verdict
    "ok", "allow" or "FAIL"; name the kernel's, or the entry's key for a missing kernel."""
    results = []
    names = {f"{k.file.name}:{k.name}" for k in kernels}
    for k in kernels:
        analyse(k)
        if f"{k.file.name}:{k.name}" in GENERIC and k.helper:
            k.helper = f"{k.helper} (a step body)"
            k.tests = [rel for rel, text in tests if EMULATED_DEVICE in text]
        elif k.helper:
            k.tests = [rel for rel, text in tests if calls(text, k.helper)]
    width = max([len(f"{k.file.as_posix()}:{k.line} {k.name}") for k in kernels] + [10])
    for k in kernels:
        key, where = f"{k.file.name}:{k.name}", f"{k.file.as_posix()}:{k.line} {k.name}".ljust(width)
        passes = bool(k.helper and k.tests)
        if key in allowed and passes:
            results.append(("FAIL", k.name, f"{where} -> {k.helper} -> {', '.join(k.tests)}: stale allow-list "
                                            f"entry {key!r} (the kernel now passes; remove the entry)"))
        elif key in allowed:
            results.append(("allow", k.name, f"{where} -> allow-listed: {allowed[key]}"))
        elif passes:
            results.append(("ok", k.name, f"{where} -> {k.helper} -> {', '.join(k.tests)}"))
        else:
            why = k.problem or f"no cpu-labelled test calls {k.helper.split('::')[-1]}"
            results.append(("FAIL", k.name, f"{where} -> {k.helper}: {why}" if k.helper else f"{where}: {why}"))
    for key in sorted(set(allowed) - names):
        results.append(("FAIL", key, f"stale allow-list entry {key!r}: no such __global__ function ({allowed[key]})"))
    return results


def check_backends(cuda_dir, root):
    """Every CUDA backend (cuda/<op>_cuda.cu) is a step sequence over the device interface: it
    defines no __global__ function and launches nothing itself (no <<<), or it is in NOT_YET_STEPS."""
    results = []
    backends = sorted(p for p in cuda_dir.glob("*_cuda.cu"))
    for cu in backends:
        text = strip_source(cu.read_text(encoding="utf-8", errors="replace"))
        own = bool(re.search(r"\b__global__\b", text)) or "<<<" in text
        rel = cu.relative_to(root).as_posix()
        if not own and cu.name in NOT_YET_STEPS:
            results.append(("FAIL", cu.name, f"{rel}: a step sequence now: remove it from NOT_YET_STEPS"))
        elif not own:
            results.append(("ok", cu.name, f"{rel}: a step sequence over the device interface"))
        elif cu.name in NOT_YET_STEPS:
            results.append(("allow", cu.name, f"{rel}: not yet a step sequence ({NOT_YET_STEPS[cu.name]})"))
        else:
            results.append(("FAIL", cu.name, f"{rel}: defines or launches kernels itself; write its steps over the "
                                             "device interface (src/internal/device_steps.h)"))
    for name in sorted(set(NOT_YET_STEPS) - {p.name for p in backends}):
        results.append(("FAIL", name, f"stale NOT_YET_STEPS entry {name!r}: no such backend"))
    return results


def run_check(root):
    cuda_dir, tests_dir = root / "cuda", root / "tests"
    kernels = []
    for cu in sorted(list(cuda_dir.glob("*.cu")) + list(cuda_dir.glob("*.cuh"))):
        text = strip_source(cu.read_text(encoding="utf-8", errors="replace"))
        kernels += find_kernels(text, cu.relative_to(root))
    if not kernels:
        print(f"check_cuda_kernels: no __global__ function found under {cuda_dir}", file=sys.stderr)
        return 1
    tests = [(p.relative_to(root).as_posix(), test_text(p, tests_dir)) for p in cpu_test_sources(tests_dir)]
    backend_results = check_backends(cuda_dir, root)
    results = check(kernels, tests, ALLOWED) + backend_results
    print(f"__global__ functions in cuda/*.cu[h] -> helper -> cpu-labelled tests that call it "
          f"({len(tests)} cpu test sources searched)")
    for verdict, _, line in results:
        print(f"  {verdict:<5} {line}")
    count = {v: sum(1 for r in results if r[0] == v) for v in ("ok", "allow", "FAIL")}
    failures = count["FAIL"]
    steps = sum(1 for r in backend_results if r[0] == "ok")
    print(f"{len(kernels)} kernels and {len(backend_results)} backends: {count['ok'] - steps} helper calls run by CPU "
          f"tests, {steps} backends written as step sequences, {count['allow']} allow-listed; {failures} failures")
    if failures:
        print("A failing kernel: move its body into a __host__ __device__ helper (include/detops/detail/) "
              "that a cpu-labelled test runs over an emulated grid, or allow-list it in "
              "scripts/check_cuda_kernels.py with the reason only a GPU can run it.")
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------
# The parser's own cases

SELF_TEST_SOURCE = r'''
// __global__ void in_a_comment(int) { a(); b(); }
/* __global__ void in_a_block_comment() {} */
const char* s = "__global__ void in_a_string() { x(); y(); }";
#define DECL __global__ void from_a_macro()
template <class T, int V,
          bool kAdd>
__global__ void __launch_bounds__(256, 2)
    multi_line(const T* __restrict__ x,
               Args<T, V> a) {
  DETOPS_GRID_STRIDE(i, a.n) detail::helper_one<T, V, kAdd>(i, a);
}
template <class T> __launch_bounds__(128) __global__ void bounds_first(T p) {
  DETOPS_GRID_STRIDE(i, p.n) {
    ns::helper_two(i, p, [](int j) { return j + 1; });  // a lambda argument
  }
}
__global__ void declared_only(int n);
__global__ __attribute__((used)) void with_shared(P p) {
  __shared__ double buf[32];
  helper_three(p, buf);
}
__global__ void two_statements(int* p, int n) {
  const int k = n * 2;
  DETOPS_GRID_STRIDE(i, k) helper_one(i, p);
}
__global__ void loop_with_two(int* p, int n) {
  DETOPS_GRID_STRIDE(i, n) { p[i] = 0; helper_one(i, p); }
}
__global__ void assignment(int* p, int n) { DETOPS_GRID_STRIDE(i, n) p[i] = f(i); }
__global__ void untested(int* p) { helper_untested(p); }
__global__ void glue(int* p) { if (threadIdx.x == 0) *p = 1; }
__global__ void glue_now_fixed(int* p) { helper_three(p); }
__global__ void dependent(P p) { DETOPS_GRID_STRIDE(i, p.n) ns:: template apply_template_body<P>(i, p); }
'''
SELF_TEST_TESTS = r'''
  for (i...) detail::helper_one<float, 4, true>(i, a);
  ns::helper_two(i, p, f);
  helper_three(p, nullptr);
  apply_template_body<Q>(i, q);
  // helper_untested(p);  (a comment does not count)
'''


def self_test():
    text = strip_source(SELF_TEST_SOURCE)
    ks = find_kernels(text, pathlib.PurePosixPath("cuda/x.cu"))
    got = [k.name for k in ks]
    want = ["multi_line", "bounds_first", "with_shared", "two_statements", "loop_with_two", "assignment", "untested",
            "glue", "glue_now_fixed", "dependent"]
    errors = []
    if got != want:
        errors.append(f"kernels found: {got}, expected {want}")
    allowed = {"x.cu:glue": "device flag", "x.cu:glue_now_fixed": "was glue", "x.cu:gone": "removed kernel"}
    results = check(ks, [("tests/t_test.cpp", strip_source(SELF_TEST_TESTS))], allowed)
    verdicts = {name: verdict for verdict, name, _ in results}
    want_verdicts = {"multi_line": "ok", "bounds_first": "ok", "with_shared": "ok", "two_statements": "FAIL",
                     "loop_with_two": "FAIL", "assignment": "FAIL", "untested": "FAIL", "glue": "allow",
                     "glue_now_fixed": "FAIL", "dependent": "ok", "x.cu:gone": "FAIL"}
    if verdicts != want_verdicts:
        errors.append(f"verdicts {verdicts}, expected {want_verdicts}")
    helpers = {k.name: k.helper for k in ks}
    if (helpers.get("multi_line") != "detail::helper_one" or helpers.get("bounds_first") != "ns::helper_two"
            or helpers.get("dependent") != "ns::apply_template_body"):
        errors.append(f"helpers: {helpers}")
    if ks and ks[0].line != 8:
        errors.append(f"multi_line at line {ks[0].line}, expected 8")
    for e in errors:
        print("self-test: " + e, file=sys.stderr)
    if errors:
        print("self-test report was:\n  " + "\n  ".join(f"{v:<5} {ln}" for v, _, ln in results), file=sys.stderr)
        return 1
    print(f"self-test: {len(want)} synthetic kernels parsed and judged as expected")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test and self_test() != 0:
        return 1
    return run_check(pathlib.Path(args.root))


if __name__ == "__main__":
    sys.exit(main())
