"""--compare-fio: real fio runs on a file of its own, never on the device's image, and the
side-by-side compares IOPS, bandwidth and total latency (lat)."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from cxlhm_apps.cli import main as cli_main
from cxlhm_apps.fio import compare
from cxlhm_apps.fio.jobfile import build_jobs, read_sections

DEVICE = "ioengine=cxlhm\ncxlhm_dram=1m\ncxlhm_block_size=4k\ncxlhm_clock=wall\n"
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed (apt-get install fio)")


def test_fio_gets_its_own_file_for_a_device_job(tmp_path):
    image = tmp_path / "dev.img"
    jobs, _ = build_jobs([read_sections(f"[d]\nfilename={image}\nsize=1m\nrw=randwrite\n{DEVICE}"
                                        f"[raw]\nfilename={tmp_path / 'raw.img'}\nsize=1m\nrw=read\n"
                                        "ioengine=io_uring\n[anon]\nsize=1m\nrw=read\n" + DEVICE, "t.fio")])
    text = compare.fio_job_text(jobs)
    assert f"filename={image}.fio-compare" in text and f"filename={image}\n" not in text
    assert f"filename={tmp_path / 'raw.img'}" in text  # a plain file is shared, as fio would
    assert "filename_format=$jobname.$jobnum.$filenum.fio-compare" in text
    assert "cxlhm_" not in text and text.count("lat_percentiles=1") == 3


@needs_fio
def test_compare_fio_leaves_the_device_image_alone(tmp_path, capsys):
    image = tmp_path / "dev.img"
    job = tmp_path / "w.fio"
    job.write_text(f"[w]\nfilename={image}\nsize=2m\nbs=4k\nrw=randwrite\n{DEVICE}")
    assert cli_main(["fio", "--compare-fio", str(job)]) == 0
    out = capsys.readouterr().out
    assert "lat avg" in out and "lat p99" in out and "ratio" in out
    before = hashlib.sha256(image.read_bytes()).hexdigest()
    assert not (tmp_path / "dev.img.fio-compare").exists()  # fio's own file is removed
    # the image still matches the checksums the device stored: a verifying read runs clean
    reader = tmp_path / "r.fio"
    reader.write_text(f"[r]\nfilename={image}\nsize=2m\nbs=4k\nrw=read\n{DEVICE}")
    assert cli_main(["fio", "--output-format=json", str(reader)]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["error"] == 0
    assert hashlib.sha256(image.read_bytes()).hexdigest() == before


def test_ratios_are_of_lat_not_clat():
    ours = [{"jobname": "j", "read": {"iops": 50.0, "bw": 100.0, "lat_mean": 3000.0, "lat_p99": 8000.0},
             "write": None}]
    theirs = {"fio version": "fio-3.33", "jobs": [{"read": {
        "total_ios": 10, "iops": 100.0, "bw_bytes": 200.0,
        "clat_ns": {"mean": 100.0, "percentile": {"99.000000": 100.0}},
        "lat_ns": {"mean": 1500.0, "percentile": {"99.000000": 2000.0}}}}]}
    text = compare.compare_text(ours, theirs, "cxlhm-fio")
    ratio_line = [line for line in text.splitlines() if "ratio" in line][0]
    assert ratio_line.split()[1:] == ["0.50x", "0.50x", "2.00x", "4.00x"]
