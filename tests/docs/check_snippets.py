#!/usr/bin/env python3
"""Checks that every C++ block in README.md and docs/*.md is compiled.

Each fenced block whose info string starts with ``cpp`` must appear, line for
line, in one of the sources under tests/docs/ (the snippet_*.cpp files, which
every preset builds with warnings as errors): the block's lines, with leading
and trailing whitespace stripped, must be a contiguous run of a source's lines
stripped the same way, after the source's lines marked "snippet-context" (the
context that makes a snippet compile: a function around it, a use of a value
it computes) are dropped. A block whose info string also says ``synopsis`` (an
outline of an API, not code to compile) is left out.

    check_snippets.py SOURCE_DIR

Exits 1 and names each block that is not found, with the first of its lines
that no source continues with; prints "N passed, 0 failed" when all are.
"""
import pathlib
import re
import sys

FENCE = re.compile(r"^(`{3,})(.*)$")
CONTEXT = "snippet-context"  # marks a source line that only makes a snippet compile


def blocks(markdown: pathlib.Path):
    """Yields (line number, info string, lines) for each fenced block."""
    lines = markdown.read_text(encoding="utf-8").splitlines()
    at = 0
    while at < len(lines):
        opened = FENCE.match(lines[at])
        if not opened:
            at += 1
            continue
        fence, info = opened.group(1), opened.group(2).strip()
        start = at
        at += 1
        body = []
        while at < len(lines) and not lines[at].startswith(fence):
            body.append(lines[at])
            at += 1
        at += 1
        yield start + 1, info, body


def stripped(lines):
    return [line.strip() for line in lines]


def longest_match(block, source):
    """How many leading lines of block some run of source matches."""
    best = 0
    for start in range(len(source)):
        length = 0
        while (length < len(block) and start + length < len(source)
               and source[start + length] == block[length]):
            length += 1
        best = max(best, length)
        if best == len(block):
            break
    return best


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    sources = {path: stripped(line for line in path.read_text(encoding="utf-8").splitlines()
                              if CONTEXT not in line)
               for path in sorted((root / "tests" / "docs").glob("snippet_*.cpp"))}
    if not sources:
        print("check_snippets: no tests/docs/snippet_*.cpp under " + str(root), file=sys.stderr)
        return 2
    documents = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    passed = failed = 0
    for document in documents:
        for line, info, body in blocks(document):
            words = info.split()
            if not words or words[0] not in ("cpp", "c++") or "synopsis" in words[1:]:
                continue
            block = stripped(body)
            while block and not block[-1]:
                block.pop()
            best = max(longest_match(block, source) for source in sources.values())
            where = f"{document.relative_to(root)}:{line}"
            if best == len(block):
                passed += 1
                continue
            failed += 1
            print(f"{where}: a C++ block that no tests/docs/snippet_*.cpp contains; "
                  f"its line {best + 1} ({block[best]!r}) does not follow", file=sys.stderr)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
