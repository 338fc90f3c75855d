"""Job options on the command line, as fio takes them: `cxlhm fio --name=etcd --rw=write
--bs 2300 --fdatasync=1 --size=22m`.

`--name=NAME` starts a job; the options before the first go to `[global]`, those after it
to that job (fio 3.33's parse_cmd_line). An option is `--key=value`, `--key value`, or a
bare `--flag`. They become the lines of one more job file, `<command line>`, read after
the job files given, so every check and error of a job file applies to them (an error
names the option, and `<command line>` as its file).
"""
from __future__ import annotations

from cxlhm_apps.fio.options import lookup

SOURCE = "<command line>"
# cxlhm fio's own arguments (argparse's): those that take a value as the next word
OWN_WITH_VALUE = {"--output-format", "--output", "--eta", "--eta-newline", "--eta-interval"}
OWN = OWN_WITH_VALUE | {"--compare-fio", "--cmdhelp", "--readonly", "-h", "--help"}


def _takes_value(key: str) -> bool:
    option = lookup(key)
    return option is None or not option.flag


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(cxlhm fio's own arguments, the job options) of `argv` (the words after `fio`)."""
    own: list[str] = []
    jobs: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        key = word.split("=", 1)[0]
        if not word.startswith("--") or key in OWN or word == "--":
            own.append(word)
            if key in OWN_WITH_VALUE and "=" not in word and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                own.append(argv[i + 1])
                i += 1
        elif "=" in word or not _takes_value(key[2:]) or i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            jobs.append(word[2:])
        else:
            jobs.append(f"{word[2:]}={argv[i + 1]}")
            i += 1
        i += 1
    return own, jobs


class NoJobDefined(ValueError):
    pass


def job_text(options: list[str]) -> str:
    """The job options as job-file text: one line each, a section per `name`."""
    lines = ["[global]"]
    named = False
    for option in options:
        key, _, value = option.partition("=")
        if key.strip() == "name":
            lines.append(f"[{value.strip()}]")
            named = True
        lines.append(option)
    if not named:
        raise NoJobDefined("the command line's job options define no job: --name=NAME starts one (the options "
                           "before the first --name apply to every job, as [global])")
    return "\n".join(lines) + "\n"
