"""The repository tracks source, documentation and listed data only: no file over 1 MB outside the places
that hold data, and no package or archive (every tool comes from the package index, `make install`)."""

import fnmatch
import os
import shutil
import subprocess

import pytest
from conftest import REPO

pytestmark = pytest.mark.smoke

MAX_BYTES = 1_000_000

# The only places a tracked file may be larger than MAX_BYTES, each with its reason.
DATA_PLACES = {
    "docs/figures/": "the figures the docs show, committed so that the pages render without a run",
    "tests/data/": "the tests' fixtures: excerpts of public data sets (SOURCES.md) and old checkpoints",
}

ARCHIVES = ["*.whl", "*.zip", "*.tar.gz", "*.tgz", "*.tar", "*.egg", "*.so", "*.dylib", "*.pyd"]


def tracked_files():
    """The paths of `git ls-files`; fails, never skips, where git cannot list them (CI runs on a clone)."""
    git = shutil.which("git")
    assert git, "git is not on PATH: the repository checks read `git ls-files`; install git to run them"
    listed = subprocess.run([git, "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    assert listed.returncode == 0, \
        f"`git ls-files` failed in {REPO} (not a git clone?): {listed.stderr.strip()}"
    return [path for path in listed.stdout.split("\0") if path]


def test_no_tracked_file_over_1_mb_lies_outside_the_data_places():
    sizes = [(path, os.lstat(os.path.join(REPO, path)).st_size) for path in tracked_files()
             if os.path.lexists(os.path.join(REPO, path))]
    misplaced = [f"{path} ({size:,} bytes)" for path, size in sizes
                 if size > MAX_BYTES and not path.startswith(tuple(DATA_PLACES))]
    assert not misplaced, (f"tracked files over {MAX_BYTES:,} bytes outside {', '.join(DATA_PLACES)}: "
                           f"{', '.join(misplaced)}; keep them out of git or add the place to DATA_PLACES")


def test_no_package_or_archive_is_tracked():
    archives = [path for path in tracked_files()
                if any(fnmatch.fnmatch(os.path.basename(path), pattern) for pattern in ARCHIVES)]
    assert not archives, (f"tracked packages or archives: {', '.join(archives)}; tools come from the package "
                          "index (the Makefile's REQUIREMENTS), built files from the build")


def test_every_data_place_is_a_folder_of_the_repository():
    missing = [place for place in DATA_PLACES if not os.path.isdir(os.path.join(REPO, place))]
    assert not missing, f"DATA_PLACES names folders the repository does not have: {', '.join(missing)}"


def test_without_git_the_checks_fail_naming_git_rather_than_skip(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(AssertionError, match="git is not on PATH"):
        tracked_files()
