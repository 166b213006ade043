"""A YAML mapping read from a file: a syntax error, a key given twice, a tag that would build an object,
aliases that expand past any config's size or a file that is not a mapping is one line naming the file, the
line and the problem (PyYAML's own message spans several). The file is composed into nodes and checked before
any value is built: a few hundred bytes of nested aliases expand to billions of values."""

import yaml
from omegaconf import OmegaConf

BRACKETS = {"{": "}", "[": "]"}
# The tags of plain data (YAML's safe schema and the merge key <<); a tag such as !!python/object names code.
DATA_TAGS = frozenset(yaml.SafeLoader.yaml_constructors) | {"tag:yaml.org,2002:merge"}
# More values than any config holds: its aliases (*name) are refused before they are expanded.
MAX_VALUES = 10_000


class YamlFileError(ValueError):
    """A file that is not a readable YAML mapping; the message is one line."""


def read_mapping(path, example):
    """The mapping of YAML file ``path`` as plain containers, OmegaConf interpolations resolved (an empty
    file is ``{}``); ``example`` (``archs: [...]``) is a line of such a mapping, for the error."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        raise YamlFileError(f"{path}: {_syntax_problem(error)}") from None
    except RecursionError:
        raise YamlFileError(f"{path}: its sections are nested too deep to read: a study config nests a few "
                            "levels") from None
    if root is not None and not isinstance(root, yaml.MappingNode):
        what = "a list" if isinstance(root, yaml.SequenceNode) else f"the text {root.value!r}"
        raise YamlFileError(f"{path}: line {root.start_mark.line + 1}: the file holds {what}, not a mapping "
                            f"of keys: write KEY: VALUE lines, e.g. {example}")
    problem = _node_problem(root) or _duplicate_key(root)
    if problem:
        raise YamlFileError(f"{path}: {problem}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True) if root is not None else {}


def _children(node):
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _node_problem(root):
    """``line N: ...`` of the first node whose tag is not plain data, of an alias inside the node it names,
    or of aliases expanding the file past :data:`MAX_VALUES` values; None when there is none. The expanded
    size is counted on the composed graph (each shared node once), never by expanding it."""
    sizes, open_nodes, stack = {}, set(), [root]
    while stack:
        node = stack[-1]
        if id(node) in sizes:
            stack.pop()
            continue
        line = node.start_mark.line + 1
        if node.tag not in DATA_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            return (f"line {line}: the tag {tag!r} is not plain data (a study config holds text, numbers, "
                    "lists and mappings): remove it")
        pending = [child for child in _children(node) if id(child) not in sizes]
        if id(node) not in open_nodes:
            open_nodes.add(id(node))
            if any(id(child) in open_nodes for child in pending):
                return f"line {line}: an alias (*name) inside the section it names: write the values out"
            stack.extend(pending)
            continue
        stack.pop()
        sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
        if sizes[id(node)] > MAX_VALUES:
            return (f"line {line}: its aliases (*name) expand to more than {MAX_VALUES} values, more than a "
                    "study config holds: write the values out")
    return None


def _duplicate_key(root):
    """``line N: the key ...`` of the first key given twice in one mapping, or None."""
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in first:
                        return (f"line {key.start_mark.line + 1}: the key {key.value!r} is given twice in "
                                f"its section (first on line {first[key.value]}): keep one")
                    first[key.value] = key.start_mark.line + 1
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def _syntax_problem(error):
    """``line N: what is wrong`` of a PyYAML syntax error, with the fix where the cause is known."""
    mark = error.problem_mark or error.context_mark
    problem = error.problem or error.context or "not valid YAML"
    start = error.context_mark
    opening = start and start.buffer[start.index]
    if opening in BRACKETS and problem.startswith(f"expected ',' or '{BRACKETS[opening]}'"):
        return (f"line {start.line + 1}: the '{opening}' at column {start.column + 1} is not closed "
                f"({problem} at line {mark.line + 1}): close it with '{BRACKETS[opening]}', or separate its "
                "entries with ','")
    if "'\\t'" in problem:
        return (f"line {mark.line + 1}: a tab at column {mark.column + 1}; YAML indents with spaces: replace "
                "the tab with spaces")
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
