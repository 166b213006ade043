"""Refuse a checkpoint whose bytes were damaged after ``torch.save`` wrote it, naming the file.

``torch.save`` writes a zip archive with a CRC-32 of every record, but ``torch.load`` never checks
them: a checkpoint with flipped tensor bytes loads, validates (at a loss of thousands), fine-tunes
and analyses without a word. :func:`verify_checkpoint` checks every record's CRC (zlib speed, about
a second per GB). fairseq's loader calls it when a load fails (:mod:`.unreadable_checkpoints`, every
model); the plugin checks every checkpoint of its own architectures after a successful load too
(:mod:`tupe_plugin.policies.checkpoint_crc`), and its own readers before they read.
Files that are not zip archives are left to :mod:`.unreadable_checkpoints`.
"""

import os
import zipfile

from ..user_input.user_errors import UserError

_verified = {}


class CorruptCheckpointError(UserError, RuntimeError):
    """A checkpoint whose stored checksums do not match its bytes."""


def verify_checkpoint(path):
    """Raise :class:`CorruptCheckpointError` when a record of the zip checkpoint ``path`` fails its CRC."""
    path = os.fspath(path)
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        return
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if _verified.get(key):
        return
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        if not any(info.CRC for info in infos if info.file_size):
            return  # written without checksums (torch.serialization.config.save.compute_crc32 = False)
        try:
            bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            bad = f"? ({err})"
    if bad is not None:
        raise CorruptCheckpointError(
            f"{path} is corrupted: its record {bad} does not match the checksum torch.save wrote "
            "(the file was damaged on disk or in a copy); copy it again, or resume or fine-tune from "
            "another checkpoint of the run (--restore-file SAVE_DIR/checkpoint_EPOCH_UPDATES.pt)"
        )
    _verified[key] = True

