"""The corpora compat.py compares: which folder of fio's repository each is, the manifest
that pins its files (commit and SHA-256 each), where a copy is found and how it is
fetched."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
import urllib.request
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cxlhm"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One folder of fio's repository whose job files are compared."""
    name: str  # --corpus
    manifest: Path
    folder: str  # in fio's repository
    env: str  # the variable that names a folder of the files
    title: str  # how the table names it

    @property
    def cache(self) -> Path:
        return CACHE_ROOT / f"fio-{self.name}"


EXAMPLES = Corpus("examples", Path(__file__).with_name("compat_manifest.txt"), "examples", "FIO_EXAMPLES",
                  "fio's examples")
REGRESSION_JOBS = Corpus("tests", Path(__file__).with_name("compat_manifest_tests.txt"), "t/jobs", "FIO_TESTS",
                         "fio's regression jobs (t/jobs)")
CORPORA = {c.name: c for c in (EXAMPLES, REGRESSION_JOBS)}
MANIFEST = EXAMPLES.manifest
CACHE = EXAMPLES.cache


@dataclasses.dataclass(frozen=True)
class Manifest:
    repository: str
    commit: str
    files: dict[str, str]  # name -> sha256


def read_manifest(path: Path = MANIFEST) -> Manifest:
    repo, commit, files = "", "", {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        if key == "repository":
            repo = value.strip()
        elif key == "commit":
            commit = value.strip()
        else:
            files[value.strip()] = key
    return Manifest(repo, commit, files)


def corpus_dir(corpus: Corpus = EXAMPLES) -> Path | None:
    """Where the corpus is (None: nowhere; `--fetch` gets it)."""
    for candidate in (os.environ.get(corpus.env),
                      os.path.join(os.environ["FIO_SOURCE"], corpus.folder) if os.environ.get("FIO_SOURCE") else None,
                      str(corpus.cache)):
        if candidate and Path(candidate).is_dir() and any(Path(candidate).glob("*.fio")):
            return Path(candidate)
    return None


def check_corpus(folder: Path, manifest: Manifest, names=None) -> list[str]:
    """What differs between the folder and the manifest (empty: the same files), over every
    file of the manifest or only `names` (an older fio release ships fewer examples, most of
    them unchanged since)."""
    problems = []
    wanted = manifest.files if names is None else {n: manifest.files[n] for n in names}
    for name, sha in sorted(wanted.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            problems.append(f"{name}: differs from fio {manifest.commit[:12]}")
    return problems


def fetch(manifest: Manifest, corpus: Corpus = EXAMPLES) -> Path:
    """Download the corpus at the manifest's commit into its cache, checked against it."""
    url = f"https://codeload.github.com/{manifest.repository}/tar.gz/{manifest.commit}"
    with urllib.request.urlopen(url, timeout=120) as response:
        data = response.read()
    dest = corpus.cache
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            root, _, rest = member.name.partition("/")
            folder, _, name = rest.rpartition("/")
            if folder == corpus.folder and name in manifest.files and member.isfile():
                (dest / name).write_bytes(tar.extractfile(member).read())
    problems = check_corpus(dest, manifest)
    if problems:
        raise RuntimeError("fetched examples do not match the manifest: " + "; ".join(problems[:5]))
    return dest
