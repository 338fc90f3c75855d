"""What a job may name as its file and its device profile, checked before anything is
created, laid out or opened: one error naming the option and what is accepted, never a
traceback from deep inside the run, never a hang on a special file.

Files are laid out one after another, before any job starts (fio's create_serialize=1;
create_serialize=0 is accepted and changes nothing here). fill_device is honoured within
size= / filesize= (check_fill_device)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat

import numpy as np

NAME_MAX = 255  # bytes per path component (Linux file systems)
PATH_MAX = 4095
MAX_PROFILE_BYTES = 1 << 20  # a device profile is a short YAML file
# Pseudo file systems: their "regular" files (/proc/self/mem, /sys/...) are not storage
PSEUDO_ROOTS = ("/proc", "/sys")
LAYOUT_CHUNK = 1 << 20


def job_filename(job, clone: int) -> str:
    """The file a job clone works on: filename=, or filename_format (fio's default
    $jobname.$jobnum.$filenum), inside `directory` when one is given and the name is
    relative. fio reads `a:b` as a list of files; one file per job is supported, and
    `\\:` is a colon."""
    text = job["filename"]
    if not text:
        name = job["filename_format"]
        for token, value in (("$jobname", job.name), ("$jobnum", str(clone)), ("$filenum", "0"),
                             ("$clientuid", "0")):
            name = name.replace(token, value)
    else:
        if ":" in text.replace("\\:", ""):
            raise job.error("filename", f"{text!r} is a list of files (fio's a:b form); one file per job is "
                                        "supported here (write a colon in a name as '\\:')")
        name = text.replace("\\:", ":")
    folder = job["directory"]
    if folder and not os.path.isabs(name):
        if ":" in folder.replace("\\:", ""):
            raise job.error("directory", f"{folder!r} is a list of folders (fio's a:b form); one is supported")
        name = os.path.join(folder.replace("\\:", ":"), name)
    return name


def check_target(job, path: str) -> None:
    """The job's file: a name the file system can hold, in a folder that exists, a
    regular file (or none yet) on a real file system."""
    encoded = os.fsencode(path)
    if len(encoded) > PATH_MAX:
        raise job.error("filename", f"the path is {len(encoded)} bytes long; at most {PATH_MAX} are accepted")
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise job.error("filename", f"a name in {path[:60]!r}... is {len(longest)} bytes long; "
                                    f"at most {NAME_MAX} per name are accepted")
    real = os.path.realpath(path)
    for root in PSEUDO_ROOTS:
        if real == root or real.startswith(root + "/"):
            raise job.error("filename", f"{path} is on the {root} pseudo file system, not storage; "
                                        "name a file on a disk (or a block device)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise job.error("filename", f"the folder {folder} does not exist")
    if job["fill_device"]:
        check_fill_device(job, path, folder)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise job.error("filename", f"cannot use {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise job.error("filename", f"{path} is not a regular file")


def check_fill_device(job, path: str, folder: str) -> None:
    """fill_device: fio writes until the file system is full (ENOSPC ends the job). Here
    the job must bound it with size= or filesize= (the whole free space of a shared disk
    is not written), and that bound must fit in the free space, so the job ends where
    fio's would on a file system of that size."""
    fs = os.statvfs(folder)
    free = fs.f_bavail * fs.f_frsize
    try:
        free += os.stat(path).st_size  # (a file there already: its blocks are the job's to rewrite)
    except OSError:
        pass
    bound = [n for n in ("size", "filesize") if n in job.given]
    if not bound:
        raise job.error("fill_device", f"would write the whole free space of {folder}'s file system "
                                       f"({free / 2**30:.1f} GiB, until ENOSPC, as fio does); give size= or "
                                       "filesize= to bound it")
    for name in bound:
        value = job[name]
        if isinstance(value, int) and value > free:
            raise job.error(name, f"with fill_device is {value} bytes, more than the {free} bytes free on "
                                  f"{folder}'s file system; give at most {free}")


def check_profile(job) -> None:
    """cxlhm_profile names a built-in profile or a YAML file: a regular file of at most
    MAX_PROFILE_BYTES (a special file such as /dev/zero would be read forever)."""
    text = job["cxlhm_profile"]
    if not text or not (text.endswith((".yaml", ".yml")) or "/" in text):
        return  # a profile name: the configuration loader says which exist
    try:
        st = os.stat(text)
    except OSError as exc:
        raise job.error("cxlhm_profile", f"cannot read {text}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise job.error("cxlhm_profile", f"{text} is not a regular file; a profile is a YAML file or a "
                                         "built-in profile name")
    if st.st_size > MAX_PROFILE_BYTES:
        raise job.error("cxlhm_profile", f"{text} is {st.st_size} bytes; a profile is at most "
                                         f"{MAX_PROFILE_BYTES >> 10} KiB of YAML")


_FALLOC_FL_KEEP_SIZE = 1


def extend(job, path: str, end: int, fallocate: str = "truncate") -> None:
    """Give a written file that is too small what fio's `fallocate` mode gives it before
    the job (fio 3.33's extend_file, a job that only writes): native / posix / 1 allocate
    and size it, keep allocates its blocks and leaves its size, truncate sizes it sparse,
    none / 0 leaves it as it is for the writes to extend. A size the file system cannot
    hold is an error about `size` before anything runs."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise setup_error(job, path, exc, "cannot create") from None
    try:
        if os.fstat(fd).st_size < end:
            if fallocate in ("native", "posix", "1"):
                os.posix_fallocate(fd, 0, end)
            elif fallocate == "keep":
                _keep_size_fallocate(fd, end)
            elif fallocate == "truncate":
                os.ftruncate(fd, end)
    except OSError as exc:
        raise setup_error(job, path, exc, f"cannot allocate {end} bytes (fallocate={fallocate}):") from None
    finally:
        os.close(fd)


def _keep_size_fallocate(fd: int, end: int) -> None:
    """fallocate(2) with FALLOC_FL_KEEP_SIZE: blocks for [0, end), the size left alone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, end) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_up(plan, engine, log, *, readonly: bool = False) -> None:
    """A clone's file before the run (plan.ClonePlan) for its engine (IOEngineOps): laid
    out for a job that reads (or with overwrite), else given what `fallocate` gives it (a
    device's image: its own size, sparse); under --readonly only checked; none for a
    diskless engine."""
    job = plan.job
    if engine.diskless:
        return
    if not job["allow_file_create"] and not os.path.exists(plan.filename):
        raise job.error("allow_file_create", f"{plan.filename} does not exist and allow_file_create=0 forbids "
                                             "creating it (fio: file creation disallowed by allow_file_create=0)")
    if readonly:
        check_readonly(job, plan.filename, plan.file_end)
    elif job["rw"].reads or job["overwrite"]:
        try:
            lay_out(plan.filename, plan.region_start, plan.file_end, log, sync=job["create_fsync"])
        except OSError as exc:
            raise setup_error(job, plan.filename, exc, "cannot lay out") from None
    else:
        extend(job, plan.filename, plan.file_end, "truncate" if engine.uses_device else job["fallocate"])


def huge_pages_free() -> int:
    """The system's free huge pages (/proc/meminfo's HugePages_Free; 0 where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("HugePages_Free:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def remove(path: str) -> None:
    """fio's unlink: the file goes (one already gone is no error)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def check_readonly(job, path: str, end: int) -> None:
    """Under fio's --readonly a file is read as it is: one missing or shorter than the job
    needs is an error (fio: "refusing extend of file due to read-only")."""
    size = os.path.getsize(path) if os.path.isfile(path) else -1
    if size < end:
        have = "does not exist" if size < 0 else f"has {size} bytes"
        raise job.error("filename", f"{path} {have}, the job needs {end}; under --readonly it is not created or "
                                    "extended (fio: refusing extend of file due to read-only)")


def setup_error(job, path: str, exc: OSError, what: str):
    """A JobFileError for an OSError met while creating, laying out or opening `path`."""
    option = "size" if exc.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT) else "filename"
    return job.error(option, f"{what} {path}: {exc.strerror or exc}")


def lay_out(path: str, start: int, end: int, log=print, *, sync: bool = True) -> None:
    """Give [start, end) real blocks where it is a hole, as fio lays out a file before
    a read job: reads of sparse regions never touch the disk and would be far too fast.
    `sync` (fio's create_fsync): written to the disk before the job, so its pages can be
    dropped from the cache; without it they stay, dirty and cached, as under fio."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        holes = [(max(start, size), end)] if end > size else []  # past the end: all hole
        pos, end_now = start, min(end, size)
        while pos < end_now:
            try:
                hole = os.lseek(fd, pos, os.SEEK_HOLE)
            except OSError:
                hole = pos
            if hole >= end_now:
                break
            try:
                data = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError:  # no data after the hole
                data = end_now
            holes.append((hole, min(data, end_now)))
            pos = data
        if not holes:
            return
        total = sum(b - a for a, b in holes)
        st = os.fstatvfs(fd)
        free = st.f_bavail * st.f_frsize
        if total > free:  # before writing anything: fio would fail the same way, only later
            raise OSError(errno.ENOSPC, f"laying it out needs {total} bytes; its file system has {free} free")
        if size < end:
            os.ftruncate(fd, end)
        log(f"{os.path.basename(path)}: Laying out IO file (1 file / {total >> 20}MiB)")
        # random bytes, each 512 starting with its own offset: no two blocks alike, as fio's
        # layout (a fresh random buffer per block), at the cost of a copy
        pattern = np.random.default_rng(0x1A1D).integers(0, 256, LAYOUT_CHUNK, dtype=np.uint8)
        chunk = np.empty(LAYOUT_CHUNK, np.uint8)
        for a, b in holes:
            a -= a % 4096
            while a < b:
                n = min(LAYOUT_CHUNK, b - a)
                chunk[:] = pattern
                chunk.view(np.uint64)[::64] = np.arange(a, a + LAYOUT_CHUNK, 512, dtype=np.uint64)
                os.pwrite(fd, chunk[:n], a)
                a += n
        if sync:
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # later O_DIRECT reads must hit the disk
    finally:
        os.close(fd)


def pre_read(path: str, offset: int, length: int, bs: int) -> None:
    """fio's pre_read: read [offset, offset+length) of the file once, `bs` bytes at a
    time, so the job's buffered reads find it in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        end = offset + length
        while offset < end:
            got = os.pread(fd, min(bs, end - offset), offset)
            if not got:  # (past the file's end: nothing more to cache)
                break
            offset += len(got)
    finally:
        os.close(fd)


def drop_cached(path: str, offset: int, length: int) -> None:
    """fio's `invalidate`: drop the page cache's clean pages of [offset, offset+length) of
    the file, so a buffered job reads from the disk as fio's does (dirty pages stay: the
    kernel writes them back first, as under fio)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
