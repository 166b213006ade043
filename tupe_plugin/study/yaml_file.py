"""A YAML mapping read from a file: a syntax error, a key given twice or a file that is not a mapping
is one line naming the file, the line and the problem (PyYAML's own message spans several)."""

import yaml
from omegaconf import OmegaConf

BRACKETS = {"{": "}", "[": "]"}


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
    if root is not None and not isinstance(root, yaml.MappingNode):
        what = "a list" if isinstance(root, yaml.SequenceNode) else f"the text {root.value!r}"
        raise YamlFileError(f"{path}: line {root.start_mark.line + 1}: the file holds {what}, not a mapping "
                            f"of keys: write KEY: VALUE lines, e.g. {example}")
    duplicate = _duplicate_key(root)
    if duplicate:
        raise YamlFileError(f"{path}: {duplicate}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True) if root is not None else {}


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
