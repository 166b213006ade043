"""The packages that tupe-plugin's extras install, checked before the code that needs them runs."""

from importlib.util import find_spec


class MissingExtraError(ImportError):
    """A package of an extra of tupe-plugin (``pip install 'tupe-plugin[EXTRA]'``) is not installed."""


def require(package, extra, needed_by):
    """Raise :class:`MissingExtraError` naming the pip command when ``package`` is not installed."""
    if find_spec(package) is None:
        raise MissingExtraError(
            f"{needed_by} needs {package}, which is not installed: pip install 'tupe-plugin[{extra}]'"
        )
