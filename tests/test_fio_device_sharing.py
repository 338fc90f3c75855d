"""ioengine=cxlhm with several jobs: one device per file, shared by every job and clone
that names it, each running its own stream on it at the same time - and every byte
written through it reads back as written (fio's verify, per job)."""
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

DEVICE = "ioengine=cxlhm\ncxlhm_dram=128k\ncxlhm_block_size=4k\n"


def _run(text: str):
    jobs, _ = build_jobs([read_sections(text, "<test>")])
    return run_jobs(jobs, log=lambda _: None)


def test_jobs_naming_one_file_share_its_device_and_keep_every_byte(tmp_path):
    path = tmp_path / "shared.img"
    sections = "".join(f"[w{k}]\noffset={k * 256}k\n" for k in range(4))
    result = _run(f"[global]\nfilename={path}\nsize=256k\nrw=randwrite\nbs=4k\niodepth=8\nverify=crc32c\n"
                  f"{DEVICE}{sections}")
    assert len(result.devices) == 1 and result.devices[0]["backing_file"] == str(path)
    assert not result.failed, [c.stats.error_text for c in result.clones]
    assert [c.stats.verified_blocks for c in result.clones] == [64] * 4  # every block written, read back, checked
    assert all(c.stats.verify_errors == 0 for c in result.clones)


def test_clones_on_their_default_files_each_get_a_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # fio's default file names are relative: JOBNAME.CLONE.0
    result = _run(f"[c]\nsize=128k\nrw=randwrite\nbs=4k\niodepth=4\nnumjobs=3\nverify=crc32c\n{DEVICE}")
    assert not result.failed, [c.stats.error_text for c in result.clones]
    assert sorted(d["backing_file"] for d in result.devices) == [str(tmp_path / f"c.{k}.0") for k in range(3)]
    assert [c.stats.verified_blocks for c in result.clones] == [32] * 3
