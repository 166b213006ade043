"""Output folders written atomically: built aside, renamed into place only once complete.

Data preparation (``tupe-prepare-glue``, ``tupe-prepare-squad``) writes its folder through
:func:`write_prepared_folder`:

- the files are written into a temporary sibling folder (``OUT.tmp-XXXX``) and renamed to ``OUT`` only
  when everything was written, so a failure or a kill never leaves a half-written ``OUT``;
- ``OUT/.prepared.json`` records a fingerprint of the inputs (content hashes of the files) and settings;
  a later run with the same fingerprint reuses the folder as it is, a run with other inputs or settings
  says what changed, rebuilds it and replaces it;
- a folder without that record (not written by the tool) is never touched: the run stops instead;
- a caller may look at the complete preparation before it is put in place (``accept``; fine-tuning compares
  its data with those of the run it resumes): what that raises leaves ``OUT`` as it was.

:func:`replace_folder_atomically` is the last step on its own, for tools that check what they are about
to replace themselves (the checkpoint converter's ``--force``).
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
from ..user_input.user_errors import UserError

MANIFEST = ".prepared.json"


class PreparedFolderError(UserError, RuntimeError):
    """An output folder that the tool may not write into."""


def file_digest(path, chunk=1 << 20):
    """sha256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(files, settings):
    """What a preparation depends on: ``{name: sha256}`` of the input files and the settings."""
    return {
        "files": {name: file_digest(path) for name, path in sorted(files.items())},
        "settings": json.loads(json.dumps(settings, sort_keys=True)),
    }


def fingerprint_changes(old, new):
    """What differs from the fingerprint ``old`` to ``new``: settings as their flags, files by name."""
    changes = []
    old_settings, new_settings = old.get("settings", {}), new.get("settings", {})
    for key in sorted(set(old_settings) | set(new_settings)):
        before, after = old_settings.get(key), new_settings.get(key)
        if before != after:
            changes.append(f"--{key.replace('_', '-')} {'unset' if before is None else before} -> "
                           f"{'unset' if after is None else after}")
    old_files, new_files = old.get("files", {}), new.get("files", {})
    for name in sorted(set(old_files) | set(new_files)):
        if old_files.get(name) != new_files.get(name):
            flag = {"sentencepiece_model": "--sentencepiece-model", "dict": "--dict"}.get(name)
            changes.append(f"{flag} file changed" if flag else f"{name} file changed")
    return changes


def read_manifest(out):
    """``OUT/.prepared.json`` as a dict, or None when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(out, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def replace_folder_atomically(built, out):
    """Put the complete folder ``built`` at ``out``; a previous ``out`` is removed only afterwards."""
    if not os.path.lexists(out):
        os.rename(built, out)
        return
    parent = os.path.dirname(os.path.abspath(out))
    old = tempfile.mkdtemp(prefix=os.path.basename(out) + ".old-", dir=parent)
    os.rmdir(old)
    os.rename(out, old)
    try:
        os.rename(built, out)
    except BaseException:
        os.rename(old, out)
        raise
    if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old)
    else:
        os.remove(old)


def make_sibling_folder(out, suffix=".tmp-"):
    """A new empty folder next to ``out`` (same file system, so a rename moves it into place), with the
    permissions the user's umask gives a new folder (``mkdtemp`` makes it private, ``drwx------``, which
    colleagues on a shared machine could not read once it is moved into place)."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=os.path.basename(os.path.abspath(out)) + suffix, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    return folder


def write_prepared_folder(out, expected, build, tool, out_flag="--out", accept=None):
    """Build ``out`` with ``build(folder) -> summary`` unless a finished, matching preparation is there.

    Returns ``(summary, reused)``. ``expected`` is the :func:`fingerprint` of this run. Raises
    :class:`PreparedFolderError` when ``out`` exists and was not written by a preparation.
    ``accept(folder)``, when given, is called on the complete preparation (the one reused, or the one built
    aside) before it is put in place: what it raises leaves ``out`` as it was.
    """
    out = os.path.abspath(out)
    if os.path.lexists(out):
        manifest = read_manifest(out)
        if manifest is None:
            if not os.path.isdir(out) or os.path.islink(out) or os.listdir(out):
                raise PreparedFolderError(
                    f"{out_flag} {out} exists and was not written by {tool} (no {MANIFEST} in it); "
                    f"choose another {out_flag} or move that folder away"
                )
        elif manifest.get("fingerprint") == expected:
            if accept is not None:
                accept(out)
            return manifest.get("summary"), True
        else:
            changes = fingerprint_changes(manifest.get("fingerprint") or {}, expected)
            print(f"{tool}: {out_flag} {out} holds a preparation of other inputs or settings "
                  f"({'; '.join(changes) or 'an older format'}): rebuilding it", file=sys.stderr)
    folder = make_sibling_folder(out)
    try:
        summary = build(folder)
        with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
            json.dump({"tool": tool, "fingerprint": expected, "summary": summary}, f, indent=1)
        if accept is not None:
            accept(folder)
        current = read_manifest(out) if os.path.isdir(out) else None
        if current is not None and current.get("fingerprint") == expected:
            shutil.rmtree(folder)  # a concurrent run finished the same preparation first
            return current.get("summary"), True
        if os.path.isdir(out) and not os.path.islink(out) and not os.listdir(out):
            os.rmdir(out)
        replace_folder_atomically(folder, out)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return summary, False
