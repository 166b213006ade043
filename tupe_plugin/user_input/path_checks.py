"""What a path is, where a file or a folder is expected: a missing path is "no such file", an existing one
of the other kind "a folder, not a file", so that no error calls an existing path missing."""

import errno
import os


def path_problem(path, expected="file"):
    """None when ``path`` is an existing ``expected`` ("file" or "folder"); else what it is instead, to
    follow ``PATH: `` in an error: "no such file", "a folder, not a file", "a file, not a folder", "a symlink
    loop, not a file", "a broken symlink (to the missing TARGET)"."""
    if os.path.isfile(path) if expected == "file" else os.path.isdir(path):
        return None
    if os.path.islink(path) and not os.path.exists(path):
        try:
            os.stat(path)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return f"a symlink loop, not a {expected}"
        return f"a broken symlink (to the missing {os.readlink(path)})"
    if not os.path.exists(path):
        return f"no such {expected}"
    actual = "folder" if os.path.isdir(path) else "file" if os.path.isfile(path) else "pipe or device"
    return f"a {actual}, not a {expected}"
