"""How far a running job is, from its log: the updates done by its fairseq-train commands, and their rate.

The study reads the lines that a job's commands append to its log (``train.log`` or ``log.txt`` in its
folder) while it runs, from where the log ended when the job started (an earlier attempt's lines say
nothing of this one):

- ``$ COMMAND``, written before each command (:class:`.launchers.CommandsRun`): which of the job's
  commands runs;
- fairseq-train's ``num_updates=N`` (its ``train_inner`` lines, every ``--log-interval`` updates): the
  updates the running command has done;
- the plugin's configuration line of fairseq-train, ``configuration: ..., --max-update N`` (or
  ``--total-num-update N``, a fine-tuning's schedule over its epochs): the updates of a command whose
  count the job does not know ahead.
"""

import os
import re
import shlex

UPDATES = re.compile(r"num_updates[= ](\d+)")
PLANNED = re.compile(r"configuration: .*--(?:max-update|total-num-update) (\d+)\b")


class JobLog:
    """The progress of ``job`` as its log tells it, read anew by :meth:`read` (``now``: the clock of the
    rate)."""

    def __init__(self, job, now):
        self.job, self.now = job, now
        self.path = os.path.join(job.folder, job.log)
        try:
            self.offset = os.path.getsize(self.path)
        except OSError:
            self.offset = 0
        self.rest = b""
        self.commands = {shlex.join(argv): index for index, argv in enumerate(job.commands)}
        self.updated = False   # whether an update count was read: the rate counts from the first
        self.command = None    # index of the running command, once its "$ " line is read
        self.updates = 0       # the updates of the running command
        self.planned = None    # its updates, as its configuration line says
        self.samples = []      # (time read, updates done in all), at each change once an update is read

    def read(self):
        """Read what the log gained since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            self._line(line.decode("utf-8", "replace"))
        done = self.done
        if self.updated and (not self.samples or done != self.samples[-1][1]):
            self.samples.append((self.now(), done))

    def _line(self, line):
        if line.startswith("$ ") and line[2:] in self.commands:
            self.command, self.updates, self.planned = self.commands[line[2:]], 0, None
            return
        planned = PLANNED.search(line)
        if planned:
            self.planned = int(planned[1])
        found = UPDATES.findall(line)
        if found and self.command is not None:
            self.updates, self.updated = int(found[-1]), True

    @property
    def done(self):
        """The updates done by the job's training commands in all, or None before the first command."""
        if self.command is None:
            return None
        before = [step.updates or 0 for index, step in self.job.training.items() if index < self.command]
        return sum(before) + (self.updates if self.command in self.job.training else 0)

    @property
    def total(self):
        """The updates the job trains in all: as its training commands declare them, else (one command
        of unknown count) as the running command's configuration line says; None when not known."""
        counts = [step.updates for step in self.job.training.values()]
        if counts and None not in counts:
            return sum(counts)
        return self.planned if len(counts) == 1 and self.command in self.job.training else None

    def rate(self):
        """Updates per second since the first update read in this attempt, or None before a second."""
        if len(self.samples) < 2:
            return None
        (first, before), (last, now) = self.samples[0], self.samples[-1]
        return (now - before) / (last - first) if last > first and now > before else None

    def seconds_per_token(self):
        """Seconds per token trained, from the rate and the running command's tokens per update."""
        rate, step = self.rate(), self.job.training.get(self.command)
        if not rate or step is None or not step.tokens_per_update:
            return None
        return 1 / (rate * step.tokens_per_update)

    def describe(self):
        """``update D/T (P%), R updates/s`` or what of it is known; None before the first update."""
        done, total, rate = self.done, self.total, self.rate()
        if not done:
            return None
        text = f"update {done}/{total} ({100 * done // total}%)" if total else f"update {done}"
        return text + (f", {rate:.2f} updates/s" if rate else "")
