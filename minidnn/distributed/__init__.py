"""``minidnn.distributed``: data-parallel training on several GPUs (or CPU processes), PyTorch's names.

    python -m minidnn.distributed.run --nproc-per-node 2 train_script.py     # one process per GPU

    import minidnn.distributed as dist
    dist.init_process_group("nccl")                        # or "tcp", our CPU backend
    model = dist.DistributedDataParallel(model.to(f"cuda:{dist.get_rank()}"))
    sampler = dist.DistributedSampler(dataset)             # this rank's shard; sampler.set_epoch(e) each epoch

The process group (:mod:`.process_group`) meets through a TCP store (:mod:`.store`) and talks through a backend
that implements :mod:`.group`'s interface: NCCL via CuPy (:mod:`.nccl`, imported only when chosen) or sockets
(:mod:`.tcp`). DistributedDataParallel
(:mod:`.parallel`) averages gradients in buckets (:mod:`.buckets`) started from inside backward (:mod:`.reducer`).
See docs/distributed.md.
"""
from .buckets import compute_bucket_assignment_by_size
from .parallel import DistributedDataParallel
from .process_group import (ProcessGroup, ReduceOp, Work, all_reduce, barrier, broadcast, destroy_process_group,
                            get_backend, get_rank, get_world_size, init_process_group, is_initialized)
from .sampler import DistributedSampler
from .store import TCPStore
from .sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank", "get_world_size",
           "get_backend", "all_reduce", "broadcast", "barrier", "ReduceOp", "Work", "ProcessGroup", "TCPStore",
           "DistributedDataParallel", "DistributedSampler", "SyncBatchNorm", "convert_sync_batchnorm",
           "compute_bucket_assignment_by_size"]
