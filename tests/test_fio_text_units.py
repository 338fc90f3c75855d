"""significant_figures, kb_base and unit_base in the normal text output, as fio 3.33
writes them: golden figures taken from fio 3.33's own output, and (where real fio is
installed) both fio's text and ours checked line by line against the exact numbers
each run's JSON gives."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import types

import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs
from cxlhm_apps.fio.stats import DirStats, TextUnits, num2str
from cxlhm_apps.fio.steadystate import SteadyState, parse_steadystate

FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="real fio is not installed (apt-get install fio)")

# (significant_figures, kb_base, unit_base=1, figure, number, fio 3.33's text): each row
# read from fio's `IOPS=..., BW=... (...)(.../...msec)` and `io=... (...)` output, the
# number from the same run's JSON (total_ios and io_bytes per runtime, io_bytes)
FIO_FIGURES = [
    (1, 1024, False, "count", 771, "1k"),
    (1, 1024, False, "rate", 3158606, "3MiB/s"),
    (1, 1024, False, "rate_alt", 3158606, "3MB/s"),
    (1, 1024, False, "size", 634880, "1MiB"),
    (2, 1024, True, "count", 5883800, "6M"),
    (2, 1024, True, "rate", 24100048875, "0Tibit/s"),
    (2, 1024, True, "rate_alt", 24100048875, "0Tbit/s"),
    (2, 1024, True, "size_alt", 4844109824, "5GB"),
    (3, 1000, True, "count", 174, "174"),
    (3, 1000, True, "rate", 696517, "5.6Mbit/s"),
    (3, 1000, True, "rate_alt", 696517, "5.3Mibit/s"),
    (3, 1000, True, "size", 140000, "140kB"),
    (3, 1000, True, "size_alt", 140000, "137KiB"),
    (3, 1024, False, "rate", 1018905, "995KiB/s"),
    (3, 1024, False, "rate_alt", 1018905, "1.0MB/s"),
    (4, 1024, True, "rate", 1528358, "11.7Mibit/s"),
    (4, 1024, True, "rate_alt", 1528358, "12.2Mbit/s"),
    (4, 1000, False, "rate", 32835820, "32.8MB/s"),
    (4, 1000, False, "rate_alt", 32835820, "31.3MiB/s"),
    (4, 1000, False, "size_alt", 6600000, "6445KiB"),
    (5, 1000, False, "count", 6842562, "6843k"),
    (5, 1000, False, "rate", 27370248756, "27370MB/s"),
    (5, 1000, False, "rate_alt", 27370248756, "26102MiB/s"),
    (6, 1024, True, "count", 64000, "64000"),
    (6, 1024, True, "rate", 4194304000, "32000Mibit/s"),
    (6, 1024, True, "rate_alt", 4194304000, "33554Mbit/s"),
    (6, 1024, True, "rate", 20867184, "163025Kibit/s"),
    (6, 1024, True, "rate_alt", 20867184, "166937kbit/s"),
    (6, 1024, True, "size", 8388608, "8192.0KiB"),
    (6, 1024, True, "size_alt", 8388608, "8388.6kB"),
    (7, 1024, False, "rate", 101890, "101890B/s"),
    (7, 1024, False, "size", 20480, "20480B"),
    (10, 1000, True, "count", 6843825, "6843825"),
    (10, 1000, True, "rate", 27375303482, "219002428kbit/s"),
    (10, 1000, True, "rate_alt", 27375303482, "213869558Kibit/s"),
    (10, 1024, False, "rate", 4194304000, "4194304000B/s"),
    (10, 1000, True, "size", 5502436000, "5502436000B"),
]


def _figure(units: TextUnits, figure: str, number: int) -> str:
    alt = figure.endswith("_alt")
    kind = figure.removesuffix("_alt")
    if kind == "count":
        return units.count(number)
    return getattr(units, kind)(number, alt=alt)


@pytest.mark.parametrize("sig,kb_base,bits,figure,number,want", FIO_FIGURES)
def test_figures_are_fios(sig, kb_base, bits, figure, number, want):
    assert _figure(TextUnits(sig, kb_base, bits), figure, number) == want


def test_num2str_keeps_the_decimal_a_rounding_carry_leaves():
    # fio 3.33 prints bs=65535 as 64.0KiB: 0.999 rounds to "1.0", the 1 moves up, the .0 stays
    assert num2str(65535, 4, 1, True, "B") == "64.0KiB"
    assert num2str(1023, 3, 1, True, "B") == "1.0KiB"
    # no room for decimals: the carry rounds the integer part instead
    assert num2str(2047 * 1024 + 1023, 4, 1, True, "B") == "2048KiB"
    assert num2str(999999, 4, 1, False) == "1000k"


def test_bits_count_eight_per_byte_and_sizes_stay_bytes():
    units = TextUnits(4, 1024, True)
    assert units.rate(2 * 1024 * 1024) == "16.0Mibit/s"
    assert units.size(2 * 1024 * 1024) == "2048KiB"


def _header(text: str) -> str:
    jobs, _ = build_jobs([read_sections(text, "t.fio")])
    return report.job_header(jobs[0])


@pytest.mark.parametrize("extra,bs_text", [
    ("significant_figures=6\n", "65536B"),   # fio 3.33: bs=(R) 65536B-65536B
    ("significant_figures=2\n", "64KiB"),
    ("", "64.0KiB"),
    ("kb_base=1000\nsignificant_figures=3\n", "64kB"),  # 64k is 64000 bytes there
])
def test_the_job_header_writes_block_sizes_with_the_jobs_figures(extra, bs_text):
    header = _header(f"[j]\nfilename=/tmp/x\nsize=8m\nrw=write\nbs=64k\nioengine=psync\n{extra}")
    assert f"bs=(R) {bs_text}-{bs_text}, (W) {bs_text}-{bs_text}" in header


def _dir_with_bw_samples(*kib_per_s: float) -> DirStats:
    d = DirStats()
    for value in kib_per_s:
        d.bw.add(value)
    return d


@pytest.mark.parametrize("samples,group_agg,units,want", [
    # fio 3.33, rate=2m kb_base=1000: samples 1953 and 1960 KiB/s, labelled kB
    ((1953, 1960), 1998000, TextUnits(4, 1000, False),
     "   bw (   kB/s): min= 1953, max= 1960, per=100.00%, avg=1956.50, stdev= 4.95, samples=2\n"),
    # fio 3.33, rate=2m unit_base=1: the samples stay in bytes (fio's bit branch never fires)
    ((2048, 2056), 2100906, TextUnits(4, 1024, True),
     "   bw (  KiB/s): min= 2048, max= 2056, per=100.00%, avg=2052.00, stdev= 5.66, samples=2\n"),
    # above kb_base squared fio divides by kb_base and says MiB, even for kb_base=1000
    ((21_000_000, 22_000_000), 30_000_000_000, TextUnits(4, 1000, True),
     "   bw (  MiB/s): min=21000, max=22000, per=73.39%, avg=21500.00, stdev=707.11, samples=2\n"),
    # fio 3.33, kb_base=1000: 19217795 KiB/s shows as 19217.80, not the 19217.79 a true division gives
    ((19217795,), 19679022080, TextUnits(5, 1000, True),
     "   bw (  MiB/s): min=19217, max=19217, per=100.00%, avg=19217.80, stdev= 0.00, samples=1\n"),
])
def test_the_bw_samples_line_is_fios(samples, group_agg, units, want):
    assert report._rate_lines(_dir_with_bw_samples(*samples), group_agg, units) == want


def test_latency_figures_scale_as_fios_fast_math_build_does():
    # 100085 ns: 100.085 us, whose true quotient prints 100.08; fio's build (x * 0.001) prints 100.09
    stat = types.SimpleNamespace(min=3000, max=200_000, mean=100_085.0, stddev=50_000.0)
    assert report._lat_line("clat", stat) == "    clat (usec): min=3, max=200, avg=100.09, stdev=50.00\n"


def test_the_share_of_the_group_drops_the_means_fraction():
    # fio 3.33 JSON: bw_mean 1026.5 KiB/s in a group of 7184384 bytes over 1701 ms: bw_agg 24.874947
    assert report.agg_percent(1026.5, 7184384 * 1000 // 1701) == pytest.approx(24.874947, abs=1e-6)


def test_the_steadystate_line_takes_the_jobs_figures_and_bits():
    # fio 3.33, ss=iops:50% rate=3m significant_figures=6 unit_base=1
    state = SteadyState(parse_steadystate("iops:50%", 1024), 2, 0)
    state.add(769, 3151122)
    state.attained = state.add(768, 3145728)
    line = state.text_line(report._steady_num2str(TextUnits(6, 1024, True)))
    assert line.startswith("  steadystate  : attained=yes, bw=24592Kibit/s (24592kbit/s), iops=768, iops mean dev=")


# ---------------------------------------------------------------- against real fio

# sizes in plain bytes: a job's kb_base would read a global "4k" differently here and in fio
LINE = ("[global]\nfilename={path}\nsize=1073741824\nrw=write\nbs=4096\nioengine=null\ntime_based=1\n"
        "runtime=150ms\nbwavgtime=50\n")


def _fio_start(text: str) -> subprocess.Popen:
    proc = subprocess.Popen([FIO, "--output-format=normal,json", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(text)
    proc.stdin.close()
    return proc


def _fio_end(proc: subprocess.Popen) -> tuple[str, list[dict]]:
    """Real fio's normal text (the JSON cut out) and its JSON jobs, from one run."""
    out = proc.stdout.read()
    proc.wait(timeout=60)
    start = out.index("\n{") + 1
    end = out.index("\n}\n", start) + 2
    return out[:start] + out[end:], json.loads(out[start:end])["jobs"]


def _ours(text: str) -> tuple[str, list[dict]]:
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return report.format_normal(result), report.to_json(result, globals_)["jobs"]


def _expected_lines(jobs: list[dict], units: list[TextUnits], group: TextUnits) -> list[str]:
    """Every figure line fio writes for one group of reported jobs, from their JSON:
    per job the job's own figures and unit_base with the group's kb_base; the group
    line in its last job's."""
    out = []
    for job, ts in zip(jobs, units):
        mixed = TextUnits(ts.sig_figs, group.kb_base, ts.bits)
        for name in ("read", "write"):
            d = job[name]
            if not d["runtime"]:
                continue
            runt, io = d["runtime"], d["io_bytes"]
            bw, iops = 1000 * io // runt, 1000 * d["total_ios"] // runt
            out.append(f"  {name}: IOPS={mixed.count(iops)}, BW={mixed.rate(bw)} ({mixed.rate(bw, alt=True)})"
                       f"({mixed.size(io)}/{runt}msec)")
            if d["bw_samples"]:
                out.append(_bw_line(d, group))
    for name, label in (("read", "   READ"), ("write", "  WRITE")):
        dirs = [job[name] for job in jobs if job[name]["runtime"]]
        if not dirs:
            continue
        rates = [1000 * d["io_bytes"] // d["runtime"] for d in dirs]
        io, runs = sum(d["io_bytes"] for d in dirs), [d["runtime"] for d in dirs]
        agg = 1000 * io // max(runs)
        out.append(f"{label}: bw={group.rate(agg)} ({group.rate(agg, alt=True)}), "
                   f"{group.rate(min(rates))}-{group.rate(max(rates))} "
                   f"({group.rate(min(rates), alt=True)}-{group.rate(max(rates), alt=True)}), "
                   f"io={group.size(io)} ({group.size(io, alt=True)}), run={min(runs)}-{max(runs)}msec")
    return out


def _bw_line(d: dict, group: TextUnits) -> str:
    # fio 3.33: KiB or kB by kb_base, MiB past kb_base squared; never bits. Its -ffast-math
    # build divides by multiplying with the reciprocal.
    kb = group.kb_base
    label, factor = ("MiB", 1 / kb) if d["bw_mean"] > kb * kb else ("KiB" if group.pow2 else "kB", 1)
    return (f"   bw ({label:>5}/s): min={int(d['bw_min'] * factor):5d}, max={int(d['bw_max'] * factor):5d}, "
            f"per={d['bw_agg']:3.2f}%, avg={d['bw_mean'] * factor:5.02f}")


def _check(text: str, jobs: list[dict], units: list[TextUnits], group: TextUnits) -> None:
    lines = text.splitlines()
    for want in _expected_lines(jobs, units, group):
        assert any(line.startswith(want) for line in lines), (want, text)


def _headers(text: str) -> list[str]:
    return [line for line in text.splitlines() if ": (g=" in line or line.startswith("fio: ")]


def _both(text: str):
    """(fio's text and JSON jobs, ours): the two run side by side to keep the test short."""
    proc = _fio_start(text)
    ours = _ours(text)
    return [_fio_end(proc), ours]


@needs_fio
@pytest.mark.parametrize("options,units", [
    ("significant_figures=6\nunit_base=1\n", TextUnits(6, 1024, True)),
    ("significant_figures=3\nkb_base=1000\nrate=2m\n", TextUnits(3, 1000, False)),
    ("significant_figures=5\nkb_base=1000\nunit_base=1\n", TextUnits(5, 1000, True)),
])
def test_one_jobs_figures_follow_its_options_as_in_fio(tmp_path, options, units):
    text = LINE.format(path=tmp_path / "f") + "[j]\n" + options
    (fio_text, fio_jobs), (our_text, our_jobs) = _both(text)
    _check(fio_text, fio_jobs, [units], units)
    _check(our_text, our_jobs, [units], units)
    assert _headers(our_text) == _headers(fio_text)


TWO_JOBS = "[a]\nsignificant_figures=2\nunit_base=1\nrate=2m\n[b]\nsignificant_figures=6\nunit_base=8\nrate=1m\n"
A, B = TextUnits(2, 1024, True), TextUnits(6, 1024, False)


@needs_fio
def test_a_groups_run_status_line_takes_its_last_jobs_units(tmp_path):
    text = LINE.format(path=tmp_path / "f") + TWO_JOBS
    for out, jobs in _both(text):
        _check(out, jobs, [A, B], B)
        assert "unit_base differs" not in out


@needs_fio
def test_a_reported_group_takes_its_first_jobs_units_and_says_so(tmp_path):
    text = LINE.format(path=tmp_path / "f") + "group_reporting=1\n" + TWO_JOBS
    (fio_text, fio_jobs), (our_text, our_jobs) = _both(text)
    for out, jobs in ((fio_text, fio_jobs), (our_text, our_jobs)):
        _check(out, jobs, [A], A)
    assert "fio: unit_base differs for jobs in group, using 5 as the base" in _headers(fio_text)
    assert _headers(our_text) == _headers(fio_text)


def test_kb_base_disagreement_is_reported_before_unit_base(tmp_path):
    """fio 3.33 says one notice per job that differs: kb_base's when both differ."""
    text = (LINE.format(path=tmp_path / "f").replace("runtime=150ms", "runtime=20ms") + "group_reporting=1\n"
            "[a]\n[b]\nkb_base=1000\nunit_base=1\n[c]\nunit_base=1\n")
    our_text, _ = _ours(text)
    assert [line for line in our_text.splitlines() if line.startswith("fio: ")] == [
        "fio: kb_base differs for jobs in group, using 1024 as the base",
        "fio: unit_base differs for jobs in group, using 4 as the base"]


def test_unit_base_changes_no_json_figure(tmp_path):
    """fio's JSON holds raw numbers: the options only show in "job options"."""
    text = LINE.format(path=tmp_path / "f").replace("runtime=150ms", "runtime=20ms") + "[j]\n"
    _, plain = _ours(text)
    _, bits = _ours(text + "significant_figures=2\nunit_base=1\nkb_base=1000\n")
    assert re.fullmatch(r"\d+", str(bits[0]["write"]["bw"]))
    assert set(bits[0]["write"]) == set(plain[0]["write"])
    assert bits[0]["job options"] == {"significant_figures": "2", "unit_base": "1", "kb_base": "1000"}
