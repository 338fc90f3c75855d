"""`make fuzz`: every untrusted input fuzzed at volume, each in its own process, with the
cases run and the failures seen printed per input.

    python tests/fuzz_volume.py [--cases N] [--jobs J] [INPUT ...]

Inputs: mailbox (command payloads, lengths, raw register writes), config (dicts, YAML
files, --set options), fio (job files), traces (block, oracleGeneral, CSV, Mooncake
JSONL), shim (KVShim and engine adapter calls), pool (a hostile host's requests, ring
entries, shared-memory scribbles and handshakes: tests/fuzz_pool.py). Each input's checks are the ones the
default suite runs on a few hundred cases (tests/fuzz_parsers.py, tests/fuzz_shim.py,
tests/test_mailbox_fuzz.py). The mailbox and the shim are driven by hypothesis (generation
only, no shrinking); config, fio and traces by atheris (libFuzzer, coverage-guided, raw
bytes from a seed corpus of the project's own inputs) when it is installed - `make fuzz`
installs it - and by hypothesis otherwise. A failure is counted and the run goes on; the
first few are printed with their input. Each worker rewrites its tally every 1000 cases
(in the folder printed at the start), so an interrupted run still shows how far it got.
Exit status 1 when any input failed a case or ran fewer than N."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import given

HERE = Path(__file__).resolve().parent
INPUTS = ["mailbox", "config", "fio", "traces", "shim", "pool"]


def _generate(strategy, cases: int, body) -> None:
    from fuzzkit import volume_settings
    volume_settings(cases)(given(strategy)(body))()


def fuzz_config(cases: int, tally) -> dict:
    import fuzz_parsers as fp
    fp.DEVICE_SAMPLE = 50  # the parse is the target; a sample of accepted configs also opens a device
    folder = fp.scratch_folder()
    _generate(fp.CONFIG_INPUTS, cases, lambda case: tally.run(fp.check_config_input, case, folder))
    return {"devices_opened": fp._accepted[0] // fp.DEVICE_SAMPLE, "configs_accepted": fp._accepted[0]}


def fuzz_fio(cases: int, tally) -> dict:
    import fuzz_parsers as fp
    _generate(fp.fio_text(), cases, lambda text: tally.run(fp.check_fio_text, text))
    return {}


def fuzz_traces(cases: int, tally) -> dict:
    import fuzz_parsers as fp
    folder = fp.scratch_folder()
    _generate(fp.TRACE_INPUTS, cases, lambda case: tally.run(fp.check_trace_input, case, folder))
    return {}


def fuzz_shim(cases: int, tally) -> dict:
    import fuzz_parsers as fp
    import fuzz_shim as fs
    world = fs.open_shim_world(fp.scratch_folder())
    sequences = [0]

    def body(ops):
        sequences[0] += 1
        fs.check_shim_ops(world, ops, tally)
    try:
        while tally.n < cases:  # a case is one call; sequences hold 1-14 of them
            _generate(fs.OPS, max(1, (cases - tally.n) // 6), body)
    finally:
        fs.close_shim_world(world)
    return {"sequences": sequences[0]}


def fuzz_mailbox(cases: int, tally) -> dict:
    import fuzz_parsers as fp
    import test_mailbox_fuzz as mf
    with mf.MailboxFuzz("lru", Path(fp.scratch_folder())) as world:
        _generate(mf.fuzz_input, cases, lambda case: tally.run(world.check, case))
        tally.run(world.check_after, count=False)
    return {"commands_serviced": world.mailbox.commands_serviced}


def fuzz_pool(cases: int, tally) -> dict:
    import fuzz_pool as fp
    world = fp.open_world()
    try:
        _generate(fp.CASE, cases, lambda case: tally.run(world.check, case))
    finally:
        world.close()
    return {"by_kind": world.cases, "statuses": {str(k): v for k, v in world.statuses.items()}}


def _report(result: str, name: str, tally, start: float, extra: dict) -> None:
    tmp = Path(result + ".tmp")
    tmp.write_text(json.dumps({"input": name, "cases": tally.n, "failures": tally.failed, "examples": tally.examples,
                               "seconds": round(time.monotonic() - start, 1), **extra}))
    os.replace(tmp, result)


def worker(name: str, cases: int, result: str) -> None:
    from fuzzkit import Tally
    tally = Tally(name, collect=True)
    start = time.monotonic()
    tally.progress = lambda: _report(result, name, tally, start, {"generator": "hypothesis", "finished": False})
    extra = globals()[f"fuzz_{name}"](cases, tally)
    _report(result, name, tally, start, {"generator": "hypothesis", **extra})


def coverage_worker(name: str, cases: int, result: str) -> None:
    """config, fio, traces: libFuzzer (atheris) mutates raw bytes, guided by the coverage
    of cxlhm's own code, from a corpus of the project's valid inputs; each input goes
    through the same checks as the hypothesis cases. The tally is written every 1000
    cases (libFuzzer exits the process when its runs are done)."""
    import atheris
    from fuzzkit import Tally
    with atheris.instrument_imports(include=["cxlhm", "cxlhm_apps"]):
        import fuzz_parsers as fp
    fp.DEVICE_SAMPLE = 50
    tally = Tally(name, collect=True)
    start = time.monotonic()
    folder = fp.scratch_folder()
    check = {"config": lambda data: fp.check_config_bytes(data, folder), "fio": fp.check_fio_bytes,
             "traces": lambda data: fp.check_trace_bytes(data, folder)}[name]
    extra = {"generator": "atheris (coverage-guided)"}

    def one(data: bytes) -> None:
        tally.run(check, data)
        if tally.n % 1000 == 0 or tally.n >= cases:
            if name == "config":
                extra.update(configs_accepted=fp._accepted[0], devices_opened=fp._accepted[0] // fp.DEVICE_SAMPLE)
            _report(result, name, tally, start, extra)

    corpus = fp.seed_corpus(name, Path(folder) / "corpus")
    atheris.Setup([sys.argv[0], f"-runs={cases}", "-max_len=4096", "-print_final_stats=1", str(corpus)], one)
    atheris.Fuzz()


COVERAGE_GUIDED = ("config", "fio", "traces")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", metavar="INPUT", help=f"any of {', '.join(INPUTS)} (default: all)")
    ap.add_argument("--cases", type=int, default=100_000, help="cases per input (default 100000)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="inputs fuzzed at once (default: cores)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        try:
            import atheris  # noqa: F401 - when it is installed (make fuzz installs it), the parsers get it
            coverage = args.worker in COVERAGE_GUIDED
        except ImportError:
            coverage = False
        (coverage_worker if coverage else worker)(args.worker, args.cases, args.result)
        return 0
    names = args.inputs or INPUTS
    unknown = sorted(set(names) - set(INPUTS))
    if unknown:
        ap.error(f"unknown input {', '.join(unknown)}; choose from {', '.join(INPUTS)}")
    start = time.monotonic()
    print(f"fuzzing {', '.join(names)}: {args.cases} cases each, {args.jobs} at once "
          f"({os.cpu_count()} cores, Python {sys.version.split()[0]})", flush=True)
    pending, running, results = list(names), {}, {}
    folder = Path(tempfile.mkdtemp(prefix="cxlhm-fuzz-volume-"))
    print(f"tallies and logs in {folder}", flush=True)
    while pending or running:
        while pending and len(running) < args.jobs:
            name = pending.pop(0)
            with open(folder / f"{name}.log", "w") as log:  # what the targets print (adapters log rejections)
                running[name] = subprocess.Popen([sys.executable, __file__, "--worker", name, "--cases", str(args.cases),
                                                  "--result", str(folder / f"{name}.json")],
                                                 stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
        for name, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            try:
                results[name] = json.loads((folder / f"{name}.json").read_text())
            except (OSError, ValueError):
                tail = (folder / f"{name}.log").read_text(errors="replace")[-1500:]
                results[name] = {"input": name, "cases": 0, "failures": 1,
                                 "examples": [f"worker exit {proc.returncode}: {tail}"]}
            r = results[name]
            print(f"  {name:8s} {r['cases']:>8} cases  {r['failures']} failures  {r.get('seconds', 0):>7} s  "
                  + "  ".join(f"{k}={v}" for k, v in r.items()
                              if k not in ("input", "cases", "failures", "examples", "seconds")), flush=True)
            for example in r["examples"]:
                print(f"      {example}")
        time.sleep(0.2)
    wall = time.monotonic() - start
    bad = [n for n in names if results[n]["failures"] or results[n]["cases"] < args.cases]
    print(f"total: {sum(r['cases'] for r in results.values())} cases, "
          f"{sum(r['failures'] for r in results.values())} failures, {wall:.0f} s wall"
          + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    for name in names:
        from test_reliability import record_figure
        record_figure("fuzz_volume", name, "cases", results[name]["cases"])
        record_figure("fuzz_volume", name, "failures", results[name]["failures"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
