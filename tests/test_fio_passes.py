"""Where fio drops a file's cached pages: as it opens the file for each pass (loops), and
for buffered I/O at each time_based restart (a full random map cleared, a sequential job
back at the start: fio's loop_cache_invalidate), so a buffered job over a small region
reads from the disk as fio's does, not from the pages its last pass left."""
from __future__ import annotations

import pytest

from cxlhm_apps.fio import files, raw_engines
from fio_helpers import run_ours as _ours

@pytest.mark.parametrize("lines,drops", [
    ("rw=randread\ntime_based\nruntime=60\nnumber_ios=64\n", [0, 16, 32, 48]),  # the map full: fio clears it
    ("rw=read\ntime_based\nruntime=60\nnumber_ios=64\n", [0, 16, 32, 48]),  # back at the start
    ("rw=randread\ntime_based\nruntime=60\nnumber_ios=64\ndirect=1\n", [0]),  # O_DIRECT: nothing cached
    ("rw=randread\ntime_based\nruntime=60\nnumber_ios=64\ninvalidate=0\n", []),
    ("rw=read\nloops=3\n", [0, 16, 32]),  # a new pass opens the file again
])
def test_a_buffered_job_drops_the_cached_pages_where_fio_does(tmp_path, monkeypatch, lines, drops):
    at, ran = [], {"ios": 0}
    real_drop, real_raw = files.drop_cached, raw_engines.RawEngine.execute

    def drop(path, offset, length):
        at.append(ran["ios"])
        return real_drop(path, offset, length)

    def execute(self, chunk, arena, deadline_ns, *, keep_read_data):
        done = real_raw(self, chunk, arena, deadline_ns, keep_read_data=keep_read_data)
        ran["ios"] += done.count
        return done

    monkeypatch.setattr(files, "drop_cached", drop)
    monkeypatch.setattr(raw_engines.RawEngine, "execute", execute)
    _, job = _ours(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nbs=4k\nioengine=psync\n{lines}")
    assert job["error"] == 0 and job["read"]["total_ios"] == (48 if "loops" in lines else 64)
    assert at == drops
