"""fio's own examples as the acceptance corpus (cxlhm_apps/fio/compat.py): how an example
is adapted, what the comparison catches, and a fast subset of the corpus run through real
fio and through `cxlhm fio` (skipped only where fio or the corpus is absent; `make
fio-compat` runs all of it)."""
from __future__ import annotations

import copy
import shutil

import pytest

from cxlhm_apps.fio import compat

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed (apt-get install fio)")
# examples that agree with fio on every compared field (the table in docs/fio.md has them all)
FAST_SUBSET = ("fio-seq-read.fio", "fio-rand-RW.fio", "tiobench-example.fio", "ssd-test.fio", "rand-zones.fio",
               "basic-verify.fio", "fsx.fio")
# slower ones (several groups, or seconds of run time each)
SLOW_SUBSET = ("steadystate.fio",)


def test_adapt_makes_files_local_and_caps_sizes_and_times():
    text = ("[global]\nfilename=/dev/sdb\nsize=4g ; big\nruntime=60\n[a]\nfilename=/dev/sdb:/dev/sdc\n"
            "directory=/mnt/x\nio_size=10%\n[b]\nrw=read\n")
    adapted = compat.adapt(text, size_cap=16 << 20, runtime_cap_s=2)
    lines = adapted.text.splitlines()
    assert "filename=file0.dat" in lines and "filename=file0.dat:file1.dat" in lines
    assert "directory=." in lines and f"size={16 << 20}" in lines and "runtime=2s" in lines
    assert "io_size=10%" in lines and "rw=read" in lines  # a share, and the rest, as written
    assert adapted.engines == {"psync"}


def test_adapt_gives_a_size_and_runtime_to_a_file_without_them():
    adapted = compat.adapt("[global]\nioengine=libaio\n[j]\nrw=write\n", size_cap=1 << 20, runtime_cap_s=1)
    assert adapted.text.splitlines() == ["[global]", "size=1048576", "runtime=1s", "ioengine=libaio",
                                         "[j]", "size=1048576", "runtime=1s", "rw=write"]


def _report():
    d = {"io_bytes": 4 << 20, "total_ios": 1024, "runtime": 100}
    job = {"jobname": "j", "groupid": 0, "job options": {"rw": "read"}, "read": dict(d),
           "write": {"io_bytes": 0, "total_ios": 0, "runtime": 0}, "job_runtime": 100,
           "iodepth_level": {"1": 0.0, "4": 100.0}}
    return {"jobs": [job]}


def test_compare_agrees_with_itself_and_names_each_difference():
    fio = _report()
    assert compat.compare(fio, copy.deepcopy(fio), runtime_cap_s=2) == []
    ours = copy.deepcopy(fio)
    job = ours["jobs"][0]
    job["read"]["total_ios"] = 512  # mean block 8 KiB against 4 KiB
    job["iodepth_level"] = {"1": 100.0, "4": 0.0}
    job["job options"]["bs"] = "8k"
    job["extra"] = 1
    diffs = compat.compare(fio, ours, runtime_cap_s=2)
    assert any("read mean block fio 4.0 KiB, cxlhm 8.0 KiB" in d for d in diffs)
    assert any("I/O depth fio 4, cxlhm 1" in d for d in diffs)
    assert any("job options differ in bs" in d for d in diffs)
    assert any("keys fio lacks ['extra']" in d for d in diffs)


def test_compare_takes_a_near_tie_of_two_depths_as_either():
    fio = _report()
    fio["jobs"][0]["iodepth_level"] = {"1": 49.3, "2": 50.2, "4": 0.5}
    ours = copy.deepcopy(fio)
    ours["jobs"][0]["iodepth_level"] = {"1": 50.4, "2": 49.6, "4": 0.0}
    assert compat.compare(fio, ours, runtime_cap_s=2) == []
    ours["jobs"][0]["iodepth_level"] = {"1": 60.0, "2": 40.0, "4": 0.0}
    assert compat.compare(fio, ours, runtime_cap_s=2) == []  # fio's 1 is within the tie of its 2
    ours["jobs"][0]["iodepth_level"] = {"1": 10.0, "2": 10.0, "4": 80.0}
    assert any("I/O depth fio 2, cxlhm 4" in d for d in compat.compare(fio, ours, runtime_cap_s=2))


def test_compare_takes_a_run_cut_short_by_the_cap_as_speed_but_not_a_short_finish():
    fio = _report()
    ours = copy.deepcopy(fio)
    ours["jobs"][0]["read"].update(io_bytes=1 << 20, total_ios=256, runtime=1900)  # cut short by the 2 s cap
    assert compat.compare(fio, ours, runtime_cap_s=2) == []
    fio_cut = copy.deepcopy(fio)
    fio_cut["jobs"][0]["read"].update(io_bytes=8 << 20, total_ios=2048, runtime=1950)  # fio cut short, ours ended sooner
    diffs = compat.compare(fio_cut, copy.deepcopy(fio), runtime_cap_s=2)
    assert any("cxlhm ended on its size with less" in d for d in diffs)
    ours_small = copy.deepcopy(fio)
    ours_small["jobs"][0]["read"].update(io_bytes=2 << 20, total_ios=512)  # both ended on their size: bytes compared
    assert any("read bytes fio 4194304, cxlhm 2097152" in d for d in compat.compare(fio, ours_small, runtime_cap_s=2))


def test_the_manifest_pins_fios_examples():
    manifest = compat.read_manifest()
    assert manifest.repository == "axboe/fio" and len(manifest.commit) == 40
    assert len(manifest.files) > 100 and all(len(sha) == 64 for sha in manifest.files.values())


def test_fios_regression_jobs_are_a_second_pinned_corpus_with_their_pre_jobs():
    manifest = compat.read_manifest(compat.REGRESSION_JOBS.manifest)
    assert manifest.commit == compat.read_manifest().commit  # (one fio commit for both corpora)
    names = sorted(manifest.files)
    assert compat.pre_job("t0002-13af05ae-post.fio", names) == "t0002-13af05ae-pre.fio"
    assert compat.pre_job("t0031.fio", names) == "t0031-pre.fio"
    assert compat.pre_job("t0031-pre.fio", names) is None and compat.pre_job("t0005-f7078f7b.fio", names) is None
    assert "t0038.iolog" in names  # (a file a job reads, copied next to it)


def test_a_pre_job_and_its_job_map_the_same_file_to_the_same_local_name():
    names: dict[str, str] = {}
    pre = compat.adapt("[a]\nfilename=/dev/nvme0n1\nrw=write\n", size_cap=1 << 20, runtime_cap_s=1, names=names)
    post = compat.adapt("[b]\nfilename=/dev/sdb\n[c]\nfilename=/dev/nvme0n1\n", size_cap=1 << 20, runtime_cap_s=1,
                        names=names)
    assert "filename=file0.dat" in pre.text.splitlines()
    assert post.text.splitlines().count("filename=file0.dat") == 1 and "filename=file1.dat" in post.text


# fio's regression jobs that agree with fio on every compared field and run in a second or two
TESTS_FAST_SUBSET = ("t0001-52c58027.fio", "t0005-f7078f7b.fio", "t0019.fio", "t0025.fio")


@needs_fio
@pytest.mark.parametrize("job", TESTS_FAST_SUBSET)
def test_fios_regression_job_runs_as_written_and_agrees_with_fio(job, tmp_path):
    corpus = compat.REGRESSION_JOBS
    folder = compat.corpus_dir(corpus)
    if folder is None or compat.check_corpus(folder, compat.read_manifest(corpus.manifest), TESTS_FAST_SUBSET):
        pytest.skip("fio's t/jobs are not here (FIO_TESTS, FIO_SOURCE, or compat --corpus tests --fetch)")
    row = compat.run_example(folder / job, shutil.which("fio"), size_cap=1 << 20, runtime_cap_s=1, keep=tmp_path)
    assert row.status == "agrees", row.detail


def _corpus():
    folder = compat.corpus_dir()
    if folder is None or compat.check_corpus(folder, compat.read_manifest(), FAST_SUBSET):
        pytest.skip("fio's examples are not here (FIO_EXAMPLES, FIO_SOURCE, or python -m cxlhm_apps.fio.compat --fetch)")
    return folder


@needs_fio
@pytest.mark.parametrize("example", FAST_SUBSET)
def test_fios_example_runs_as_written_and_agrees_with_fio(example, tmp_path):
    folder = _corpus()
    row = compat.run_example(folder / example, shutil.which("fio"), size_cap=1 << 20, runtime_cap_s=1, keep=tmp_path)
    assert row.status == "agrees", row.detail


@needs_fio
@pytest.mark.slow
@pytest.mark.parametrize("example", SLOW_SUBSET)
def test_fios_slower_example_runs_as_written_and_agrees_with_fio(example, tmp_path):
    folder = _corpus()
    row = compat.run_example(folder / example, shutil.which("fio"), size_cap=1 << 20, runtime_cap_s=1, keep=tmp_path)
    assert row.status == "agrees", row.detail


def test_on_engine_puts_every_job_on_the_engine():
    text = "[global]\nioengine=libaio\n[a]\n[b]\nioengine = psync\n"
    assert compat.on_engine(text, "cxlhm").splitlines() == [
        "[global]", "ioengine=cxlhm", "ioengine=cxlhm", "[a]", "ioengine=cxlhm", "[b]", "ioengine=cxlhm",
        "ioengine=cxlhm"]


def test_a_refusal_is_summed_up_by_reason():
    detail = ["/t/a.fio:12: option 'zonemode': fio's option, not modelled here: zoned block devices are not "
              "modelled; remove it to run the job",
              "/t/a.fio:13: option 'zonesize': fio's option, not modelled here: zoned block devices are not "
              "modelled; remove it to run the job",
              "/t/a.fio:10: option 'verify': must be one of 0, crc32c; got 'meta'", "(3 problems, every one listed)"]
    assert compat.summarize(detail) == ("zonemode, zonesize (zoned block devices are not modelled); "
                                        "verify (must be one of 0, crc32c; got 'meta')")


def test_a_run_past_its_time_leaves_no_process_behind(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    import time
    monkeypatch.setattr(compat, "FIO_TIMEOUT_S", 1)
    job = str(tmp_path / "unique-job.fio")
    # like fio: a job process in a session of its own that outlives its parent and holds its output
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            "sys.argv[1]], start_new_session=True); time.sleep(60)")
    started = time.monotonic()
    assert compat._run([sys.executable, "-c", code, job], tmp_path) is None
    assert time.monotonic() - started < 30
    left = subprocess.run(["pgrep", "-f", job], capture_output=True, text=True).stdout.split()
    assert [pid for pid in left if int(pid) != os.getpid()] == []


@needs_fio
def test_fios_example_runs_on_the_device_with_ioengine_cxlhm_swapped_in(tmp_path):
    folder = _corpus()
    row = compat.run_example(folder / "fio-rand-RW.fio", shutil.which("fio"), size_cap=1 << 20, runtime_cap_s=1,
                             keep=tmp_path, engine="cxlhm")
    assert row.status == "agrees", row.detail
