#!/usr/bin/env python3
"""Bytes of a file re-prefilled ahead of an edit, on average, from its finer blocks.

For each source file (2 KiB to 200 KB) matched by the globs given, the file is cut into
line blocks as warmctx's line_block_cuts does (the first cut point 512 bytes or more after
the previous cut), once with is_line_cut (a line that starts with an ASCII letter or digit,
or "@@ ") and once with is_any_line_cut (a line that, after spaces and tabs, goes on with a
printable ASCII character). An edit at a uniformly random byte re-prefills the file from
the start of its block: the expected bytes lost ahead of the edit are sum(len^2 / 2) / size
over the blocks. Prints the mean over the files, per rule, as JSON.

  python3 scripts/line-block-bytes.py 'src/**/*.cpp' 'third_party/llama.cpp/gguf-py/**/*.py'

A re-implementation of include/warmctx/text_model.h's two predicates and
src/context/volatility.cpp's line_block_cuts, for measuring only.
"""
import glob
import json
import sys


def is_line_cut(t, p):
    c = t[p]
    return t[p - 1] == "\n" and ((c.isascii() and c.isalnum()) or t.startswith("@@ ", p))


def is_any_line_cut(t, p):
    if t[p - 1] != "\n":
        return False
    i = p
    while i < len(t) and t[i] in " \t":
        i += 1
    return i < len(t) and " " < t[i] < "\x7f"


def cuts(t, pred, block=512):
    out, last, p = [], 0, block
    while p < len(t):
        if p - last >= block and pred(t, p):
            out.append(p)
            last = p
            p = last + block
            continue
        p += 1
    return out


def main(patterns):
    report = {}
    for pat in patterns:
        files = []
        for f in sorted(glob.glob(pat, recursive=True)):
            with open(f, encoding="utf-8", errors="replace") as fh:
                t = fh.read()
            if 2048 <= len(t) <= 200000:
                files.append(t)
        row = {"files": len(files)}
        for name, pred in (("is_line_cut", is_line_cut), ("is_any_line_cut", is_any_line_cut)):
            lost = []
            for t in files:
                c = [0] + cuts(t, pred) + [len(t)]
                lost.append(sum((c[i + 1] - c[i]) ** 2 / 2 for i in range(len(c) - 1)) / len(t))
            row[name + "_mean_bytes_ahead"] = round(sum(lost) / len(lost)) if lost else None
        report[pat] = row
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: line-block-bytes.py GLOB... (quote the globs)")
    main(sys.argv[1:])
