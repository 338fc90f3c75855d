"""An image changed behind the device's back: what the user is told.

The device records a checksum of every block it writes back; bytes another program
wrote into the image since (fio on the same file, dd) fail that check on the next read,
and the error says what most likely happened."""
import numpy as np
import pytest

from cxlhm.config import load_config
from cxlhm.integrity import PoisonError
from host_runtime.driver import open_device

B = 4096


def _config(path):
    return load_config(None, {"backend": {"path": str(path)}, "dram_bytes": 4 * B, "block_size": B,
                              "capacity": 16 * B})


def test_a_block_written_outside_the_device_since_its_clean_close_says_so(tmp_path):
    path = tmp_path / "img"
    with open_device(_config(path)) as dev:
        for i in range(16):
            dev.store(i * B, bytes([i + 1]) * B)  # past device DRAM: write-backs with their checksums
    with open(path, "r+b") as f:  # another tool writes into the image
        f.seek(3 * B)
        f.write(b"\xee" * B)
    with open_device(_config(path)) as dev:
        assert dev.load(5 * B, B) == bytes([6]) * B  # untouched blocks read back as written
        with pytest.raises(PoisonError, match=r"written outside the device since its last close\?") as err:
            dev.load(3 * B, B)
        assert "checksum mismatch on SSD read" in str(err.value)


def test_the_same_change_through_the_fio_engine_names_the_cause(tmp_path):
    from cxlhm_apps.fio.jobfile import build_jobs, read_sections
    from cxlhm_apps.fio.runner import run_jobs

    path = tmp_path / "img"
    job = (f"[w]\nfilename={path}\nsize=256k\nrw=write\nbs=4k\nioengine=cxlhm\ncxlhm_dram=64k\n"
           "cxlhm_block_size=4k\n")
    jobs, _ = build_jobs([read_sections(job, "<test>")])
    assert not run_jobs(jobs, log=lambda _: None).failed
    with open(path, "r+b") as f:
        f.write(np.full(256 << 10, 7, np.uint8).tobytes())  # fio (or anything) rewrites the file
    jobs, _ = build_jobs([read_sections(job.replace("rw=write", "rw=read"), "<test>")])
    result = run_jobs(jobs, log=lambda _: None)
    assert result.failed
    assert "written outside the device since its last close?" in result.clones[0].stats.error_text


def test_a_file_the_device_grows_is_named_with_both_sizes_and_why(tmp_path):
    from cxlhm_apps.fio.jobfile import build_jobs, read_sections
    from cxlhm_apps.fio.runner import run_jobs

    path = tmp_path / "user.img"
    path.write_bytes(bytes(64 << 10))  # the user's 64 KiB file
    jobs, _ = build_jobs([read_sections(f"[r]\nfilename={path}\nrw=read\nbs=4k\nioengine=cxlhm\ncxlhm_dram=256k\n"
                                        "cxlhm_block_size=4k\n", "<test>")])
    said: list[str] = []
    assert not run_jobs(jobs, log=said.append).failed
    grown = [line for line in said if "grew its image" in line]
    assert len(grown) == 1, said
    assert str(path) in grown[0] and "from 65536 bytes to 270336 bytes" in grown[0]
    assert "at least its DRAM, 262144 bytes" in grown[0] and path.stat().st_size == 270336
