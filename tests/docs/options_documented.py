#!/usr/bin/python3
"""options_documented.py: every option `shardc --help` lists has a row in docs/language.md's
option table (section 9), and every option that table lists is one `--help` knows.

  options_documented.py SHARDC LANGUAGE_MD

Exit 1 naming each option missing from either side."""
import re
import subprocess
import sys

OPT_RE = re.compile(r"(?<![\w-])(--[a-z][a-z-]*|-[DoV])\b")


def main():
    shardc, doc = sys.argv[1], sys.argv[2]
    help_text = subprocess.run([shardc, "--help"], capture_output=True, text=True).stdout
    opts = help_text.split("\noptions:\n", 1)[1].split("\nexit status:", 1)[0]
    # an option is a word that starts a line of the options block or follows a comma there
    helped = set()
    for line in opts.split("\n"):
        head = line.strip().split("  ")[0] if not line.startswith("    ") else ""
        helped.update(OPT_RE.findall(head))
    table = set()
    for line in open(doc, encoding="utf-8"):
        if line.startswith("| `-"):
            table.update(OPT_RE.findall(line.split("|")[1]))
    bad = 0
    for o in sorted(helped - table):
        print("%s: `%s` is in `shardc --help` but not in the option table" % (doc, o))
        bad += 1
    for o in sorted(table - helped):
        print("%s: the option table has `%s`, which `shardc --help` does not list" % (doc, o))
        bad += 1
    print("%d options in --help, %d in the table, %d differences" % (len(helped), len(table), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
