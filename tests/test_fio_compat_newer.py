"""The acceptance corpus against fio built at the examples' own commit (`make fio-newer`,
cxlhm_apps/fio/fio_build.py; `python -m cxlhm_apps.fio.compat --fio built`): how the
harness picks its fio, what it tolerates of a newer fio's JSON, and golden runs of
the examples fio 3.33 refuses (skipped only where that fio is not built, or the
examples are absent)."""
from __future__ import annotations

import copy
import io
import stat
import subprocess
import tarfile

import pytest

from cxlhm_apps.fio import compat, fio_build

MANIFEST = compat.read_manifest()
BUILT = fio_build.built(MANIFEST.commit)
needs_built_fio = pytest.mark.skipif(BUILT is None, reason="fio at the manifest's commit is not built (make fio-newer)")


def test_resolve_fio_takes_a_path_a_name_or_the_built_one(tmp_path, monkeypatch):
    exe = tmp_path / "myfio"
    exe.write_text("#!/bin/sh\necho fio-9.99\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert compat.resolve_fio(str(exe), MANIFEST) == str(exe)
    assert compat.resolve_fio(str(tmp_path / "absent"), MANIFEST) is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compat.resolve_fio("myfio", MANIFEST) == str(exe)
    assert compat.resolve_fio("nofio", MANIFEST) is None
    # `built`: fio_build's binary at the manifest's commit, only once it is there and runs
    monkeypatch.setattr(fio_build, "BUILD_ROOT", tmp_path / "build")
    assert compat.resolve_fio("built", MANIFEST) is None
    (tmp_path / "build" / MANIFEST.commit).mkdir(parents=True)
    target = tmp_path / "build" / MANIFEST.commit / "fio"
    target.write_bytes(exe.read_bytes())
    target.chmod(0o755)
    assert compat.resolve_fio("built", MANIFEST) == str(target)


def test_built_refuses_a_binary_that_does_not_run(tmp_path):
    (tmp_path / "abc").mkdir()
    broken = tmp_path / "abc" / "fio"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert fio_build.built("abc", tmp_path) is None
    assert fio_build.binary("abc", tmp_path) == broken


def test_version_name_is_the_release_default_with_the_commit(tmp_path):
    (tmp_path / "FIO-VERSION-GEN").write_text("#!/bin/sh\n\nGVF=FIO-VERSION-FILE\nDEF_VER=fio-3.42\n")
    assert fio_build.version_name(tmp_path, "f5344384f7c7b6e9e6aa") == "fio-3.42-gf5344384f7c7"


def test_missing_build_tools_names_libaio_dev(monkeypatch, tmp_path):
    monkeypatch.setattr(fio_build, "LIBAIO_HEADER", tmp_path / "libaio.h")
    assert "libaio-dev" in fio_build.missing_build_tools()
    (tmp_path / "libaio.h").write_text("")
    assert "libaio-dev" not in fio_build.missing_build_tools()


def _report(keys=()):
    d = {"io_bytes": 4 << 20, "total_ios": 1024, "runtime": 100}
    job = {"jobname": "j", "groupid": 0, "job options": {"rw": "read"}, "read": dict(d),
           "write": {"io_bytes": 0, "total_ios": 0, "runtime": 0}, "job_runtime": 100,
           "iodepth_level": {"1": 0.0, "4": 100.0}}
    job.update({k: 0 for k in keys})
    return {"jobs": [job]}


def test_keys_only_a_newer_fio_writes_are_not_missing_but_others_are():
    ours = _report()
    newer = _report(compat.NEWER_FIO_KEYS)
    assert compat.compare(newer, ours, runtime_cap_s=2) == []
    other = _report(["job_finish"])
    assert any("keys missing ['job_finish']" in d for d in compat.compare(other, copy.deepcopy(ours), runtime_cap_s=2))


def test_both_sides_get_the_examples_environment(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(compat, "_run", lambda args, cwd, env=None: seen.append(env) or None)
    compat.run_fio("fio", tmp_path / "x.fio", tmp_path)
    compat.run_ours(tmp_path / "x.fio", tmp_path)
    assert all(env is not None and all(env[k] == v for k, v in compat.EXAMPLE_ENV.items()) for env in seen)
    assert len(seen) == 2


def _corpus(names):
    folder = compat.corpus_dir()
    if folder is None or compat.check_corpus(folder, MANIFEST, names):
        pytest.skip("fio's examples are not here (python -m cxlhm_apps.fio.compat --fetch)")
    return folder


# examples that agree with fio 3.33 and with fio at the examples' commit alike, and ones
# that fio 3.33 refuses (a steady state on latency, SPRandom) or does not finish (offload) and agree
# with the newer fio
SANITY = ("fio-rand-read.fio", "basic-verify.fio", "example_latency_steadystate.fio", "sprandom.fio")
SLOW = ("poisson-rate-submission.fio", "steadystate.fio")


@needs_built_fio
@pytest.mark.parametrize("example", SANITY)
def test_an_example_that_agrees_with_fio_333_agrees_with_the_newer_fio(example, tmp_path):
    folder = _corpus([example])
    row = compat.run_example(folder / example, str(BUILT), size_cap=1 << 20, runtime_cap_s=1, keep=tmp_path)
    assert row.status == "agrees", row.detail


def test_a_bare_flags_empty_value_from_a_newer_fio_is_not_a_difference():
    ours = _report()
    newer = _report()
    newer["jobs"][0]["job options"]["stonewall"] = ""  # fio after 3.33 writes empty strings; 3.33 left them out
    assert compat.compare(newer, ours, runtime_cap_s=2) == []
    ours["jobs"][0]["job options"]["stonewall"] = "1"
    assert any("stonewall (fio '', cxlhm '1')" in d for d in compat.compare(newer, ours, runtime_cap_s=2))


@needs_built_fio
@pytest.mark.slow
@pytest.mark.parametrize("example", SLOW)
def test_a_slower_example_agrees_with_the_newer_fio(example, tmp_path):
    folder = _corpus([example])
    row = compat.run_example(folder / example, str(BUILT), size_cap=1 << 20, runtime_cap_s=1, keep=tmp_path)
    assert row.status == "agrees", row.detail


def _no_github(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no route to codeload.github.com")
    monkeypatch.setattr(fio_build.urllib.request, "urlopen", refuse)


def test_without_github_or_a_clone_the_build_says_what_to_set(monkeypatch):
    _no_github(monkeypatch)
    monkeypatch.delenv("FIO_GIT", raising=False)
    with pytest.raises(RuntimeError, match="set FIO_GIT to a clone of fio that has commit"):
        fio_build.source_tarball("axboe/fio", "f" * 40)


def test_without_github_the_source_comes_from_the_clone_in_fio_git(monkeypatch, tmp_path):
    _no_github(monkeypatch)
    repo = tmp_path / "fio"
    repo.mkdir()
    (repo / "FIO-VERSION-GEN").write_text("DEF_VER=fio-9.1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run(git + args, check=True, capture_output=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setenv("FIO_GIT", str(repo / ".git"))
    with tarfile.open(fileobj=io.BytesIO(fio_build.source_tarball("axboe/fio", commit)), mode="r:gz") as tar:
        assert tar.extractfile(f"fio-{commit}/FIO-VERSION-GEN").read() == b"DEF_VER=fio-9.1\n"
    with pytest.raises(RuntimeError, match="git archive of"):
        fio_build.source_tarball("axboe/fio", "0" * 40)
