"""Every command in the bash blocks of README.md and docs/*.md names only flags its tool accepts.

The commands are read as bash reads them (continued lines joined, comments dropped, ``;``/``&&``/``|``
split, ``for ... do``/``done`` and ``VAR=value`` prefixes peeled, ``"${ARRAY[@]}"`` expanded) and each
flag is looked up in the ``--help`` of its tool: the ``tupe-*`` commands, ``fairseq-*`` with the options of
the task, arch, criterion, ... the command names, the Python scripts, and ``make``'s targets, variables and
the script a target passes ``BENCH_ARGS`` to. The help texts come from one interpreter
(tests/command_help.py), kept in .pytest_cache until a Python file of the plugin, benchmarks/, fairseq or
tests/command_help.py changes.
"""

import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import fairseq
import pytest
from conftest import REPO
from test_docs_links import PAGES, rel, split_fences

# Flags that choose which options a fairseq command has.
FAIRSEQ_CHOICES = ("--user-dir", "--task", "--arch", "--criterion", "--optimizer", "--lr-scheduler", "--bpe")
FAIRSEQ_TOOLS = ("fairseq-train", "fairseq-validate", "fairseq-preprocess")
# Tools whose flags they do not know go on to fairseq-train, and the fairseq-train they run.
FINETUNING = ["--user-dir", "tupe_plugin", "--arch", "tupe_r_base", "--optimizer", "adam",
              "--lr-scheduler", "polynomial_decay"]
PASSED_TO_FAIRSEQ_TRAIN = {
    "tupe-finetune-glue": FINETUNING + ["--task", "sentence_prediction", "--criterion",
                                        "sentence_prediction"],
    "tupe-finetune-squad": FINETUNING + ["--task", "squad_span", "--criterion", "squad_span"],
    "scripts/train_distributed_cpu.sh": [],  # its arguments are fairseq-train's
}
# Launchers: the command they run is checked.
WRAPPERS = ("torchrun", "srun")
# Shell built-ins and system tools the pages use; their flags are not checked.
UNCHECKED = ("source", "cp", "tar", "bash")
HELP_CACHE = os.path.join(REPO, ".pytest_cache", "command-help")
FLAG = re.compile(r"^--?[A-Za-z][\w-]*")
SHELL_KEYWORDS = ("do", "then", "else")


def logical_lines(lines):
    """The block's lines with comments dropped, continued lines and multi-line ``NAME=( ... )`` joined."""
    joined, pending = [], ""
    for line in lines:
        code = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        pending = f"{pending} {code.removesuffix(chr(92))}" if pending else code.removesuffix(chr(92))
        open_array = re.match(r"^\s*\w+=\(", pending) and not pending.rstrip().endswith(")")
        if not code.endswith("\\") and not open_array:
            if pending.strip():
                joined.append(pending.strip())
            pending = ""
    assert not pending.strip(), f"an unfinished command: {pending}"
    return joined


def simple_commands(lines, arrays=None):
    """Each command of a block as a list of words; ``arrays`` holds the page's bash arrays so far."""
    arrays, commands = {} if arrays is None else arrays, []
    for line in logical_lines(lines):
        array = re.match(r"^(\w+)=\((.*)\)$", line)
        if array:
            arrays[array.group(1)] = shlex.split(array.group(2))
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = []
        for token in list(lexer) + [";"]:
            if token in (";", "&&", "||", "|", "&"):
                if words:
                    commands.append(words)
                words = []
                continue
            expanded = re.fullmatch(r"\$\{(\w+)\[@\]\}", token)
            words += arrays[expanded.group(1)] if expanded else [token]
    for words in commands:
        while words and (words[0] in SHELL_KEYWORDS or (re.match(r"^\w+=", words[0]) and words[0] != "make")):
            words.pop(0)
        if words and words[0] not in ("for", "done", "fi"):
            yield words


def documented_commands():
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            _, blocks = split_fences(f.read())
        arrays = {}  # a page's later blocks use the arrays of its earlier ones
        for language, lines, first in blocks:
            if language in ("bash", "sh", "shell"):
                for words in simple_commands(lines, arrays):
                    yield f"{rel(page)}:{first}", words


def tool_and_args(words):
    """(tool, its arguments) of a command: launchers and ``python`` peeled off."""
    if words[0] in WRAPPERS:
        known = [i for i, word in enumerate(words) if word.startswith(("fairseq-", "tupe-"))]
        assert known, f"{' '.join(words)}: no fairseq-* or tupe-* command after {words[0]}"
        words = words[known[0]:]
    if words[0].startswith(".venv/bin/"):  # the tools of .venv called by path
        words = [os.path.basename(words[0])] + words[1:]
    if re.match(r"^python3?$", words[0]):
        if words[1] == "-m":
            return ("pytest" if words[2] == "pytest" else f"-m {words[2]}"), words[3:]
        return words[1], words[2:]
    return words[0], words[1:]


def fairseq_choices(args):
    choices = []
    for flag, value in zip(args, args[1:]):
        if flag in FAIRSEQ_CHOICES:
            choices += [flag, value]
    return choices


def help_requests():
    """[tool, choices] of every help text the documented commands need."""
    requests = set()
    for _, words in documented_commands():
        tool, args = tool_and_args(words)
        if tool in FAIRSEQ_TOOLS:
            requests.add((tool, tuple(fairseq_choices(args))))
        elif tool.startswith(("tupe-", "-m ")) or tool.endswith(".py"):
            requests.add((tool, ()))
        if tool in PASSED_TO_FAIRSEQ_TRAIN:
            requests.add(("fairseq-train", tuple(PASSED_TO_FAIRSEQ_TRAIN[tool] or fairseq_choices(args))))
    for script in make_passes_args_to().values():
        requests.add((script, ()))
    return sorted(requests)


def sources_key(requests):
    """A digest of the requests and of every file the help texts come from (path, size, mtime)."""
    digest = hashlib.sha256(json.dumps(requests).encode())
    paths = [os.path.join(REPO, "tests", "command_help.py")]
    for folder in ("tupe_plugin", "benchmarks", os.path.dirname(fairseq.__file__)):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            paths += [os.path.join(root, name) for name in sorted(files) if name.endswith(".py")]
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{path} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@functools.cache
def help_texts():
    """The help texts, from HELP_CACHE while no source file has changed since they were written."""
    requests = [[tool, list(choices)] for tool, choices in help_requests()]
    cached = os.path.join(HELP_CACHE, sources_key(requests) + ".json")
    if os.path.isfile(cached):
        with open(cached, encoding="utf-8") as f:
            return json.load(f)
    proc = subprocess.run([sys.executable, os.path.join("tests", "command_help.py"), json.dumps(requests)],
                          cwd=REPO, env=dict(os.environ, PYTHONWARNINGS="ignore"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    os.makedirs(HELP_CACHE, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=HELP_CACHE, delete=False, encoding="utf-8") as f:
        f.write(proc.stdout)
    os.replace(f.name, cached)
    return json.loads(proc.stdout)


def accepted_flags(tool, choices=()):
    """The options in the usage line of ``tool``'s --help."""
    text = help_texts()[" ".join([tool, *choices])]
    usage = text.split("\n\n")[0]
    assert usage.startswith("usage:"), f"{tool} --help begins {text[:80]!r}"
    return set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", usage))


def flags(args):
    return [arg.split("=")[0] for arg in args if FLAG.match(arg)]


@functools.cache
def makefile():
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        return f.read()


def make_targets():
    return set(re.findall(r"^([\w-]+):", makefile(), flags=re.M))


def make_variables():
    return set(re.findall(r"^(\w+)\s*\??=", makefile(), flags=re.M))


def make_passes_args_to():
    """{target: the script its recipe passes $(BENCH_ARGS) to}."""
    scripts = {}
    for target, recipe in re.findall(r"^([\w-]+):.*\n((?:\t.*\n)+)", makefile(), flags=re.M):
        script = re.search(r"(\S+\.py)\b[^\n]*\$\(BENCH_ARGS\)", recipe)
        if script:
            scripts[target] = script.group(1)
    return scripts


def check_make(where, args):
    targets = [arg for arg in args if not re.match(r"^\w+=", arg)]
    for target in targets:
        assert target in make_targets(), f"{where}: make has no target {target!r}"
    for assignment in (arg for arg in args if re.match(r"^\w+=", arg)):
        name, value = assignment.split("=", 1)
        assert name in make_variables(), f"{where}: the Makefile has no variable {name}"
        if name == "BENCH_ARGS":
            script = make_passes_args_to()[targets[0] if targets else "help"]
            unknown = set(flags(shlex.split(value))) - accepted_flags(script)
            assert not unknown, (
                f"{where}: {script} (make {targets[0]}) accepts no {', '.join(sorted(unknown))}")


def check_command(where, words):
    tool, args = tool_and_args(words)
    if tool == "make":
        return check_make(where, args)
    if tool in UNCHECKED or tool == "pytest":
        if tool == "bash":
            assert os.path.isfile(os.path.join(REPO, args[0])), f"{where}: {args[0]} is not in the repository"
        return
    if tool.endswith((".py", ".sh")):
        assert os.path.isfile(os.path.join(REPO, tool)), f"{where}: {tool} is not in the repository"
    if tool.endswith(".sh"):
        if tool not in PASSED_TO_FAIRSEQ_TRAIN:
            assert not flags(args), f"{where}: {tool} takes no flags"
            return
        accepted = set()
    elif tool in FAIRSEQ_TOOLS:
        accepted = accepted_flags(tool, fairseq_choices(args))
    else:
        assert tool.startswith(("tupe-", "-m ")) or tool.endswith(".py"), f"{where}: a tool unknown here"
        accepted = accepted_flags(tool)
    unknown = [flag for flag in flags(args) if flag not in accepted]
    if tool in PASSED_TO_FAIRSEQ_TRAIN:
        train = accepted_flags("fairseq-train", PASSED_TO_FAIRSEQ_TRAIN[tool] or fairseq_choices(args))
        unknown = [flag for flag in unknown if flag not in train]
    assert not unknown, f"{where}: {tool} accepts no {', '.join(unknown)} (see {tool} --help)"


@pytest.mark.parametrize("where, words", [pytest.param(where, words, id=f"{where}:{words[0]}")
                                          for where, words in documented_commands()])
def test_documented_command_names_only_flags_its_tool_accepts(where, words):
    check_command(f"{where}: {' '.join(words)[:120]}", words)


def test_the_pages_have_commands_of_every_kind():
    """The extraction finds the commands at all (a broken pattern would pass vacuously)."""
    tools = {tool_and_args(words)[0] for _, words in documented_commands()}
    assert {"fairseq-train", "fairseq-validate", "fairseq-preprocess", "tupe-train-spm", "make",
            "benchmarks/benchmark.py"} <= tools


def test_a_flag_the_tool_does_not_have_is_caught():
    documented = {tool_and_args(words)[0]: words for _, words in documented_commands()}
    for tool, flag in (("tupe-analyze", "--probe-samplez"), ("fairseq-train", "--rel-poz"),
                       ("tupe-finetune-glue", "--max-epochz")):
        with pytest.raises(AssertionError, match=f"accepts no {flag}"):
            check_command("here", documented[tool] + [flag, "1"])
        check_command("here", documented[tool])


def test_bash_is_read_as_bash():
    lines = ["A=(--task masked_lm", "   --lr 1e-4)  # comment", "for s in 1 2; do  # loop",
             "    CUDA_VISIBLE_DEVICES=0 fairseq-train d \"${A[@]}\" --seed $s \\",
             "        --cpu && ls", "done"]
    assert list(simple_commands(lines)) == [
        ["fairseq-train", "d", "--task", "masked_lm", "--lr", "1e-4", "--seed", "$s", "--cpu"], ["ls"]]
