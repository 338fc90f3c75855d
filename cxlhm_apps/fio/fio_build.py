"""Build real fio from source at the commit the corpus manifest names (the same commit
fio's examples come from), so the acceptance corpus can run against the fio its
examples were written for: Debian's fio 3.33 refuses the examples that use newer
options (`steadystate=lat`, `atomic`, `sprandom`, ...).

The source comes the way compat.py fetches the examples: GitHub's archive tarball of
the commit (codeload.github.com), or, where that is unreachable, `git archive` of a
local clone or mirror of fio that holds the commit ($FIO_GIT, a .git folder or a bare
repository). It is built with fio's own `./configure --disable-native` (no CPU-specific
code: the binary runs on any x86-64 machine the cache is copied to) and `make -j2`, in
~/.cache/cxlhm/fio-build/<commit>/. Idempotent: a binary that is there and answers
`--version` is kept.

Build needs: a C compiler, make, and libaio's header (Debian: gcc make libaio-dev
zlib1g-dev); without libaio-dev fio builds without ioengine=libaio, which most of the
examples use, so the build refuses to go on without it.

    python -m cxlhm_apps.fio.fio_build [--print-path]
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from cxlhm_apps.fio.compat import CACHE, read_manifest

BUILD_ROOT = CACHE.parent / "fio-build"
LIBAIO_HEADER = Path("/usr/include/libaio.h")


def binary(commit: str, root: Path | None = None) -> Path:
    """Where the fio built at `commit` is (it may not be built yet)."""
    return (root or BUILD_ROOT) / commit / "fio"


def built(commit: str, root: Path | None = None) -> Path | None:
    """The built fio at `commit` when it is there and runs, else None."""
    path = binary(commit, root)
    if not path.is_file():
        return None
    try:
        ok = subprocess.run([str(path), "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if ok else None


def source_tarball(repository: str, commit: str) -> bytes:
    """fio's source at `commit` as a .tar.gz: GitHub's archive, else `git archive` of $FIO_GIT."""
    url = f"https://codeload.github.com/{repository}/tar.gz/{commit}"
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.read()
    except OSError as exc:
        git_dir = os.environ.get("FIO_GIT")
        if not git_dir:
            raise RuntimeError(f"cannot download {url} ({exc}); set FIO_GIT to a clone of fio that has "
                               f"commit {commit[:12]} to build from it instead") from exc
    proc = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "--format=tar.gz",
                           f"--prefix=fio-{commit}/", commit], capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git archive of {commit[:12]} in FIO_GIT={git_dir} failed: "
                           f"{proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout


def version_name(source: Path, commit: str) -> str:
    """The version fio reports: its FIO-VERSION-GEN default (the last release tag) with the
    commit, as `git describe` would give it in a clone (a tarball has no history)."""
    for line in (source / "FIO-VERSION-GEN").read_text().splitlines():
        if line.startswith("DEF_VER="):
            return f"{line.split('=', 1)[1].strip()}-g{commit[:12]}"
    return f"fio-g{commit[:12]}"


def missing_build_tools() -> list[str]:
    """What the build needs and this machine lacks (Debian package names)."""
    missing = [tool for tool in ("make",) if shutil.which(tool) is None]
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        missing.append("gcc")
    if not LIBAIO_HEADER.is_file():
        missing.append("libaio-dev")
    return missing


def build(commit: str | None = None, root: Path | None = None, *, log=sys.stderr) -> Path:
    """fio at `commit` (default: the manifest's), built once into root/<commit>/."""
    root = root or BUILD_ROOT
    manifest = read_manifest()
    commit = commit or manifest.commit
    done = built(commit, root)
    if done:
        return done
    missing = missing_build_tools()
    if missing:
        raise RuntimeError(f"building fio needs {', '.join(missing)} (apt-get install {' '.join(missing)})")
    dest = root / commit
    work = root / f".{commit}.building"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"fio {commit[:12]}: fetching the source", file=log)
    data = source_tarball(manifest.repository, commit)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(work, filter="data")
    (source,) = [p for p in work.iterdir() if p.is_dir()]
    (source / "version").write_text(version_name(source, commit) + "\n")
    for step in (["./configure", "--disable-native"], ["make", "-j2"]):
        print(f"fio {commit[:12]}: {' '.join(step)}", file=log)
        proc = subprocess.run(step, cwd=source, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(step)} failed in {source}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy2(source / "fio", dest / "fio")
    shutil.rmtree(work, ignore_errors=True)
    done = built(commit, root)
    if done is None:
        raise RuntimeError(f"the fio built at {dest / 'fio'} does not run")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cxlhm_apps.fio.fio_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--print-path", action="store_true", help="print where the built fio is, and build nothing")
    args = parser.parse_args(argv)
    commit = read_manifest().commit
    if args.print_path:
        print(binary(commit))
        return 0 if built(commit) else 1
    try:
        path = build(commit)
    except RuntimeError as exc:
        print(f"fio build: {exc}", file=sys.stderr)
        return 1
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{path} ({version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
