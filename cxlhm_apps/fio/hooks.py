"""fio's exec_prerun and exec_postrun: a shell command before a job's I/O and after it,
its output (stdout and stderr) in `<job name>.prerun.txt` / `.postrun.txt` in the working
folder, as fio's exec_string. A prerun that fails (exit status not 0) means the job does
no I/O and no postrun, with no error of its own, as under fio; the run says so."""
from __future__ import annotations

import subprocess


def run(job, mode: str, say) -> bool:
    """Run the job's exec_`mode` command, if any; whether it succeeded (True without one)."""
    command = job[f"exec_{mode}"]
    if not command:
        return True
    out = f"{job.name}.{mode}.txt"
    say(f"{job.name} : Saving output of {mode} in {out}")
    with open(out, "w") as f:
        status = subprocess.run(command, shell=True, stdout=f, stderr=subprocess.STDOUT).returncode
    if status != 0 and mode == "prerun":
        say(f"fio: job {job.name!r}: exec_prerun exited with status {status}: the job does no I/O (as fio)")
    return status == 0
