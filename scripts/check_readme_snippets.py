#!/usr/bin/env python3
"""Checks that README.md's C++ and Python snippets are the examples' code (ctest detops_readme_snippets).

Every ```cpp and ```python block of the Markdown file must follow (on the line before its fence)
a tag

    <!-- snippet: examples/01_roi_align.cpp roi_align -->

and equal, line for line, the region of that file between `// [readme:roi_align]` and
`// [/readme:roi_align]` (`# [readme:...]` in a .py file), with the region's common indentation
removed. The examples are built
and run by CI, so a snippet that compiles and works there cannot drift in the README.

Usage: check_readme_snippets.py [--root DIR] [README.md ...]   (default: README.md under DIR,
which defaults to the repository this script lives in). Exit status 0 when every block matches,
1 otherwise, with a diff per mismatch.
"""

import argparse
import difflib
import pathlib
import re
import sys
import textwrap

TAG = re.compile(r"^<!--\s*snippet:\s*(\S+)\s+(\S+)\s*-->\s*$")
FENCE_OPEN = re.compile(r"^```\s*(cpp|c\+\+|python)\s*$")


def region(path: pathlib.Path, name: str) -> list[str]:
    """The lines between // [readme:name] and // [/readme:name] (# in Python), dedented."""
    lines = path.read_text(encoding="utf-8").splitlines()
    mark = "#" if path.suffix == ".py" else "//"
    begin = [i for i, line in enumerate(lines) if line.strip() == f"{mark} [readme:{name}]"]
    end = [i for i, line in enumerate(lines) if line.strip() == f"{mark} [/readme:{name}]"]
    if len(begin) != 1 or len(end) != 1 or end[0] <= begin[0]:
        raise ValueError(f"{path}: expected one '{mark} [readme:{name}]' ... '{mark} [/readme:{name}]' region, "
                         f"found {len(begin)} start and {len(end)} end markers")
    return textwrap.dedent("\n".join(lines[begin[0] + 1:end[0]])).splitlines()


def check(readme: pathlib.Path, root: pathlib.Path) -> int:
    lines = readme.read_text(encoding="utf-8").splitlines()
    errors = blocks = 0
    i = 0
    while i < len(lines):
        if not FENCE_OPEN.match(lines[i]):
            if lines[i].startswith("```"):  # another fence: skip its block whole
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    i += 1
            i += 1
            continue
        start = i + 1
        close = start
        while close < len(lines) and lines[close].rstrip() != "```":
            close += 1
        block = lines[start:close]
        blocks += 1
        where = f"{readme}:{i + 1}"
        tag = TAG.match(lines[i - 1]) if i > 0 else None
        if tag is None:
            print(f"{where}: code block without a '<!-- snippet: examples/FILE NAME -->' tag on the line before")
            errors += 1
        else:
            source = root / tag.group(1)
            try:
                want = region(source, tag.group(2))
            except (OSError, ValueError) as e:
                print(f"{where}: {e}")
                errors += 1
            else:
                if block != want:
                    errors += 1
                    print(f"{where}: differs from {tag.group(1)} region {tag.group(2)}:")
                    sys.stdout.writelines(difflib.unified_diff(
                        [line + "\n" for line in want], [line + "\n" for line in block],
                        fromfile=f"{tag.group(1)} [{tag.group(2)}]", tofile=where))
        i = close + 1
    print(f"check_readme_snippets: {readme}: {blocks} cpp/python blocks, {errors} problems")
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent)
    parser.add_argument("readme", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    readmes = args.readme or [args.root / "README.md"]
    errors = sum(check(r, args.root) for r in readmes)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
