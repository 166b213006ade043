"""The README and docs/*.md hold together: every relative link (and #anchor) resolves, the README fits on a
front page, and every bash block is a command that runs as written (no `[--flag X]`, no `...`)."""

import glob
import os
import re

import pytest
from conftest import REPO

README = os.path.join(REPO, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*(\S*)")


def rel(path):
    return os.path.relpath(path, REPO)


def split_fences(text):
    """(prose lines, [(language, [code lines], first line number)]) of a markdown text."""
    prose, blocks, block = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if block is None and fence:
            block = (fence.group(2).lower(), [], number + 1)
            prose.append("")
        elif block is not None and fence and not fence.group(2):
            blocks.append(block)
            block = None
            prose.append("")
        elif block is not None:
            block[1].append(line)
            prose.append("")
        else:
            prose.append(line)
    assert block is None, "an unclosed code fence"
    return prose, blocks


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, result = {}, set()
    with open(path, encoding="utf-8") as f:
        prose, _ = split_fences(f.read())
    for line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path):
    with open(path, encoding="utf-8") as f:
        prose, _ = split_fences(f.read())
    for number, line in enumerate(prose, 1):
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for match in LINK.finditer(line):
            yield number, match.group(1)


def relative_links():
    for page in PAGES:
        for number, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield pytest.param(page, number, target, id=f"{rel(page)}:{number}:{target}")


@pytest.mark.parametrize("page, number, target", list(relative_links()))
def test_relative_link_resolves(page, number, target):
    path, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    assert os.path.exists(resolved), f"{rel(page)}:{number}: {target} -> {rel(resolved)} does not exist"
    assert os.path.commonpath([resolved, REPO]) == REPO, \
        f"{rel(page)}:{number}: {target} leaves the repository"
    if anchor:
        assert resolved.endswith(".md"), f"{rel(page)}:{number}: an anchor into a file that is not markdown"
        assert anchor in anchors(resolved), (
            f"{rel(page)}:{number}: #{anchor} is no heading of {rel(resolved)} "
            f"(headings: {', '.join(sorted(anchors(resolved)))})")


def test_pages_have_links():
    """The parametrised test above found the links at all (a broken pattern would pass vacuously)."""
    assert len(list(relative_links())) > 30


def test_readme_fits_on_a_front_page():
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_links_every_docs_page():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    for page in PAGES[1:]:
        assert f"({rel(page)})" in text or f"({rel(page)}#" in text, f"README.md does not link {rel(page)}"


def bash_blocks():
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            _, blocks = split_fences(f.read())
        for language, lines, first in blocks:
            if language in ("bash", "sh", "shell", "console"):
                yield pytest.param(page, lines, first, id=f"{rel(page)}:{first}")


# A folder beside the repository that a user's clone does not have; docs must never point there.
OUTSIDE_THE_CLONE = "/".join(("..", "shared"))


@pytest.mark.parametrize("page, lines, first", list(bash_blocks()))
def test_bash_block_runs_as_written(page, lines, first):
    """No optional flags in brackets, no elided arguments, no paths outside the repository's layout."""
    for offset, line in enumerate(lines):
        code = re.sub(r"(^|\s)#.*$", "", line)  # comments may say anything
        where = f"{rel(page)}:{first + offset}: {line.strip()}"
        assert not re.search(r"\[--", code), \
            f"{where}: an optional flag in brackets; give it in prose or a second example"
        assert "..." not in code and "…" not in code, f"{where}: elided arguments; write the command out"
        assert OUTSIDE_THE_CLONE not in code, where
        assert not re.search(r"scripts/(benchmark|gpu_checks)", code), \
            f"{where}: the benchmarks are in benchmarks/"


def test_no_stale_counts_or_internal_references():
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        assert OUTSIDE_THE_CLONE not in text, rel(page)
        assert not re.search(r"\bseed 00\d\b", text), \
            f"{rel(page)}: cite papers by authors, title and arXiv id"
        assert not re.search(r"lists \d+ cases", text), f"{rel(page)}: a count that goes stale"


def test_readme_speed_section_quotes_the_generated_table_and_types_no_measurement():
    """The README's Speed section holds the table benchmarks/report.py generates from the results files
    (tests/test_benchmark_report.py keeps it in step with them) and links the page with every target."""
    with open(README, encoding="utf-8") as f:
        speed = f.read().split("\n## Speed\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"<!-- generated by benchmarks/report\.py: headline -->\n.*?<!-- end generated -->",
                      speed, re.S)
    assert block, "the Speed section holds the generated headline table"
    assert "(docs/benchmarks.md#summary)" in speed
    hand_written = speed.replace(block.group(0), "")
    assert not re.search(r"\d\.\d+ ×", hand_written), "a measured ratio typed by hand"
