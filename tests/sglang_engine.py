"""SGLang's storage side, built from its real classes on a CPU: a device KV pool (MHA or
MLA) over CPU tensors, its paged allocator, the host pool SGLang builds from the device
pool's buffer info, and a HiCacheController that attaches the cxlhm backend through
``attach_storage_backend("dynamic", ...)`` and moves pages with its four storage
threads (prefetch, prefetch I/O, prefetch sync, backup).

What the scheduler would do is done here by hand: backups go through ``write_storage``
and are acknowledged on ``ack_backup_queue``; a prefetch goes through ``prefetch``, its
hit (already reduced across ranks by the controller's MIN over gloo) comes back on
``prefetch_hit_queue``, host pages are allocated from the host pool as SGLang's radix
cache does, and the loaded count comes back on ``ack_prefetch_queue``.

Two things are stated to SGLang by hand because no launcher publishes them: the
process group (gloo, one process per TP rank) and the parallel widths (TP/PP ranks,
DCP off) through ``get_parallel().override_permanently``.
"""
from __future__ import annotations

import tempfile
import threading
from queue import Empty

import engines  # noqa: F401 - imports the engines (stubs only what SGLang needs and cannot have here)
import torch
import torch.distributed as dist
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel

TIMEOUT_S = 120  # generous: the machine is shared; nothing here depends on speed


def join_process_group(rank: int = 0, world: int = 1, rendezvous: str | None = None) -> None:
    """This process as TP rank `rank` of `world` (gloo), and SGLang told so."""
    if not dist.is_initialized():
        path = rendezvous or tempfile.mktemp(prefix="cxlhm-gloo-")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    get_parallel().override_permanently(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=rank, tp_size=world,
                                        pp_rank=0, pp_size=1)


def extra_config(image, v1: bool, **more) -> dict:
    return {"backend_name": "cxlhm", "module_path": "host_runtime.shim.sglang", "class_name": "CxlhmHiCacheStorage",
            "interface_v1": int(v1), "hints": "none",
            "device": {"capacity": "8MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
                       "backend": {"path": str(image)}}, **more}


class Engine:
    """One SGLang engine's storage side (see the module docstring)."""

    def __init__(self, image, *, layout: str = "page_first", v1: bool = True, mla: bool = False, page: int = 4,
                 layers: int = 3, heads: int = 5, dim: int = 8, tokens: int = 64, dtype=torch.bfloat16,
                 model: str = "meta-llama/Llama-3-8B", **extra):
        if not dist.is_initialized():  # a TP rank's process joined its group already
            join_process_group()
        self.image, self.page, self.model, self.extra = image, page, model, extra
        if mla:
            self.device_pool = MLATokenToKVPool(tokens, page, dtype, dim, 4, layers, "cpu", False)
            self.host_pool = MLATokenToKVPoolHost(self.device_pool._mla_buffer_info(), 2.0, 0, page, layout,
                                                  pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                                                  start_layer=0, end_layer=layers, target_layer_num=layers)
        else:
            self.device_pool = MHATokenToKVPool(tokens, page, dtype, heads, dim, layers, "cpu", False,
                                                enable_alt_stream=False)
            self.host_pool = MHATokenToKVPoolHost(self.device_pool._mha_buffer_info(), 2.0, 0, page, layout,
                                                  pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                                                  start_layer=0, end_layer=layers)
        allocator = PagedTokenToKVPoolAllocator(tokens, page, dtype, "cpu", self.device_pool, False)
        self.controller = HiCacheController(allocator, self.host_pool, page, dist.group.WORLD, threading.Event(),
                                            io_backend="direct")
        self.attach(v1)

    # ------------------------------------------------------------ lifecycle
    def attach(self, v1: bool) -> None:
        self.controller.attach_storage_backend("dynamic", model_name=self.model,
                                               storage_backend_extra_config=extra_config(self.image, v1, **self.extra))

    def detach(self) -> None:
        self.controller.detach_storage_backend()

    def close(self) -> None:
        if self.controller.enable_storage:
            self.detach()

    @property
    def backend(self):
        return self.controller.storage_backend

    @property
    def zero_copy(self) -> bool:
        return self.controller.page_get_func.__func__ is HiCacheController._page_get_zero_copy

    # ------------------------------------------------------------ pages
    def keys(self, tokens: list[int]) -> list[str]:
        return get_storage_hash_str(tokens, None, page_size=self.page)

    def alloc(self, n_tokens: int) -> torch.Tensor:
        indices = self.host_pool.alloc(n_tokens)
        assert indices is not None, "the host pool is full"
        return indices

    def backup(self, tokens: list[int], host_indices: torch.Tensor) -> int:
        """SGLang's write-through to storage: the tokens backed up."""
        op_id = self.controller.write_storage(host_indices, tokens, hash_value=self.keys(tokens))
        op = self.controller.ack_backup_queue.get(timeout=TIMEOUT_S)
        assert op.id == op_id
        return op.completed_tokens

    def prefetch(self, tokens: list[int]) -> tuple[int, int, torch.Tensor | None]:
        """(tokens the hit query found, after the ranks' MIN; tokens loaded; the host
        indices they were loaded into)."""
        op = self.controller.prefetch(f"req-{id(tokens)}", tokens)
        hit = self.controller.prefetch_hit_queue.get(timeout=TIMEOUT_S)
        assert hit is op
        if op.storage_hit_count == 0:
            return 0, 0, None
        op.host_indices = self.alloc(op.storage_hit_count)
        self.controller.prefetch_buffer.put(op)
        loaded = 0
        while True:
            try:
                ack = self.controller.ack_prefetch_queue.get(timeout=TIMEOUT_S)
            except Empty:
                raise AssertionError("the prefetch never finished") from None
            if ack.completed_tokens is not None:
                loaded = max(loaded, ack.completed_tokens)
            if ack.completed_req:
                return op.storage_hit_count, loaded, op.host_indices


def page_starts(indices: torch.Tensor, page: int) -> list[int]:
    return [int(i) // page for i in indices[::page]]


def fill_random(pool, indices: torch.Tensor, seed: int) -> None:
    """Random bytes into the host pages at `indices` (as a device backup would)."""
    gen = torch.Generator().manual_seed(seed)
    for start in indices[::pool.page_size]:
        page = pool.get_data_page(int(start), flat=True)
        raw = torch.randint(0, 256, (page.numel() * page.element_size(),), dtype=torch.uint8, generator=gen)
        pool.set_from_flat_data_page(int(start), raw.view(page.dtype))


def page_bytes(pool, start: int) -> torch.Tensor:
    """A page as the copy path lays it out (the same layout for both pages compared)."""
    page = pool.get_data_page(int(start), flat=True)
    return page.contiguous().view(torch.uint8).clone()


def mla_rank(rank: int, world: int, rendezvous: str, image: str, replicas: bool, results) -> None:
    """One TP rank of an MLA model (run in its own process): back the same pages up
    (MLA's latent KV is identical on every rank), then prefetch them; the controller
    reduces the ranks' hits with its own gloo MIN. Puts (rank, backed up, found,
    loaded, pages equal) on `results`."""
    try:
        if dist.is_initialized():  # forked from a process that had its own group
            dist.destroy_process_group()
        join_process_group(rank, world, rendezvous)
        e = Engine(image, layout="page_first", v1=True, mla=True, mla_replicas=replicas)
        tokens = list(range(6 * e.page))
        source = e.alloc(len(tokens))
        fill_random(e.host_pool, source, seed=11)
        want = [page_bytes(e.host_pool, int(i)) for i in source[::e.page]]
        backed = e.backup(tokens, source)
        found, loaded, target = e.prefetch(tokens)
        same = target is not None and all(torch.equal(page_bytes(e.host_pool, int(i)), w)
                                          for i, w in zip(target[::e.page], want))
        results.put((rank, backed, found, loaded, same, e.controller.backup_skip, e.backend.shim.tenant.name))
        e.close()
    except BaseException as exc:  # reported to the test, which fails with it
        import traceback
        results.put((rank, "error", traceback.format_exc()))
        raise
