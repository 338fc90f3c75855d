"""Streamed I/O: one host thread keeps many reads and writes in flight on the wall
clock, with the per-I/O work compiled. The device's part that runs it, and what that
part is built from:

    driver.py        the device part (`StreamIO`): stream_io and multi-block reads of the
                     access path; it runs the compiled loop one time slice at a time
                     under the device lock and does between slices what compiled code
                     cannot (checksum records, retries, verification in Python)
    loop.py          the loop's entry points: the per-policy kernels (`kernels_for`),
                     the unlocked reap, and the helpers the driver calls
    loop_kernels.py  the loop itself, with the policy's planner inlined (a template: one
                     generated copy per policy, cached on disk)
    state.py         a stream's state (`StreamState`), the loop's status codes and
                     scalar positions, its write-back table and the ring calls
    victims.py       the streams' victim table: a row per stream of the blocks it is
                     writing back, which every other stream's loop reads directly
    registry.py      the streams as the device's other parts see them (StreamRegistry)
    copyengine.py    the copy engine: copies and checksums between device DRAM and host
                     buffers on two threads (the access path uses it too)

Modules here import each other's public names only.
"""
