"""The benches' verdict on a case below its target (bench/_common.py reach): a target
beyond the measured bound is called unreachable here, one within it reachable, and a
bound the device beat settles nothing."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _common import reach  # noqa: E402


def test_a_met_target_says_so():
    assert reach("case", 0.97, 0.95, 0.90, "how", "rest") == "case: 0.97x, target 0.95x met"


def test_a_target_beyond_the_bound_is_not_reachable_here():
    line = reach("case", 0.66, 0.85, 0.72, "the raw read, then the copy", "+300 us")
    assert "bound here 0.72x (the raw read, then the copy)" in line
    assert "not reachable on this machine" in line
    assert "reached 0.92 of the bound (+300 us)" in line


def test_a_target_within_the_bound_is_reachable_and_names_what_is_left():
    line = reach("case", 0.79, 0.95, 1.03, "the spread loop", "plan, copies")
    assert "within reach" in line and "reached 0.77 of it; the rest: plan, copies" in line
    assert "not reachable" not in line


def test_a_bound_the_device_beat_settles_nothing():
    line = reach("case", 0.81, 0.85, 0.77, "passes", "-2105 us")
    assert "passed it (1.05 of it)" in line
    assert "not reachable" not in line and "within reach" not in line


def test_a_paired_figure_replaces_the_ratio_of_medians():
    """bench_fio pairs the device with the bound's loop round by round: that figure is the
    one reported, and it decides whether the device passed the bound."""
    line = reach("case", 0.90, 0.95, 0.97, "the spread loop", "plan", of_bound=0.88)
    assert "reached 0.88 of it" in line
    assert "passed it (1.01 of it)" in reach("case", 0.90, 0.95, 0.97, "loop", "plan", of_bound=1.01)


def test_the_cpu_budget_is_one_second_over_the_target_rate():
    """bench_fio's CPU budget: at `target` x fio's IOPS a thread with a core to itself may
    spend 1 s / (target x IOPS) per I/O; the verdict says how far the device is from it."""
    from bench_fio import cpu_budget
    fio = [{"iops": 160_000.0, "cpu_pct": 99.0, "cpu_us_per_io": 6.19}] * 3
    device = [{"cpu_us_per_io": v} for v in (6.9, 7.0, 7.1)]
    text = cpu_budget(device, fio, 0.95)
    allowed = 1e6 / (0.95 * 160_000)
    assert f"spent 7.00 us of CPU per I/O, fio's 6.19 us (99% busy)" in text
    assert f"allows {allowed:.2f} us, {7.0 - allowed:+.2f} us from here" in text
    assert cpu_budget([{"cpu_us_per_io": 6.0}], fio, 0.95).endswith(f"{6.0 - allowed:+.2f} us from here")
