#!/usr/bin/env python3
"""Relative links in the repository's Markdown resolve: the file exists and, for `#anchor`, a
heading of that file has GitHub's slug for it. Not in CI; run it after moving docs around.

    tests/scripts/check_doc_links.py        exit status 1 and one line per broken link
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    # GitHub: lower case, drop everything but letters, digits, spaces, hyphens and underscores,
    # spaces to hyphens.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def main():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    broken = []
    for name in files:
        path = ROOT / name
        if not path.exists():
            continue
        for target in LINK.findall(path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{name}: {target}: no heading with that anchor")
    for line in broken:
        print(line)
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
