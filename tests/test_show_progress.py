"""tupe-show-progress: progress over the updates requested (--max-update), not fairseq's epoch."""

import io

import pytest

from tupe_plugin.cli import progress as show_progress

LOG = [
    "2024 | INFO | fairseq_cli.train | begin training epoch 1\n",
    "2024 | INFO | train_inner | epoch 001:     10 / 64 loss=9.1, num_updates=10, lr=1e-4\n",
    "2024 | INFO | train_inner | epoch 001:     20 / 64 loss=8.9, num_updates=20, lr=1e-4\n",
    "2024 | INFO | train | epoch 001 | loss 8.9 | num_updates 20 | lr 1e-4\n",
]


def fake_clock(times):
    times = iter(times)
    return lambda: next(times)


def test_progress_counts_the_requested_updates_with_an_eta():
    out, err = io.StringIO(), io.StringIO()
    show_progress.follow(LOG, 400, out, err, "demo", now=fake_clock([0, 30, 60]))
    assert out.getvalue() == "".join(LOG)  # the log passes unchanged
    assert err.getvalue().splitlines() == [
        "[demo] update 10/400 (2%), elapsed 0:30, ETA 19:30",
        "[demo] update 20/400 (5%), elapsed 1:00, ETA 19:00",  # the epoch summary repeats 20: no new line
    ]


def test_progress_on_a_terminal_rewrites_one_line():
    err = io.StringIO()
    show_progress.follow(LOG, 20, io.StringIO(), err, now=fake_clock([0, 5, 10]), interactive=True)
    assert err.getvalue() == ("\rupdate 10/20 (50%), elapsed 0:05, ETA 0:05\033[K"
                              "\rupdate 20/20 (100%), elapsed 0:10, ETA 0:00\033[K\n")


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59.6, "1:00"), (3725, "1:02:05")])
def test_clock_format(seconds, text):
    assert show_progress.clock(seconds) == text


def test_total_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        show_progress.main(["--total", "0"])
    assert "--total must be at least 1" in capsys.readouterr().err
