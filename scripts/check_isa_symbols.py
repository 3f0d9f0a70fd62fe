#!/usr/bin/env python3
"""Checks the CPU instruction-set variants in the library's object files (ctest detops_isa_symbols).

The variants of a kernel file (src/internal/cpu_isa.h) are compiled with AVX2 / AVX-512 inside
one translation unit; everything they instantiate from headers must keep the baseline instruction
set, or the linker may pick an AVX copy of a shared (COMDAT) function for code that runs on any
CPU. So, in every object file given:
  * no global or weak function may contain an AVX register (ymm/zmm): only functions with
    internal linkage (the variants' own) may;
and, with --expect OBJ_SUFFIX=SET (e.g. sync_batch_norm_cpu.cpp.o=zmm), the object whose path ends
with OBJ_SUFFIX must contain such code (the variants were really compiled, and wide).

Usage: check_isa_symbols.py [--objdump objdump] [--nm nm] [--expect SUFFIX=ymm|zmm]... OBJ...
"""

import argparse
import re
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
WIDE = {"ymm": re.compile(r"%ymm\d"), "zmm": re.compile(r"%zmm\d")}
ANY_WIDE = re.compile(r"%[yz]mm\d")


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def exported_functions(nm, obj):
    """Mangled names of the global and weak text symbols defined in obj."""
    names = set()
    for line in run([nm, "--defined-only", obj]).splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("T", "W", "i", "u"):
            names.add(parts[2])
    return names


def wide_functions(objdump, obj):
    """{mangled function name: set of 'ymm'/'zmm' it uses} for the functions using any."""
    out, current = {}, None
    for line in run([objdump, "-d", "--no-show-raw-insn", obj]).splitlines():
        m = FUNC.match(line)
        if m:
            current = m.group(1)
            continue
        if current and ANY_WIDE.search(line):
            regs = out.setdefault(current, set())
            for k, rx in WIDE.items():
                if rx.search(line):
                    regs.add(k)
    return out


def demangle(names):
    try:
        return run(["c++filt"] + list(names)).splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objdump", default="objdump")
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--expect", action="append", default=[], help="OBJ_SUFFIX=ymm|zmm")
    ap.add_argument("objects", nargs="+")
    args = ap.parse_args()

    expects = []
    for e in args.expect:
        suffix, _, reg = e.partition("=")
        if reg not in WIDE:
            ap.error(f"--expect {e!r}: expected SUFFIX=ymm or SUFFIX=zmm")
        expects.append((suffix, reg))

    bad, found = [], {e: False for e in expects}
    for obj in args.objects:
        wide = wide_functions(args.objdump, obj)
        exported = exported_functions(args.nm, obj)
        for name in sorted(set(wide) & exported):
            bad.append((obj, name, sorted(wide[name])))
        for suffix, reg in expects:
            if obj.endswith(suffix) and any(reg in regs for regs in wide.values()):
                found[(suffix, reg)] = True
        print(f"{obj}: {len(wide)} functions with AVX registers, none exported" if not any(b[0] == obj for b in bad)
              else f"{obj}: EXPORTED FUNCTIONS WITH AVX REGISTERS")

    status = 0
    if bad:
        status = 1
        print(f"\n{len(bad)} global or weak functions contain AVX instructions (they must keep the baseline set):")
        for (obj, _, regs), pretty in zip(bad, demangle(b[1] for b in bad)):
            print(f"  {obj}: {pretty} ({'/'.join(regs)})")
    for (suffix, reg), ok in found.items():
        if not ok:
            status = 1
            print(f"\nno object ending with {suffix!r} uses {reg} registers: the variants are missing")
    if status == 0:
        print("ok: AVX code only in functions with internal linkage" +
              (f"; expected variants present ({', '.join(f'{s}={r}' for s, r in expects)})" if expects else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
