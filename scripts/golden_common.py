"""Shared by scripts/gen_golden_*.py: the golden file's number format, its arrays, and the
write-or-check command line (--out-dir, --check) every generator offers."""

import argparse
import os


def fmt(v):
    return repr(float(v))  # shortest round-trip decimal


def emit_array(lines, label, vals, row, as_int=False):
    """`label count`, then the values `row` per line."""
    lines.append("%s %d" % (label, len(vals)))
    for i in range(0, len(vals), row):
        lines.append(" ".join(("%d" % v) if as_int else fmt(v) for v in vals[i:i + row]))


def write_or_check(description, out_name, render):
    """Writes tests/golden/<out_name> (or --out-dir) with render()'s bytes, or with --check
    compares them with the file on disk. Returns the exit status."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                      "golden"))
    ap.add_argument("--check", action="store_true", help="compare with the file on disk instead of writing it")
    args = ap.parse_args()
    path = os.path.normpath(os.path.join(args.out_dir, out_name))
    data = render()
    if args.check:
        with open(path, "rb") as f:
            same = f.read() == data
        print("%s: %s" % (path, "up to date" if same else "DIFFERS"))
        return 0 if same else 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    print("wrote %s (%d bytes)" % (path, len(data)))
    return 0
