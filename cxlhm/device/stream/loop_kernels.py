"""The streamed I/O loop of one policy (cxlhm/device/stream/loop.py says what it does): `run`,
one time slice of a stream, and `complete`, which takes reaped completions, with the
policy's planner inlined.

Each policy runs its own copy of this module, like the firmware kernels
(cxlhm/firmware_kernels.py): `cxlhm.device.stream.loop.kernels_for` writes it to the compile
cache with the `_policy = ...` line below naming the policy, so the planner is a module
global and numba caches the compiled loop on disk (cxlhm/jit.py says why not closures).
"""
import numpy as np

from cxlhm import firmware as fw
from cxlhm import policies
from cxlhm import sumtable
from cxlhm import counters as C
from cxlhm import blocktable as btm
from cxlhm.jit import njit
from cxlhm.device.stream.state import (
    FINISHED, BLOCKED, WRITE_BACK, REAP_UNLOCKED, DEVICE_FULL, VERIFY, SLICE, WIDE, LOG_WRITES, ISSUED, WB_FAILED,
    VERIFY_HERE, VERIFY_ALL, REAP_AT_ONCE, SLICE_NS, SLICE_MAX_NS, SHARED_SLICE_NS, NEXT, IN_FLIGHT, SLOTS, FILLS, PARKED_WBS, DONE,
    FAILED, HITS, MISSES, REAPED, ERRNO, QUEUED, PEAK, WRITTEN, W_HITS, W_MISSES, N_PARKED, N_READY, WB_USED,
    WB_STAGED, WB_LANDED, WB_LOGGED, WRITTEN_LOGGED, BYPASS_CACHES, WB_FAILED_N, RING, STAGE_SHARE, STAGE_BYTES,
    WB_STAGE, WB_LAND, WB_FAIL, WIDE_BLOCK, ring_reap, monotonic_ns, copy_write_in, touches_writebacks,
    submit, flush_pending, DEFER, AT_PEND_ROWS, AT_PEND_TAGS, submit_bucket, AT_WB_ROWS, AT_WB_STATE, AT_WB_OWNER, AT_WB_FREE, AT_WB_STAGED, AT_WB_LANDED,
    AT_WB_FAILED, AT_TAG_WBS, AT_COPY_JOBS, AT_COPY_OF, AT_COPY_EXPECTED, AT_COPY_CHECKED, landed_sum,
    writeback_done, record_landed, queue_writebacks, native_copy_out_many, native_copy_many, copy_piece, piece_job,
    log_staged)
from cxlhm.device.stream.victims import touches_others

_policy = policies.get("lru")  # the policy of this copy
_firmware = fw.kernels_for(_policy)
plan, invalidate = _firmware.plan, _firmware.invalidate
finish, touches_busy = fw.finish, fw.touches_busy


@njit
def complete(bt, ps, clock, base, block_size, hpas, lens, addrs, kinds, clat, failed_out, arrays, tags, res,
             bad, n, sum_keys, sum_values, record):
    """Take `n` reaped completions: fills (tag = read tag * max_blocks + row) and
    write-backs (tag < 0). bad[j]: fill j read the wrong bytes (its checksum did not
    match). First the copy engine runs every good fill's work as one run (a read's
    copy out; a checksum of each block with a record in the sum table - empty: none -
    right after its copy, while its bytes are in the CPU's cache), shared with its
    helper thread when the run is long; then each completion is settled: a mismatch
    fails its I/O like a failed fill (the driver runs it again through the verifying
    path, which poisons it). A write (kinds[i]) whose fills are all in copies its bytes
    into its slots. A landed write-back lets its I/O go on once its last one is in, and
    its checksum is recorded here (`record`: the driver's sum table and dirty set,
    record_landed) or by the driver at the slice's end (WB_LANDED); a failed one waits
    for the driver (WB_FAILED). The caller has given their room on the ring back (FILLS,
    RING)."""
    st, tag_read, tag_pending, tag_k, tag_failed, tag_issued, tag_slots, tag_installed, row_pos, row_bad, \
        free_tags = arrays[:11]
    wb_rows, wb_state, wb_landed, wb_failed = arrays[AT_WB_ROWS], arrays[AT_WB_STATE], arrays[AT_WB_LANDED], \
        arrays[AT_WB_FAILED]
    max_blocks = tag_slots.shape[1]
    now = monotonic_ns(arrays[14])
    jobs, job_of, expected, checked = arrays[AT_COPY_JOBS], arrays[AT_COPY_OF], arrays[AT_COPY_EXPECTED], \
        arrays[AT_COPY_CHECKED]
    n_jobs = 0
    for j in range(n):
        job_of[j] = -1
        if tags[j] < 0 or res[j] != block_size or bad[j]:
            continue
        tag = tags[j] // max_blocks
        i = tag_read[tag]
        p = row_pos[tag, tags[j] % max_blocks]
        slot = tag_slots[tag, p]
        block = hpas[i] // block_size + p
        if kinds[i]:  # a write's fill: its bytes go in once all its fills are in
            for c in range(5):
                jobs[n_jobs, c] = 0
        else:
            piece_job(jobs, n_jobs, base, block_size, slot, block, hpas[i], lens[i], addrs[i])
        checked[n_jobs] = 0
        if sum_keys.shape[0]:
            # a block an I/O evicted and places again (its own victim) has its new sum here
            landed, want = landed_sum(arrays, block, block_size)
            if not landed:
                b = sumtable.find(sum_keys, block)
                landed, want = b >= 0, sum_values[max(b, 0)]
            if landed:
                jobs[n_jobs, 3] = base + slot * block_size
                jobs[n_jobs, 4] = block_size
                expected[n_jobs] = want
                checked[n_jobs] = 1
        job_of[j] = n_jobs
        n_jobs += 1
    if n_jobs:  # out past the caches only for a stream too large for them
        if st[BYPASS_CACHES]:
            native_copy_out_many(jobs.ctypes.data, n_jobs)
        else:
            native_copy_many(jobs.ctypes.data, n_jobs)
    for j in range(n):
        if tags[j] < 0:
            w = -1 - tags[j]
            if res[j] == wb_rows[w, 1]:
                writeback_done(arrays, w)
                if not record_landed(arrays, w, block_size, record):
                    wb_state[w] = WB_LAND
                    wb_landed[st[WB_LANDED]] = w
                    st[WB_LANDED] += 1
            else:
                wb_state[w] = WB_FAIL
                wb_failed[st[WB_FAILED_N]] = w
                st[WB_FAILED_N] += 1
            continue
        tag = tags[j] // max_blocks
        row = tags[j] % max_blocks
        i = tag_read[tag]
        p = row_pos[tag, row]
        good = job_of[j] >= 0
        if good and checked[job_of[j]]:
            good = np.uint64(jobs[job_of[j], 5]) == expected[job_of[j]]  # (the engine's int64 is the sum's bits)
        if not good:  # failed, short or corrupt: the caller runs it again, verifying
            tag_failed[tag] = 1
            row_bad[tag, row] = 1
        tag_pending[tag] -= 1
        if tag_pending[tag] > 0:
            continue
        k = tag_k[tag]
        if tag_failed[tag]:
            r = 0
            for q in range(k):
                if tag_installed[tag, q]:
                    # a write's newly placed blocks hold nothing it wrote: all go
                    if kinds[i] or row_bad[tag, r]:
                        invalidate(bt, ps, tag_slots[tag, q], clock[0])
                    row_bad[tag, r] = 0
                    r += 1
            failed_out[st[FAILED]] = i
            st[FAILED] += 1
            tag_failed[tag] = 0
            clat[i] = -1
        else:
            if kinds[i]:
                copy_write_in(base, block_size, tag_slots[tag], k, hpas[i], lens[i], addrs[i])
            clat[i] = now - tag_issued[tag]
        finish(bt, tag_slots[tag], k)
        st[SLOTS] -= k
        st[IN_FLIGHT] -= 1
        st[DONE] += 1
        tag_read[tag] = -1
        free_tags[tag_k.shape[0] - 1 - st[IN_FLIGHT] - st[N_PARKED]] = tag  # a stack over the tags in use


@njit
def _issue(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, slat, clat,
           arrays, tag, n_fill, begin, resumed, ring, fd):
    """Queue the planned I/O's fills, or - none needed - complete it now (a read
    whose blocks are all in DRAM, a write that replaces whole blocks or hits).
    `begin`: when planning it began; `resumed`: it was parked for its victims (its
    submission time is in tag_issued)."""
    st, tag_read, tag_pending, tag_k, tag_failed, tag_issued, tag_slots, tag_installed, row_pos, row_bad, \
        free_tags = arrays[:11]
    fills, fill_tags, ts = arrays[12], arrays[13], arrays[14]
    max_blocks = tag_slots.shape[1]
    i = tag_read[tag]
    k = tag_k[tag]
    write = kinds[i] != 0
    # Submitted once planned (fio's slat: taken -> submitted); the copies of blocks
    # already in device DRAM are completion work, in clat like the fills' wait.
    now = monotonic_ns(ts)
    submitted = tag_issued[tag] if resumed else now
    if not resumed:
        slat[i] = now - begin
    first = hpas[i] // block_size
    r = 0
    for q in range(k):
        if tag_installed[tag, q]:
            block = first + q
            # plan() fills a newly placed block unless a write replaces all of it
            if write and block * block_size >= hpas[i] and (block + 1) * block_size <= hpas[i] + lens[i]:
                continue
            row_pos[tag, r] = q
            fill_tags[r] = tag * max_blocks + r
            r += 1
        elif not write:  # resident and not busy (checked before planning): its bytes are good
            copy_piece(base, block_size, tag_slots[tag, q], first + q, hpas[i], lens[i], addrs[i])
    if n_fill == 0:
        if write:
            copy_write_in(base, block_size, tag_slots[tag], k, hpas[i], lens[i], addrs[i])
        clat[i] = monotonic_ns(ts) - submitted
        finish(bt, tag_slots[tag], k)
        st[DONE] += 1
        tag_read[tag] = -1
        free_tags[tag_k.shape[0] - 1 - st[IN_FLIGHT] - st[N_PARKED]] = tag  # a stack over the tags in use
        return
    submit(arrays, ring, fd, fills[tag * max_blocks:(tag + 1) * max_blocks], n_fill, fill_tags)
    st[RING] += n_fill
    tag_pending[tag] = n_fill
    tag_issued[tag] = submitted
    st[IN_FLIGHT] += 1
    st[PEAK] = max(st[PEAK], st[IN_FLIGHT])
    st[SLOTS] += k
    st[FILLS] += n_fill
    st[QUEUED] += 1


@njit
def step(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop, deadline_ns,
         slat, clat, arrays, ring, fd, ring_room, other_slots, n_slots, owner, victims):
    """Queue the write-backs the driver has logged, issue the I/Os whose write-backs
    have landed, then plan and issue I/Os until `depth` are out (or the ring, the
    slots or the I/Os run out). An I/O with dirty victims is parked: its victims are
    staged for the driver to log their checksums (WRITE_BACK), go on the ring with
    the next step, and the I/O is issued when the last one lands - meanwhile the
    stream keeps planning. `victims`: the streams' victim table, this stream's row
    (victims.py: the blocks other streams are writing back)."""
    st, tag_read, tag_pending, tag_k, tag_failed, tag_issued, tag_slots, tag_installed, row_pos, row_bad, \
        free_tags, writebacks, fills = arrays[:13]
    ts, wblocks, parked = arrays[14], arrays[19], arrays[20]
    wb_rows, wb_state, wb_owner, wb_free, wb_staged = arrays[AT_WB_ROWS], arrays[AT_WB_STATE], \
        arrays[AT_WB_OWNER], arrays[AT_WB_FREE], arrays[AT_WB_STAGED]
    tag_wbs = arrays[AT_TAG_WBS]
    depth = tag_k.shape[0]
    n_rows = wb_free.shape[0]
    queue_writebacks(arrays, ring, fd)
    while st[N_READY] > 0:  # their victims are on the SSD now
        st[N_READY] -= 1
        st[N_PARKED] -= 1  # (before _issue: the tag stack counts in-flight and parked tags)
        tag = parked[st[N_READY]]
        st[SLOTS] -= tag_k[tag]  # counted while parked (its slots were BUSY); _issue counts them again
        st[FILLS] -= tag_pending[tag]  # reserved while parked; _issue counts them again
        _issue(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, slat, clat,
               arrays, tag, tag_pending[tag], 0, True, ring, fd)
    st[PARKED_WBS] = 0
    while True:
        wait = ISSUED  # (run hands staged victims to the driver before it waits on an empty ring)
        out = st[IN_FLIGHT] + st[N_PARKED] > 0
        if st[NEXT] >= stop or st[IN_FLIGHT] + st[N_PARKED] >= depth:
            return wait
        i = st[NEXT]
        one_hpa = hpas[i:i + 1]
        one_len = lens[i:i + 1]
        write = kinds[i] != 0
        blocks, busy = touches_busy(bt, one_hpa, one_len, block_size)
        if blocks > tag_slots.shape[1]:
            return wait if out else WIDE
        # no I/O may miss on a victim's block before its bytes are on the SSD and the
        # driver recorded their checksum (nothing out: only the recording is left)
        if st[WB_USED] and touches_writebacks(wb_rows, wb_state, hpas[i], lens[i], block_size):
            return wait if out else WRITE_BACK
        if busy or touches_others(victims, hpas[i], lens[i], block_size):
            return wait if out else BLOCKED
        room = n_slots - bt.scalars[btm.N_PINNED] - other_slots - st[SLOTS]
        if blocks > room or st[FILLS] + blocks > ring_room:
            return wait if out else BLOCKED
        if write and st[WRITTEN] + blocks > wblocks.shape[0]:
            return LOG_WRITES
        if st[WB_USED] + blocks > n_rows:  # the table is full: free the landed rows, or wait for some
            return WRITE_BACK if st[WB_LANDED] or st[WB_STAGED] else wait
        begin = monotonic_ns(ts)
        if deadline_ns > 0 and begin >= deadline_ns:
            return wait
        tag = free_tags[depth - 1 - st[IN_FLIGHT] - st[N_PARKED]]
        tag_read[tag] = i
        hits0 = counters[C.HITS]
        misses0 = counters[C.MISSES]
        ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, one_hpa, one_len, write, write_mode, owner, base,
                                   block_size, tag_slots[tag], tag_installed[tag], writebacks,
                                   fills[tag * tag_slots.shape[1]:(tag + 1) * tag_slots.shape[1]])
        st[HITS] += counters[C.HITS] - hits0
        st[MISSES] += counters[C.MISSES] - misses0
        if write:
            st[W_HITS] += counters[C.HITS] - hits0
            st[W_MISSES] += counters[C.MISSES] - misses0
        st[NEXT] = i + 1
        tag_k[tag] = k
        if not ok:
            # victims already unmapped have been written back by nobody: hand them
            # over (writebacks[:PARKED_WBS]); the driver writes them, then reports full
            for q in range(k):
                if tag_installed[tag, q]:
                    invalidate(bt, ps, tag_slots[tag, q], clock[0])
            finish(bt, tag_slots[tag], k)
            tag_read[tag] = -1
            st[PARKED_WBS] = n_wb
            return DEVICE_FULL
        if write:  # dirty now: the driver logs them (after this I/O's victims' checksums)
            first = hpas[i] // block_size
            for q in range(k):
                wblocks[st[WRITTEN]] = first + q
                st[WRITTEN] += 1
        if n_wb > 0:  # parked until its victims land; the stream plans on meanwhile
            for r in range(n_wb):
                w = wb_free[n_rows - 1 - st[WB_USED]]
                st[WB_USED] += 1
                for c in range(wb_rows.shape[1]):
                    wb_rows[w, c] = writebacks[r, c]
                wb_state[w] = WB_STAGE
                wb_owner[w] = tag
                wb_staged[st[WB_STAGED]] = w
                st[WB_STAGED] += 1
            now = monotonic_ns(ts)
            slat[i] = now - begin
            tag_issued[tag] = now  # submitted: its completion latency runs from here
            tag_pending[tag] = n_fill
            tag_wbs[tag] = n_wb
            st[SLOTS] += k  # BUSY while its victims are written back (other threads plan around them)
            st[FILLS] += n_wb + n_fill  # the ring's room: its write-backs, and its fills to come
            st[N_PARKED] += 1
            continue
        _issue(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, slat, clat,
               arrays, tag, n_fill, begin, False, ring, fd)


@njit
def run(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop, deadline_ns,
        slat, clat, failed_out, arrays, ring, fd, ring_room, other_slots, n_slots, owner, verify, sum_keys,
        sum_values, victims, log_ctl, record, waiting, clock_base, shared):
    """One time slice of the stream (_slice). While another stream shares the device
    its I/Os are prepared for the ring but left off it (state.py's submit) until the
    driver waits for completions without the lock (REAP_UNLOCKED, or SLICE: loop.py's
    reap_unlocked puts them on the ring first); whatever else the slice returns, they go
    on the ring before it does, and what an earlier slice left pending goes first."""
    st, pend_rows, pend_tags = arrays[0], arrays[AT_PEND_ROWS], arrays[AT_PEND_TAGS]
    flush_pending(st, ring, fd, pend_rows, pend_tags)
    st[DEFER] = 1 if shared[0] > 1 else 0
    status = _slice(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop,
                    deadline_ns, slat, clat, failed_out, arrays, ring, fd, ring_room, other_slots, n_slots, owner,
                    verify, sum_keys, sum_values, victims, log_ctl, record, waiting, clock_base, shared)
    st[DEFER] = 0
    if status != REAP_UNLOCKED and status != SLICE:
        flush_pending(st, ring, fd, pend_rows, pend_tags)
    return status


@njit(cache=False)
def _slice(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop, deadline_ns,
           slat, clat, failed_out, arrays, ring, fd, ring_room, other_slots, n_slots, owner, verify, sum_keys,
           sum_values, victims, log_ctl, record, waiting, clock_base, shared):
    """The stream's loop for one time slice (see the module docstring). A reap goes
    back to the driver for verification: always (VERIFY_ALL), or when one of its
    blocks does not match its record in the sum table (VERIFY_HERE). Staged victims'
    checksums are logged here unless `log_ctl` leaves them to the driver (WRITE_BACK);
    `record` (empty: not here) is where the loop keeps the driver's checksums and dirty
    set in step with what it logs and what lands. The slice goes on past SLICE_NS while
    `waiting[0]` (the device lock's waiters) is 0 and `clock_base` >= 0 (the wall clock's
    zero of the firmware's NOW_NS, which the loop then keeps), up to SLICE_MAX_NS.

    `shared[0]` counts the streams running on the device. While another one runs, this
    loop never waits for a completion with the lock held: when none is in it returns
    REAP_UNLOCKED (the driver waits on the ring without the lock, puts what it took in
    `reaped` - st[REAPED] - and runs the loop again, which completes those first), and
    it ends its slice once a thread is blocked on the lock and SHARED_SLICE_NS have
    passed, so each stream's completions are taken while the others' I/O is at the SSD."""
    st, ts, reaped_tags, reaped_res, bad, submits = arrays[0], arrays[14], arrays[15], arrays[16], arrays[17], \
        arrays[18]
    tag_slots = arrays[6]
    stage_batch = max(1, min(tag_slots.shape[0] // STAGE_SHARE, STAGE_BYTES // (block_size * tag_slots.shape[1])))
    slice_end = monotonic_ns(ts) + SLICE_NS
    slice_cap = slice_end - SLICE_NS + SLICE_MAX_NS
    # reads of many large blocks: a reap takes every completion that is in, as one run for
    # the copy engine (one block per I/O: two at a time, so new I/Os go out between them)
    wide_reads = block_size >= WIDE_BLOCK and tag_slots.shape[1] > 1
    most = reaped_tags.shape[0] if wide_reads else REAP_AT_ONCE
    got = st[REAPED]  # completions the driver took while it waited without the lock
    while True:
        if got == 0:
            status = step(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop,
                          deadline_ns, slat, clat, arrays, ring, fd, ring_room, other_slots, n_slots, owner,
                          victims)
            if status != ISSUED:
                return status
            if st[IN_FLIGHT] + st[N_PARKED] == 0:
                return FINISHED
            if st[WB_STAGED] and (st[WB_STAGED] >= stage_batch or st[RING] == 0):
                if not log_staged(arrays, block_size, log_ctl, record):
                    return WRITE_BACK
                continue  # the next step queues them
            if st[QUEUED] > 0:  # the ring hands each I/O to the kernel as it is prepared
                submits[submit_bucket(1)] += st[QUEUED]
                st[QUEUED] = 0
            # another stream shares the device: submit and take what is in, never wait here
            got = ring_reap(ring, 0 if shared[0] > 1 else 1, most, reaped_tags.ctypes.data, reaped_res.ctypes.data)
            if got == 0:
                if st[WB_STAGED] > st[WB_LOGGED] and log_staged(arrays, block_size, log_ctl, record):
                    # a batch short of full goes to the SSD before the wait, not after it
                    queue_writebacks(arrays, ring, fd)
                    ring_reap(ring, 0, 0, 0, 0)  # submit only: takes no completion
                return REAP_UNLOCKED
            if got < 0:
                st[ERRNO] = got
                return VERIFY  # the driver raises; nothing was taken
        st[REAPED] = got
        st[FILLS] -= got  # off the ring: its room is free (complete settles them)
        st[RING] -= got
        if verify == VERIFY_ALL:
            return VERIFY
        for j in range(got):
            bad[j] = 0
        ahead = ISSUED
        if wide_reads:
            # the next pass goes out before the landed ones are copied out, so the SSD
            # keeps a ring's worth in flight through the copy (their slots stay BUSY
            # until complete: nothing plans over them)
            ahead = step(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop,
                         deadline_ns, slat, clat, arrays, ring, fd, ring_room, other_slots, n_slots, owner, victims)
        complete(bt, ps, clock, base, block_size, hpas, lens, addrs, kinds, clat, failed_out, arrays,
                 reaped_tags, reaped_res, bad, got, sum_keys if verify == VERIFY_HERE else sum_keys[:0],
                 sum_values, record)
        st[REAPED] = 0
        got = 0
        if ahead == DEVICE_FULL:  # its plan left victims to the driver (PARKED_WBS), who also retries failed ones
            return DEVICE_FULL
        if st[WB_FAILED_N]:
            return WB_FAILED
        now = monotonic_ns(ts)
        if shared[0] > 1 and waiting[1] > 0 and now >= slice_end - SLICE_NS + SHARED_SLICE_NS:
            now = slice_end  # another stream waits for the lock: its completions are in
        if now >= slice_end and clock_base >= 0 and waiting[0] == 0 and now < slice_cap:
            slice_end = now + SLICE_NS  # nobody waits for the device: no driver's turn yet
            bt.scalars[btm.NOW_NS] = now - clock_base  # (what DeviceState.sync_time does)
        elif now >= slice_end:
            if st[WB_STAGED] > st[WB_LOGGED] or st[WRITTEN] > st[WRITTEN_LOGGED]:
                # a batch short of full goes to the SSD now, not after the driver's turn
                # (which would log it in the interpreter, and queue it only next slice)
                if log_staged(arrays, block_size, log_ctl, record):
                    queue_writebacks(arrays, ring, fd)
                    ring_reap(ring, 0, 0, 0, 0)  # submit only: takes no completion
            return SLICE
