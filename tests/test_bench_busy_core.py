"""bench_fio's busy-core probe (with_a_core_busy): a spinning process runs for exactly the
length of the measured run, and is gone afterwards even when the run fails - a spinner
left behind would slow every later run of the bench."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_fio import with_a_core_busy  # noqa: E402


def children() -> set[int]:
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:  # (a thread that ended meanwhile)
            pass
    return found


def spinning(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state in ("R", "S")  # running (or, on a busy machine, waiting for its turn)


def test_the_spinner_runs_during_the_run_and_is_gone_after():
    before = children()
    during = {}

    def run():
        during["pids"] = children() - before
        return "figures"

    assert with_a_core_busy(run) == "figures"
    assert len(during["pids"]) == 1
    (pid,) = during["pids"]
    assert not spinning(pid)
    assert pid not in children()


def test_a_failed_run_still_stops_the_spinner():
    before = children()
    during = {}

    def run():
        during["pids"] = children() - before
        raise RuntimeError("fio failed")

    with pytest.raises(RuntimeError, match="fio failed"):
        with_a_core_busy(run)
    assert len(during["pids"]) == 1
    assert not (during["pids"] & children())
