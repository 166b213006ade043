"""benchmarks/gpu_checks.sh, the script a lent GPU session runs: every benchmark command in it is one its
script's parser accepts (CUDA pretended), its contenders exist, and each part's time limits stay within the
8 minutes of a session's call. A typo here would otherwise be found only on the GPU."""

import ast
import glob
import os
import re
import shlex

import pytest
import torch
from conftest import REPO
from test_benchmark import benchmark, benchmark_attention, benchmark_train

SCRIPT = os.path.join(REPO, "benchmarks", "gpu_checks.sh")
PART_LIMIT_SECONDS = 480
SCRIPTS = {"benchmarks/benchmark.py": benchmark, "benchmarks/benchmark_attention.py": benchmark_attention,
           "benchmarks/benchmark_train.py": benchmark_train}


def script_lines():
    """The script's lines, continuations joined."""
    with open(SCRIPT, encoding="utf-8") as f:
        return f.read().replace("\\\n", " ").splitlines()


def variables(lines):
    return {match[1]: match[2] for line in lines if (match := re.match(r'^([A-Z]+)="(.*)"$', line))}


def parts(lines):
    """{part: [the argv of each step]} of the functions part1, part2, ..."""
    found, current = {}, None
    for line in lines:
        if match := re.match(r"^part(\d)\(\) \{", line):
            current = found.setdefault(match[1], [])
        elif line == "}":
            current = None
        elif current is not None and line.strip().startswith("step "):
            current.append(shlex.split(line.strip()))
    return found


def steps():
    lines = script_lines()
    names = variables(lines)
    for part, commands in parts(lines).items():
        for argv in commands:
            expanded = []
            for word in argv[2:]:
                expanded += shlex.split(names[word[1:]]) if word[1:] in names else [word]
            yield part, int(argv[1]), expanded


def test_the_script_has_two_parts_of_steps():
    assert sorted({part for part, _, _ in steps()}) == ["1", "2"]


@pytest.mark.parametrize("part", ["1", "2"])
def test_each_part_stays_within_a_sessions_call(part):
    assert sum(limit for name, limit, _ in steps() if name == part) <= PART_LIMIT_SECONDS


def test_every_benchmark_command_parses_and_its_contenders_exist(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    checked = set()
    for _, _, argv in steps():
        if argv[0] != "python3" or argv[1] not in SCRIPTS:
            continue
        words = [str(tmp_path / "out") if "$OUTDIR" in word or "$RESULTS" in word else word
                 for word in argv[2:]]
        args = SCRIPTS[argv[1]].parse_args(words)
        if argv[1] == "benchmarks/benchmark.py":
            for name in args.contenders:
                benchmark.check_contender(name)
        checked.add(argv[1])
    assert checked == set(SCRIPTS)


def test_the_gpu_tests_step_runs_every_test_marked_gpu_as_make_test_gpu_does():
    (argv,) = [argv for _, _, argv in steps() if argv[1:3] == ["-m", "pytest"]]
    assert "$GPU_TESTS" in argv and argv[argv.index("-m", 3) + 1] == "gpu"
    assert 'GPU_TESTS=$(grep -l "pytest.mark.gpu" tests/test_*.py)' in script_lines()


def test_every_test_marked_gpu_is_in_a_file_the_script_finds():
    for path in glob.glob(os.path.join(REPO, "tests", "test_*.py")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        marked = [node for node in ast.walk(ast.parse(text))
                  if isinstance(node, ast.Attribute) and node.attr == "gpu"
                  and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"]
        assert not marked or "pytest.mark.gpu" in text, path
