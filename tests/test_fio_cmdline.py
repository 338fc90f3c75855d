"""Job options on the command line, as fio 3.33 takes them (cxlhm_apps/fio/cmdline.py):
--name starts a job, what comes before the first goes to [global]."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cxlhm_apps.cli import main
from cxlhm_apps.fio.cmdline import NoJobDefined, job_text, split_argv

FIO = shutil.which("fio")


def test_own_arguments_job_files_and_job_options_are_told_apart():
    own, jobs = split_argv(["--output-format", "json", "a.fio", "--bs", "8k", "--time_based", "--runtime=1",
                            "--eta=never", "--name=x", "--direct", "1", "--group_reporting"])
    assert own == ["--output-format", "json", "a.fio", "--eta=never"]
    assert jobs == ["bs=8k", "time_based", "runtime=1", "name=x", "direct=1", "group_reporting"]


def test_a_valued_option_before_another_option_is_left_without_its_value():
    # (the job file's checks then say it needs one)
    assert split_argv(["--name=x", "--size", "--rw=read"])[1] == ["name=x", "size", "rw=read"]


def test_the_options_before_the_first_name_are_global():
    text = job_text(["size=1m", "name=a", "rw=write", "name=b", "rw=read"])
    assert text == "[global]\nsize=1m\n[a]\nname=a\nrw=write\n[b]\nname=b\nrw=read\n"
    with pytest.raises(NoJobDefined, match="--name=NAME"):
        job_text(["rw=read", "size=1m"])


@given(st.lists(st.sampled_from(["--rw=read", "--bs", "4k", "--time_based", "--name=j", "job.fio", "--eta", "never",
                                 "--output-format=json", "--size", "1m", "--", "-", "--compare-fio"]), max_size=12))
def test_splitting_accounts_for_every_word_once_in_order(words):
    own, jobs = split_argv(words)
    own_keys = ("--eta", "--output-format", "--compare-fio", "--")
    assert [j.split("=", 1)[0] for j in jobs] == [w[2:].split("=", 1)[0] for w in words
                                                  if w.startswith("--") and w.split("=", 1)[0] not in own_keys]
    from_two_words = sum(1 for j in jobs if "=" in j and not any(w == "--" + j for w in words))
    assert len(own) + len(jobs) + from_two_words == len(words)


def _ours(capsys, words) -> tuple[int, str, str]:
    rc = main(["fio", *words])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_job_from_the_command_line_runs_with_fios_report(tmp_path, capsys):
    words = ["--size=64k", f"--filename={tmp_path / 'f'}", "--name=a", "--rw=write", "--name=b", "--rw", "read",
             "--bs", "8k", "--output-format=json"]
    rc, out, err = _ours(capsys, words)
    assert rc == 0, err
    doc = json.loads(out)
    assert [(j["jobname"], j["job options"]) for j in doc["jobs"]] == [
        ("a", {"name": "a", "rw": "write"}), ("b", {"name": "b", "rw": "read", "bs": "8k"})]
    assert doc["global options"] == {"size": "64k", "filename": str(tmp_path / "f")}
    assert doc["jobs"][1]["read"]["io_bytes"] == 64 << 10
    if FIO is not None:  # real fio reads the same words the same way
        proc = subprocess.run([FIO, *words], capture_output=True, text=True, timeout=60)
        theirs = json.loads(proc.stdout[proc.stdout.find("{"):])
        assert [(j["jobname"], j["job options"]) for j in theirs["jobs"]] == [
            (j["jobname"], j["job options"]) for j in doc["jobs"]]
        assert theirs["global options"] == doc["global options"]


def test_every_bad_job_option_on_the_command_line_is_named_at_once(tmp_path, capsys):
    rc, _, err = _ours(capsys, ["--name=x", "--bogus=3", f"--filename={tmp_path / 'f'}", "--size=1m", "--fsync"])
    assert rc == 2
    assert "<command line>" in err and "option 'bogus'" in err and "option 'fsync': needs a value" in err


def test_job_options_without_a_name_say_how_to_start_a_job(capsys):
    rc, _, err = _ours(capsys, ["--rw=read", "--size=1m"])
    assert rc == 2 and "--name=NAME starts one" in err
