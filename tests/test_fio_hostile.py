"""Hostile and careless fio job files: each ends in one clear error line (`cxlhm fio:
error: ...` naming the option), exit 2 - or, for a job that dies while running, an
error in the report and a non-zero exit - never a traceback, a hang or exit 0."""
import threading

import pytest

from cxlhm_apps.cli import main as cli_main

TIMEOUT_S = 120


def run_cli(argv):
    """cli_main in a thread, failing the test if it does not return in TIMEOUT_S."""
    box = {}

    def target():
        try:
            box["rc"] = cli_main(argv)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert not t.is_alive(), f"cxlhm {' '.join(argv)} hung"
    if "exc" in box:
        raise box["exc"]
    return box["rc"]


def run_job(tmp_path, capsys, text):
    job = tmp_path / "j.fio"
    job.write_text(text)
    rc = run_cli(["fio", "--output-format=json", "--output", str(tmp_path / "out.json"), str(job)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def base(tmp_path, engine="io_uring"):
    return f"[j]\nioengine={engine}\nrw=randread\nbs=4k\nruntime=1\n"


# (name, job options after the base, option the error names, words it says)
CASES = [
    ("size-1e", "filename={d}/a.img\nsize=1e\n", "size", "bytes"),
    ("size-1e-write", "filename={d}/a.img\nsize=1e\nrw=randwrite\n", "size", "File too large"),
    ("size-2^70", "filename={d}/a.img\nsize=2^70\n", "size", "expected a size"),
    ("missing-folder", "filename={d}/no/such/folder/a.img\nsize=1m\n", "filename", "does not exist"),
    ("filename-list", "filename={d}/a.img:{d}/b.img\nsize=1m\n", "filename", "list of files"),
    ("long-name", "filename={d}/" + "x" * 300 + "\nsize=1m\n", "filename", "at most 255"),
    ("long-path", "filename={d}/" + "/".join(["y" * 200] * 25) + "\nsize=1m\n", "filename", "at most 4095"),
    ("proc-self-mem", "filename=/proc/self/mem\nsize=1m\n", "filename", "pseudo file system"),
    ("char-device", "filename=/dev/zero\nsize=1m\n", "filename", "not a regular file"),
    ("zipf-nan", "filename={d}/a.img\nsize=1m\nrandom_distribution=zipf:nan\ntime_based\n",
     "random_distribution", "finite"),
    ("zipf-inf", "filename={d}/a.img\nsize=1m\nrandom_distribution=zipf:inf\ntime_based\n",
     "random_distribution", "finite"),
    ("zipf-huge", "filename={d}/a.img\nsize=1m\nrandom_distribution=zipf:1e300\n", "random_distribution", "at most"),
    ("rw-modifier-huge", "filename={d}/a.img\nsize=1m\nrw=randread:4611686018427387904\n", "rw", "at most"),
]


@pytest.mark.parametrize("name,options,option,words", CASES, ids=[c[0] for c in CASES])
def test_hostile_job_is_one_clear_error(tmp_path, capsys, name, options, option, words):
    rc, err = run_job(tmp_path, capsys, base(tmp_path) + options.format(d=tmp_path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("cxlhm fio: error: "), err
    assert f"option {option!r}" in lines[0] and words in lines[0], err


DEVICE_CASES = [
    ("belady", "cxlhm_policy=belady\n", "cxlhm_policy", "offline"),
    ("profile-dev-zero", "cxlhm_profile=/dev/zero\n", "cxlhm_profile", "not a regular file"),
    ("profile-missing", "cxlhm_profile=/no/such/profile.yaml\n", "cxlhm_profile", "cannot read"),
    ("dram-bad", "cxlhm_dram=3\n", "cxlhm_dram", ""),
]


@pytest.mark.parametrize("name,options,option,words", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_hostile_device_option_is_one_clear_error(tmp_path, capsys, name, options, option, words):
    text = base(tmp_path, "cxlhm") + f"filename={tmp_path}/dev.img\nsize=1m\n" + options
    rc, err = run_job(tmp_path, capsys, text)
    lines = [line for line in err.splitlines() if line.strip() and "Laying out IO file" not in line]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("cxlhm fio: error: "), err
    assert f"option {option!r}" in lines[0] and words in lines[0], err


def test_device_errors_blame_the_option_that_set_the_value(tmp_path, capsys):
    """A device configuration problem that is not the profile's names what caused it."""
    text = base(tmp_path, "cxlhm") + f"filename={tmp_path}/dev.img\nsize=1m\ncxlhm_block_size=3k\n"
    rc, err = run_job(tmp_path, capsys, text)
    assert rc == 2 and "cxlhm_profile" not in err and "cxlhm_block_size" in err, err


@pytest.mark.parametrize("target,words", [("/dev/zero", "not a regular file"), ("/no/such.fio", "no such file")])
def test_include_of_a_special_or_missing_file(tmp_path, capsys, target, words):
    rc, err = run_job(tmp_path, capsys, f"[j]\ninclude {target}\nrw=read\nsize=1m\n")
    assert rc == 2 and words in err and err.count("\n") == 1, err


def test_a_special_job_file_is_refused(capsys):
    rc = run_cli(["fio", "/dev/zero"])
    err = capsys.readouterr().err
    assert rc == 2 and "not a regular file" in err and "Traceback" not in err


def test_output_into_a_missing_folder_fails_before_running(tmp_path, capsys):
    job = tmp_path / "j.fio"
    job.write_text(base(tmp_path) + f"filename={tmp_path}/a.img\nsize=1m\n")
    rc = run_cli(["fio", "--output", str(tmp_path / "no" / "out.json"), str(job)])
    err = capsys.readouterr().err
    assert rc == 2 and "folder does not exist" in err
    assert not (tmp_path / "a.img").exists()  # nothing was laid out


def test_a_job_whose_thread_dies_is_an_error(tmp_path, capsys, monkeypatch):
    """Whatever kills a job's thread is reported as that job's error, with exit 1."""
    from cxlhm_apps.fio import runner

    def boom(self):
        raise OverflowError("injected: the generator overflowed")
    monkeypatch.setattr(runner.Worker, "_run", boom)
    rc, err = run_job(tmp_path, capsys, base(tmp_path) + f"filename={tmp_path}/a.img\nsize=1m\n")
    assert rc == 1 and "OverflowError" in err
    import json
    job = json.loads((tmp_path / "out.json").read_text())["jobs"][0]
    assert job["error"] != 0
