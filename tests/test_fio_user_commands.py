"""fio command lines as published guides give them (etcd's disk check, cloud providers'
disk benchmarks, tutorials), run through `cxlhm fio` as written but for smaller sizes and
run times and local file names: each runs, none refused, with fio's JSON."""
from __future__ import annotations

import json

import pytest

from cxlhm_apps.cli import main

COMMANDS = {
    "etcd disk check": "--rw=write --ioengine=sync --fdatasync=1 --directory=. --size=1m --bs=2300 --name=mytest",
    "randrw 75/25 benchmark": "--randrepeat=1 --ioengine=libaio --direct=1 --gtod_reduce=1 --name=test "
                              "--filename=test --bs=4k --iodepth=64 --size=4M --readwrite=randrw --rwmixread=75",
    "cloud write throughput": "--name=write_throughput --directory=. --numjobs=2 --size=4M --time_based "
                              "--runtime=200ms --ramp_time=100ms --ioengine=libaio --direct=1 --verify=0 --bs=1M "
                              "--iodepth=64 --rw=write --group_reporting=1 --iodepth_batch_submit=64 "
                              "--iodepth_batch_complete_max=64",
    "cloud read iops": "--name=read_iops --directory=. --size=4M --time_based --runtime=200ms --ramp_time=100ms "
                       "--ioengine=libaio --direct=1 --verify=0 --bs=4K --iodepth=256 --rw=randread "
                       "--iodepth_batch_submit=256 --iodepth_batch_complete_max=256",
    "psync clones": "--directory=. --ioengine=psync --name fio_test_file --direct=1 --rw=randwrite --bs=16k "
                    "--size=4M --numjobs=4 --time_based --runtime=200ms --group_reporting --norandommap",
    "buffered libaio": "--name=randwrite --ioengine=libaio --iodepth=1 --rw=randwrite --bs=4k --direct=0 "
                       "--size=4M --numjobs=2 --runtime=200ms --group_reporting --filename=rw.img",
    "fsync each write": "--name=TEST --eta-newline=5s --filename=temp.file --rw=randrw --size=1m --io_size=2m "
                        "--bs=4k --ioengine=libaio --fsync=1 --iodepth=1 --direct=1 --numjobs=1 --runtime=1 "
                        "--group_reporting",
    "overwrite": "--ioengine=libaio --direct=1 --bs=4k --iodepth=64 --size=4M --readwrite=randrw --rwmixread=75 "
                 "--name=az --filename=az.img --gtod_reduce=1 --overwrite=1",
    "end_fsync": "--name=seqwrite --rw=write --direct=1 --ioengine=libaio --bs=32k --numjobs=2 --size=4M "
                 "--runtime=1 --group_reporting --filename=sw.img --end_fsync=1",
    "latency percentiles": "--name=lat --rw=randread --bs=4k --ioengine=libaio --iodepth=1 --direct=1 --size=4M "
                           "--filename=lat.img --runtime=200ms --time_based --percentile_list=50:99:99.9 "
                           "--lat_percentiles=1",
    "no fallocate": "--name=zipf --filename=z.img --size=4M --rw=randread --random_distribution=zipf:1.1 --bs=4k "
                    "--ioengine=psync --runtime=200ms --time_based --fallocate=none",
    "create_on_open": "--name=buffered --filename=b.img --size=4M --rw=write --bs=64k --ioengine=sync "
                      "--end_fsync=1 --create_on_open=1",
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_published_command_line_runs_as_written(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    rc = main(["fio", "--output-format=json", "--eta=never", *COMMANDS[name].split()])
    out = capsys.readouterr()
    assert rc == 0, out.err
    jobs = json.loads(out.out)["jobs"]
    assert jobs and all(j["error"] == 0 for j in jobs)
    assert all(j["read"]["total_ios"] + j["write"]["total_ios"] > 0 for j in jobs)
