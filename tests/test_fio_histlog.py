"""fio's latency histogram log (write_hist_log, log_hist_msec, log_hist_coarseness): its
file names, its line format and what each line counts, against fio 3.33's where fio is
installed."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.histlog import HistLog
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs
from cxlhm_apps.fio.stats import PLAT_NR, plat_index

FIO = shutil.which("fio")


def _lines(path) -> list[list[int]]:
    return [[int(x) for x in line.split(", ")] for line in path.read_text().splitlines()]


def _run(text: str) -> dict:
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    return report.to_json(run_jobs(jobs, log=lambda _: None), globals_)


@pytest.mark.parametrize("coarseness", [0, 2, 6])
def test_each_line_counts_the_completions_since_the_last_in_fios_bins(tmp_path, monkeypatch, coarseness):
    monkeypatch.chdir(tmp_path)
    out = _run(f"[h]\nfilename={tmp_path / 'd'}\nsize=64m\nrw=randread\nbs=1m\nioengine=cxlhm\ncxlhm_clock=model\n"
               f"cxlhm_block_size=64k\nruntime=1\ntime_based\nwrite_hist_log\nlog_hist_msec=100\n"
               f"log_hist_coarseness={coarseness}\n")
    lines = _lines(tmp_path / "h_clat_hist.1.log")
    assert 8 <= len(lines) <= 10  # (1 s in windows of 100 ms, the first from the first completion on)
    assert all(len(line) == 3 + PLAT_NR // (1 << coarseness) for line in lines)
    assert all(line[1] == 0 and line[2] == 1 << 20 for line in lines)
    times = [line[0] for line in lines]
    # (a line written late moves the next window's start on by 100 ms from where it was due)
    assert all(0 < b - a < 200 for a, b in zip(times, times[1:])) and times[-1] - times[0] >= 100 * (len(times) - 2)
    counted = sum(sum(line[3:]) for line in lines)
    assert 0 < counted <= out["jobs"][0]["read"]["total_ios"]


def test_the_histogram_of_a_line_is_fios_for_its_latencies():
    class Sink(list):
        def writelines(self, lines):
            self.extend(lines)
    log = HistLog(Sink(), msec=10, coarseness=0, counted=True)
    clat = np.array([500, 1500, 70_000, 2_000_000], np.int64)
    log.record(np.zeros(4, np.int64), np.full(4, 4096), clat, elapsed_ms=1)  # (sets the first window's start)
    log.record(np.zeros(4, np.int64), np.full(4, 4096), clat * 3, elapsed_ms=11)
    assert len(log.out) == 1  # the first completion 10 ms on writes the line, counting itself
    bins = [int(x) for x in log.out[0].split(", ")[3:]]
    expected = np.bincount(plat_index(np.append(clat, clat[0] * 3)), minlength=PLAT_NR)
    assert bins == expected.tolist()


def test_without_log_hist_msec_the_log_is_made_and_empty_and_shared_logs_gather(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(f"[a]\nfilename={tmp_path / 'f'}\nsize=256k\nrw=read\nioengine=psync\nwrite_hist_log=x\n")
    assert (tmp_path / "x_clat_hist.1.log").read_text() == ""
    _run(f"[a]\nfilename={tmp_path / 'f'}\nsize=64m\nrw=randread\nbs=1m\nioengine=cxlhm\ncxlhm_clock=model\n"
         "cxlhm_block_size=64k\nruntime=300ms\ntime_based\nnumjobs=2\nper_job_logs=0\nwrite_hist_log=s\n"
         "log_hist_msec=50\n")
    assert not os.path.exists(tmp_path / "s_clat_hist.1.log") and len(_lines(tmp_path / "s_clat_hist.log")) >= 4


@pytest.mark.skipif(FIO is None, reason="real fio is not installed (apt-get install fio)")
def test_lines_have_fios_shape(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = (f"[h]\nfilename={tmp_path / 'f'}\nsize=8m\nrw=randread\nbs=4k\nioengine=psync\nruntime=1\n"
            "time_based\nwrite_hist_log=NAME\nlog_hist_msec=250\nlog_hist_coarseness=1\n")
    subprocess.run([FIO, "--output-format=json", "-"], input=text.replace("NAME", "fio"), capture_output=True,
                   text=True, timeout=60)
    _run(text.replace("NAME", "ours"))
    theirs, ours = _lines(tmp_path / "fio_clat_hist.1.log"), _lines(tmp_path / "ours_clat_hist.1.log")
    assert theirs and ours and {len(x) for x in theirs} == {len(x) for x in ours}
    assert abs(len(theirs) - len(ours)) <= 1 and {x[1:3] for x in map(tuple, theirs)} == {x[1:3] for x in map(tuple, ours)}
