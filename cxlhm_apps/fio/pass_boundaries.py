"""Where a job's `loops` passes meet (runner.Worker inherits this): the work fio does
between two passes, at the I/O the next one begins with - the last pass's writes
verified (fio's do_verify after each do_io), the file's cached pages dropped (as fio
opens the file again, and at each buffered time_based restart)."""
from __future__ import annotations

from cxlhm_apps.fio import files


class PassBoundaries:
    """Worker's methods for pass boundaries. They use the worker's gen (its pass_starts and
    cache_drops), _ios_done, _drops_done, _passes_done, plan, _side, state and the
    VerifyPhase's verify_each_pass and _verify_written."""

    def _next_boundary(self) -> int | None:
        """The number of the I/O before which a pass's work is due next: the file's cached
        pages dropped, or the pass's writes verified (None: none due)."""
        due = [at for at in (self._next_of(self.gen.cache_drops, "_drops_done"),
                             self._next_of(self.gen.pass_starts, "_passes_done") if self.verify_each_pass else None)
               if at is not None]
        return min(due, default=None)

    def _next_of(self, marks: list[int], done_attr: str) -> int | None:
        done = getattr(self, done_attr)
        while done < len(marks) and marks[done] < self._ios_done:
            done += 1
        setattr(self, done_attr, done)
        return marks[done] if done < len(marks) else None

    def _at_boundary(self) -> None:
        """A new pass begins with the next I/O: fio verifies what the last one wrote (its
        do_verify after each do_io), then, where due, the file's cached pages go."""
        if self.verify_each_pass and self._next_of(self.gen.pass_starts, "_passes_done") == self._ios_done:
            self._side.settle()
            self._verify_written()
            self.state = "R"
            self._passes_done += 1
        if self._next_of(self.gen.cache_drops, "_drops_done") == self._ios_done:
            files.drop_cached(self.plan.filename, self.plan.region_start, self.plan.region_len)
            self._drops_done += 1
