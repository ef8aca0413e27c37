#!/usr/bin/python3
"""doc_commands.py: every shardc command shown in README.md and docs/*.md is run, and its output
compared with what the doc shows (issue 22: docs that say what the binary does).

  doc_commands.py --shardc BUILD/shardc --root SOURCE_TREE [--list] [FILE.md ...]

What counts as a shown command: a line of a fenced code block that starts with `$ shardc`,
`$ build/shardc`, `shardc` or `build/shardc` followed by a command word (parse, check, explain,
sim, run, build, import, plan, report). After a `$` line, the lines up to the next `$` line or the block's end
are the output the doc shows; a command without `$` shows none. A block's `NAME="..."` line sets
a variable that its later commands' `$NAME` stands for.

How it is compared (the part that does not depend on the machine):
  - a shown output line must equal the actual line once durations (`3.484 ms`, `271.7 ms`,
    `50.6 us`, `1.2 s`) are replaced by a placeholder on both sides, integers equal and every
    other number within 1% (the last digit of a loss may differ with the CPU's BLAS kernels; a `worst error`
    line's figures, rounding noise between two runs, are not compared); a shown line `...` stands
    for any number of lines, and shown output that ends before the actual one is a prefix of it
    (a doc may show the first lines of a long report);
  - without shown output, the command must exit 0, or 1 with only `does not fit` errors (the
    memory verdict is a result, not a failure); never a usage error (2), a signal or another
    diagnostic.

Not run, and so marked in the doc: a command with `...` in it (elided arguments), a synopsis
(`shardc check FILE`: a placeholder in capitals, `[-o FILE]`, a shell `$VARIABLE`), one whose
block is preceded by an HTML comment `<!-- not run by the doc test: REASON -->` (a machine other
than this one, minutes of work), and commands of tools other than shardc.

Commands run in a scratch directory holding `samples`, `stdlib`, `tests`, `bench` and `build`
(links to the source tree's and the build's), so that the paths the docs use resolve and any
file a command writes (`-o`, `--trace`, `--save`) lands there. Exit 1 on any mismatch, naming
the doc, its line and the first differing line.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

COMMANDS = ("parse", "check", "explain", "sim", "run", "build", "import", "plan", "report")
CMD_RE = re.compile(r"^(\$ )?(build/)?shardc (%s)\b" % "|".join(COMMANDS))
SKIP_RE = re.compile(r"<!--\s*not run by the doc test:\s*(.+?)\s*-->")
DURATION_RE = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?\s?(ns|us|µs|ms|s|min|h)\b")
SYNOPSIS_RE = re.compile(r"^(\[.*|[A-Z][A-Z_]*(\.[a-z]+)?)$")  # FILE, EXE, [-o FILE]: a synopsis's words
ASSIGN_RE = re.compile(r'^([A-Z_]+)="([^"$]*)"$')  # LM="-D seq=8 ...": expanded in the block's later commands
TIMEOUT_S = 120


def blocks(path):
    """(line number of the first line, [lines], skip reason or None) of each fenced block; the
    skip reason is that of a marker comment on the last non-blank line before the block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i, prev = [], 0, ""
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            m = SKIP_RE.search(prev)
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((start + 1, body, m.group(1) if m else None))
            prev = ""
        elif lines[i].strip():
            prev = lines[i]
        i += 1
    return out


def commands(path):
    """(line, command text, shown output or None, skip reason or None) per shown command."""
    found = []
    for first, body, skip in blocks(path):
        k, env = 0, {}
        while k < len(body):
            line = body[k]
            v = ASSIGN_RE.match(line)
            if v:
                env[v.group(1)] = v.group(2)
            for name, value in env.items():
                line = line.replace("$" + name, value)
            m = CMD_RE.match(line)
            if not m:
                k += 1
                continue
            dollar = m.group(1) is not None
            cmd_line = first + k
            cmd = line[2:] if dollar else line
            shown = None
            k += 1
            if dollar:
                shown = []
                while k < len(body) and not body[k].startswith("$ "):
                    shown.append(body[k])
                    k += 1
                while shown and not shown[-1].strip():
                    shown.pop()
            found.append((cmd_line, cmd, shown, skip))
    return found


NUMBER_RE = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
NOISE_PREFIXES = ("worst error",)  # rounding noise between two runs: its figures vary with the CPU's BLAS


def norm(s):
    return DURATION_RE.sub("<duration>", s.rstrip())


def same_line(shown, actual):
    """Equal once durations are placeholders, numbers within 1% (the last printed digit of a loss
    or an error may differ with the CPU's BLAS kernels), and noise lines' numbers not compared."""
    a, b = norm(shown).strip(), norm(actual).strip()
    if NUMBER_RE.sub("#", a) != NUMBER_RE.sub("#", b):
        return False
    if a.startswith(NOISE_PREFIXES):
        return True
    for x, y in zip(NUMBER_RE.finditer(a), NUMBER_RE.finditer(b)):
        if "." not in x.group(0) + y.group(0) and "e" not in x.group(0) + y.group(0):
            if x.group(0) != y.group(0):  # integers (counts, sizes, devices) exactly
                return False
            continue
        u, v = float(x.group(0)), float(y.group(0))
        if abs(u - v) > 0.01 * max(abs(u), abs(v)):
            return False
    return True


def strip_comment(cmd):
    """The command without a trailing `# comment` (outside quotes)."""
    try:
        lex = shlex.shlex(cmd, posix=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError:
        return None


def compare(shown, actual):
    """None when the shown output matches the actual, else a message."""
    act = actual.rstrip("\n").split("\n") if actual.strip() else []
    i = 0
    for n, s in enumerate(shown):
        if s.strip() == "...":
            rest = [x for x in shown[n + 1:] if x.strip() != "..."]
            if not rest:
                return None
            # the next shown line must appear later
            while i < len(act) and not same_line(rest[0], act[i]):
                i += 1
            if i == len(act):
                return "shown `%s` after `...` never appears" % shown[n + 1].strip()
            continue
        if i >= len(act):
            return "shown `%s`, the output has ended" % s.strip()
        if not same_line(s, act[i]):
            return "shown:  %s\n      actual: %s" % (s.strip(), act[i].strip())
        i += 1
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardc", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--list", action="store_true", help="list the commands and what is done with each")
    ap.add_argument("docs", nargs="*")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    shardc = os.path.abspath(a.shardc)
    docs = a.docs or [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    scratch = tempfile.mkdtemp(prefix="doc_commands_")
    for d in ("samples", "stdlib", "tests", "bench", "editors"):
        os.symlink(os.path.join(root, d), os.path.join(scratch, d))
    os.mkdir(os.path.join(scratch, "build"))
    os.symlink(shardc, os.path.join(scratch, "build", "shardc"))
    env = dict(os.environ, SHARDC_STDLIB=os.path.join(root, "stdlib"))
    failures, ran, skipped = 0, 0, 0
    for doc in docs:
        rel = os.path.relpath(doc, root)
        for line, cmd, shown, skip in commands(doc):
            where = "%s:%d" % (rel, line)
            argv = strip_comment(cmd)
            if not skip and (argv is None or "..." in argv):
                skip = "elided"
            if not skip and any(SYNOPSIS_RE.match(w) or "$" in w for w in argv):
                skip = "a synopsis"
            if skip:
                skipped += 1
                if a.list:
                    print("%s: not run (%s): %s" % (where, skip, cmd))
                continue
            argv[0] = os.path.join(scratch, "build", "shardc")
            if a.list:
                print("%s: run%s: %s" % (where, " and compared" if shown else "", cmd))
                continue
            try:
                p = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print("FAIL %s: `%s` ran past %d s: mark it `<!-- not run by the doc test: ... -->`" % (where, cmd, TIMEOUT_S))
                failures += 1
                continue
            ran += 1
            why = None
            if p.returncode < 0 or p.returncode >= 2:
                why = "exit %d:\n%s" % (p.returncode, p.stderr.strip()[-2000:])
            elif shown:
                why = compare(shown, p.stdout + (p.stderr if not p.stdout.strip() else ""))
            elif p.returncode == 1:
                errors = [l for l in p.stderr.split("\n") if ": error: " in l]
                if not errors or any("does not fit" not in l for l in errors):
                    why = "exit 1:\n%s" % p.stderr.strip()[-2000:]
            if why:
                failures += 1
                print("FAIL %s: `%s`\n      %s" % (where, cmd, why))
    if not a.list:
        print("%d commands run, %d not run (marked or elided), %d failed" % (ran, skipped, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
