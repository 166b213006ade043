"""The package's layout: a root of rooms, terms -> encodings, attention -> encoder, imports downward only,
no import circle, and docs/layout.md listing exactly the modules there are."""

import ast
import os
import re

import pytest
from conftest import REPO
from package_imports import import_circles, import_graph, package_sources

pytestmark = pytest.mark.smoke

GRAPH = import_graph(package_sources())

# what each room may import of the plugin, besides itself
MAY_IMPORT = {
    "tupe_plugin.terms": (),
    "tupe_plugin.user_input": (),
    "tupe_plugin.cli": ("tupe_plugin.user_input",),
    "tupe_plugin.checkpoints": ("tupe_plugin.user_input", "tupe_plugin.fairseq_fixes"),
    "tupe_plugin.downstream": ("tupe_plugin.user_input", "tupe_plugin.cli", "tupe_plugin.checkpoints"),
    "tupe_plugin.encodings": ("tupe_plugin.terms", "tupe_plugin.user_input.user_errors",
                              "tupe_plugin.user_input.command_hints", "tupe_plugin.user_input.cli_types",
                              "tupe_plugin.user_input.memory_limits"),
    "tupe_plugin.attention": ("tupe_plugin.terms",),
    "tupe_plugin.encoder": ("tupe_plugin.terms", "tupe_plugin.encodings", "tupe_plugin.attention",
                            "tupe_plugin.fairseq_fixes", "tupe_plugin.user_input.path_checks",
                            "tupe_plugin.user_input.command_hints"),
}


def test_the_package_root_holds_only_its_init_and_rooms():
    root = os.path.join(REPO, "tupe_plugin")
    loose = sorted(name for name in os.listdir(root)
                   if name not in ("__init__.py", "__pycache__") and not name.startswith(".")
                   and not os.path.isfile(os.path.join(root, name, "__init__.py")))
    assert loose == [], "the package root holds only __init__.py and packages"


def _inside(module, package):
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_a_room_imports_only_the_rooms_below_it(room):
    allowed = (room, *MAY_IMPORT[room])
    modules = [module for module in GRAPH if _inside(module, room)]
    assert len(modules) > 1
    upward = {module: sorted(imported for imported in GRAPH[module]
                             if not any(_inside(imported, below) for below in allowed))
              for module in modules}
    assert not {module: imported for module, imported in upward.items() if imported}


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    circles = import_circles(GRAPH)
    assert not circles, "import circles: " + "; ".join(" -> ".join(circle) for circle in circles)


def test_an_import_back_inside_a_function_is_a_circle():
    sources = {"pkg": "",
               "pkg.report": "from . import results\n\ndef write():\n    from .figures import draw\n",
               "pkg.figures": "from pkg.report import mean\n", "pkg.results": "import json\n"}
    assert import_circles(import_graph(sources)) == [["pkg.figures", "pkg.report", "pkg.figures"],
                                                     ["pkg.report", "pkg.figures", "pkg.report"]]


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_each_room_says_what_it_owns_and_may_import(room):
    docstring = ast.get_docstring(ast.parse(package_sources()[room]))
    assert docstring and "May import" in docstring


def listed_paths(layout_text):
    """The files and folders of docs/layout.md's tree, as paths from the repository root."""
    tree = layout_text.split("```")[1]
    stack, paths = [], set()
    for line in tree.splitlines():
        match = re.match(r"( *)(\S+)", line)
        if not match or not re.search(r"(/|\.py|\.cpp|\.sh|\.yaml)$", match.group(2).rstrip(",")):
            continue
        indent, name = len(match.group(1)), match.group(2).rstrip(",")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + name
        parts = path.rstrip("/").split("/")
        paths.update("/".join(parts[:end]) for end in range(1, len(parts) + 1))
        if name.endswith("/"):
            stack.append((indent, path))
    return paths


def modules_on_disk():
    """Every module (and compiled source) of tupe_plugin/ and benchmarks/; a package's __init__.py counts
    as its folder."""
    found = set()
    for top in ("tupe_plugin", "benchmarks"):
        for folder, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".") and d != "results"]
            relative = os.path.relpath(folder, REPO)
            for name in files:
                if name.endswith((".py", ".cpp", ".sh")):
                    found.add(relative if name == "__init__.py" and relative != "tupe_plugin"
                              else os.path.join(relative, name))
    return found


def test_layout_lists_every_module_and_nothing_that_is_gone():
    with open(os.path.join(REPO, "docs", "layout.md"), encoding="utf-8") as f:
        listed = listed_paths(f.read())
    on_disk = modules_on_disk()
    listed_modules = {path for path in listed if path.startswith(("tupe_plugin", "benchmarks/"))}
    assert sorted(on_disk - listed_modules) == [], "modules missing from docs/layout.md"
    gone = sorted(path for path in listed if not os.path.exists(os.path.join(REPO, path)))
    assert gone == [], "docs/layout.md lists what is gone"


def test_the_layout_parser_reads_nested_folders_and_files():
    text = ("```\npkg/        the package\n  sub/       a room\n    a.py     one\n  b.py       two\n"
            "  c/d.py  three\nother/\n```")
    assert listed_paths(text) == {"pkg", "pkg/sub", "pkg/sub/a.py", "pkg/b.py", "pkg/c", "pkg/c/d.py",
                                  "other"}
