"""The files a device keeps beside its image, and what an open makes of them.

    <image>.cxlhm.json   metadata: geometry, clean-shutdown mark, poison list, how many
                         checksums the last clean close saved; checksummed itself
    <image>.cxlhm.sums   the block checksums saved at the last clean close (checksummed)
    <image>.cxlhm.ilog   the integrity log since then (framed, CRC per record batch)

An image is reopened only with the capacity it was made with. Its checksums and poison
list are per block: reopened with another block size after a clean close, every block
is verified against its old checksum and the state is rebuilt for the new size (a
new block overlapping lost bytes is poisoned for those bytes only); after an unclean
shutdown that is refused. A sidecar that is missing where the
others say it should exist, or that fails its checksum, is never taken as "nothing to
verify": the open is refused with an error naming the file, unless
`backend.lost_sidecar` says how to rebuild a state to verify from (`poison`: every
block holding data reads as poison until rewritten - a KV store recomputes it;
`trust`: the image's bytes as they stand are checksummed again).

The window mode keeps the same metadata file through `Sidecars` (read / write), so
either mode reopens the other's image.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cxlhm.config import ConfigError
from cxlhm.integrity import BlockChecksums, PoisonTable, SidecarCorrupt, checksum, load_sums

log = logging.getLogger("cxlhm.device")

METADATA_FORMAT = 2
LOST_SIDECAR_CHOICES = ("refuse", "poison", "trust")
LOST_SIDECAR_POISON = "its checksums were lost with a sidecar file (backend.lost_sidecar: poison)"


def metadata_path(image_path: str) -> Path:
    return Path(image_path + ".cxlhm.json")


def sums_path(image_path: str) -> Path:
    return Path(image_path + ".cxlhm.sums")


def log_path(image_path: str) -> Path:
    return Path(image_path + ".cxlhm.ilog")


class SidecarError(ConfigError):
    """A sidecar file is missing or corrupt and `backend.lost_sidecar` is `refuse`."""


class Sidecars:
    """The metadata of one image: `read()` checks it, `write()` replaces it atomically.
    `source_of(key)` names the config layer that set a key (for errors)."""

    def __init__(self, image: str, capacity: int, block_size: int, source_of: Callable[[str], str]):
        self.image, self.capacity, self.block_size = image, capacity, block_size
        self.source_of = source_of
        self.path = metadata_path(image)
        self.saved_sums = 0  # checksums the last clean close saved (from the metadata)

    def read(self) -> dict | None:
        """The metadata (None: there is none). SidecarCorrupt if unreadable; ConfigError
        if the image was made with another geometry."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            meta = json.loads(raw)
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise SidecarCorrupt(f"{self.path}: not readable metadata ({exc})") from None
        if meta.get("format", 1) >= 2:
            stated = meta.pop("checksum", None)
            if stated != _digest(meta):
                raise SidecarCorrupt(f"{self.path}: its checksum does not match its contents")
        try:
            capacity, block_size = int(meta["capacity"]), int(meta["block_size"])
            self.saved_sums = int(meta.get("sums", 0))
            PoisonTable(meta.get("poison"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SidecarCorrupt(f"{self.path}: a field is missing or malformed ({exc!r})") from None
        if block_size != self.block_size and not meta.get("clean", False):
            raise ConfigError(self.source_of("block_size"), "block_size",
                              f"the image {self.image} was made with block_size {block_size}, not {self.block_size}, "
                              f"and was not closed cleanly: its integrity log is per block of {block_size} bytes; "
                              f"reopen it with block_size {block_size} first")
        if capacity != self.capacity:
            raise ConfigError(self.source_of("capacity"), "capacity",
                              f"the image {self.image} was made with capacity {capacity}, not {self.capacity}; "
                              f"reopen it with capacity {capacity}")
        return meta

    def write(self, *, clean: bool, poison: PoisonTable | None = None, sums: int | None = None) -> None:
        """Replace the metadata (poison None: keep the list on disk; sums None: keep the
        count on disk)."""
        if sums is not None:
            self.saved_sums = sums
        body = {"format": METADATA_FORMAT, "capacity": self.capacity, "block_size": self.block_size, "clean": clean,
                "sums": self.saved_sums}
        if poison is not None:
            body["poison"] = poison.to_json()
        else:
            try:
                body["poison"] = (self.read() or {}).get("poison", {})
            except SidecarCorrupt:
                body["poison"] = {}
        body["checksum"] = _digest(body)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)


def _digest(meta: dict) -> int:
    return checksum(json.dumps(meta, sort_keys=True).encode())


class OpenedState:
    """What a device starts from: poison, checksums (with the integrity log attached),
    whether the last shutdown was unclean, and what had to be rebuilt (or "")."""

    def __init__(self, poison: PoisonTable, checksums: BlockChecksums, unclean: bool, rebuilt: str = ""):
        self.poison, self.checksums, self.unclean, self.rebuilt = poison, checksums, unclean, rebuilt


def open_state(sidecars: Sidecars, lost_sidecar: str) -> OpenedState:
    """Read the sidecars of an image (its back end already open and locked), rebuild
    what is lost as `lost_sidecar` says, replay the integrity log after an unclean
    shutdown, and mark the metadata unclean until a clean close."""
    image, bs = sidecars.image, sidecars.block_size
    checksums = BlockChecksums(sums_path(image), bs)
    lost: list[str] = []
    meta = None
    try:
        meta = sidecars.read()
    except SidecarCorrupt as exc:
        lost.append(str(exc))
    ilog = log_path(image)
    if meta is None and not lost:
        if checksums.path.exists() or (ilog.exists() and ilog.stat().st_size):
            lost.append(f"{sidecars.path} is missing, but {checksums.path.name} or {ilog.name} exist beside the image")
    unclean = meta is not None and not meta.get("clean", False)
    poison = PoisonTable(meta.get("poison") if meta else None)
    old_bs = int(meta["block_size"]) if meta is not None else bs
    if meta is not None:
        if checksums.path.exists():
            try:
                if old_bs != bs:
                    checksums.sums.set_many(*load_sums(checksums.path, old_bs))
                else:
                    checksums.load()
            except SidecarCorrupt as exc:
                lost.append(str(exc))
        elif sidecars.saved_sums:
            lost.append(f"{checksums.path} is missing; the last clean close saved {sidecars.saved_sums} checksums in it")
        if unclean and not ilog.exists():
            lost.append(f"{ilog} is missing after an unclean shutdown: blocks lost then cannot be told apart")
    rebuilt = ""
    if lost:
        reason = "; ".join(lost)
        if lost_sidecar == "refuse":
            raise SidecarError(sidecars.source_of("backend.path"), "backend.path",
                               f"{reason}. Without it the device cannot verify the image's bytes. Restore the file, "
                               f"or set backend.lost_sidecar to poison (every block holding data reads as poison "
                               f"until rewritten) or trust (checksum the image's bytes as they are now)")
        log.warning("%s: rebuilding its state (backend.lost_sidecar: %s)", reason, lost_sidecar)
        checksums.sums.clear()
        blocks = _blocks_with_data(image, sidecars.capacity, bs)
        if lost_sidecar == "poison":
            for block in blocks:
                poison.blocks[block] = LOST_SIDECAR_POISON
        else:
            sums = _hash_image_blocks(image, blocks, bs)
            checksums.sums.set_many(blocks, sums)
        rebuilt = f"{lost_sidecar}: {reason}"
        unclean = meta is None or unclean
    elif old_bs != bs:
        poison = _regeometry(image, sidecars.capacity, old_bs, bs, checksums, poison)
        rebuilt = f"block_size {old_bs} -> {bs}: every block verified and checksummed again"
    checksums.attach_log(ilog, poison, unclean=unclean and not (rebuilt and lost_sidecar == "poison"))
    sidecars.write(clean=False, poison=poison)  # until a clean close says otherwise
    return OpenedState(poison, checksums, unclean, rebuilt)


def _blocks_with_data(image: str, capacity: int, block_size: int) -> np.ndarray:
    """Block numbers of the image that hold data (sparse holes skipped where the file
    system reports them)."""
    out = []
    fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pos = 0
        while pos < capacity:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
                end = min(os.lseek(fd, start, os.SEEK_HOLE), capacity)
            except OSError:  # no more data (ENXIO), or no hole reporting: the rest is data
                if pos == 0 and not _reports_holes(fd):
                    start, end = 0, capacity
                else:
                    break
            if start >= capacity:
                break
            out.append(np.arange(start // block_size, (end + block_size - 1) // block_size, dtype=np.int64))
            pos = end
    finally:
        os.close(fd)
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)


def _reports_holes(fd: int) -> bool:
    try:
        os.lseek(fd, 0, os.SEEK_HOLE)
        return True
    except OSError:
        return False


def _hash_image_blocks(image: str, blocks: np.ndarray, block_size: int) -> np.ndarray:
    sums = np.zeros(blocks.shape[0], np.uint64)
    with open(image, "rb", buffering=0) as f:
        for i, block in enumerate(blocks.tolist()):
            f.seek(block * block_size)
            data = f.read(block_size)
            sums[i] = checksum(data + bytes(block_size - len(data)))
    return sums


def _regeometry(image: str, capacity: int, old_bs: int, bs: int, checksums: BlockChecksums,
                poison: PoisonTable) -> PoisonTable:
    """After a clean close with block size `old_bs`: verify every old block against its
    checksum, then checksum the image again in blocks of `bs`. The new poison table
    holds, per new block, the old poisoned or failing blocks' bytes (the rest of the
    new block is valid)."""
    old_sums = dict(checksums.sums.items())
    lost = sorted(poison.blocks)
    with open(image, "rb", buffering=0) as f:
        for block, expected in sorted(old_sums.items()):
            if block in poison.blocks:
                continue
            f.seek(block * old_bs)
            data = f.read(old_bs)
            if checksum(data + bytes(old_bs - len(data))) != expected:
                lost.append(block)
    out = PoisonTable()
    for block in lost:  # old block -> the new blocks (or part of one) it covers
        start, end = block * old_bs, (block + 1) * old_bs
        reason = poison.blocks.get(block, "checksum mismatch when the block size changed")
        for new in range(start // bs, (end - 1) // bs + 1):
            base = new * bs
            lo, hi = max(start, base) - base, min(end, base + bs) - base
            valid = out.valid.get(new, [(0, bs)]) if new in out.blocks else [(0, bs)]
            out.blocks[new] = reason
            out.valid[new] = [r for a, b in valid for r in ((a, min(b, lo)), (max(a, hi), b)) if r[0] < r[1]]
            if not out.valid[new]:
                del out.valid[new]
    checksums.sums.clear()
    blocks = _blocks_with_data(image, capacity, bs)
    blocks = blocks[~np.isin(blocks, np.fromiter(out.blocks, np.int64, len(out.blocks)))]
    checksums.sums.set_many(blocks, _hash_image_blocks(image, blocks, bs))
    return out
