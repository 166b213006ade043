"""The import graph of the tupe_plugin package, read from its sources with ``ast``: every import statement,
at the top of a module or inside a function, resolved to the plugin module it reads."""

import ast
import os

from conftest import REPO

PACKAGE = "tupe_plugin"


def package_sources(root=os.path.join(REPO, PACKAGE), package=PACKAGE):
    """{module name: source text} of every module under ``root`` (a package's ``__init__`` named as the
    package)."""
    sources = {}
    for folder, _, files in os.walk(root):
        relative = os.path.relpath(folder, root)
        prefix = package if relative == "." else ".".join([package, *relative.split(os.sep)])
        for name in files:
            if name.endswith(".py"):
                module = prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    sources[module] = f.read()
    return sources


def _imported(node, module, is_package, sources):
    """The modules of ``sources`` one import statement of ``module`` reads: ``from pkg import name`` reads
    ``pkg.name`` where that is a module, else ``pkg``; a module outside ``sources`` reads nothing."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module if is_package else module.rpartition(".")[0]
        for _ in range(max(node.level - 1, 0)):
            base = base.rpartition(".")[0]
        base = ".".join(filter(None, [base if node.level else "", node.module]))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in sources else base
                 for alias in node.names]
    found = set()
    for name in names:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph(sources):
    """{module: the other modules of ``sources`` it imports}."""
    packages = {name for name in sources if any(other.startswith(name + ".") for other in sources)}
    graph = {}
    for module, source in sources.items():
        statements = [node for node in ast.walk(ast.parse(source))
                      if isinstance(node, (ast.Import, ast.ImportFrom))]
        graph[module] = set().union(*(_imported(node, module, module in packages, sources)
                                      for node in statements)) - {module}
    return graph


def import_circles(graph):
    """Each module's shortest chain of imports back to itself (``[m, ..., m]``), for the modules in one."""
    circles = []
    for start in sorted(graph):
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            if start in graph[path[-1]]:
                circles.append(path + [start])
                break
            for imported in sorted(graph[path[-1]] - seen):
                seen.add(imported)
                paths.append(path + [imported])
    return circles
