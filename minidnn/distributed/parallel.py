"""DistributedDataParallel: the same model on every rank, each on its own shard of the batch, gradients averaged.

At construction the parameters and buffers are broadcast from rank 0, so every rank starts from the same weights;
the :class:`~minidnn.distributed.reducer.Reducer` then averages the gradients during backward, bucket by bucket.
With the same weights, the same averaged gradients and the same optimizer, the ranks stay identical step after
step, and a step on N shards of size B computes what one process computes on the global batch of N·B (for a loss
that is a mean over the batch). Batch norm normalises with each rank's own batch statistics (its running statistics
are rank 0's after each forward's buffer broadcast); :class:`~minidnn.distributed.SyncBatchNorm` uses the global
batch's.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from .. import backend
from ..autograd import bump_version, is_grad_enabled
from ..nn.module import Module
from .buckets import bucket_size_limits
from .process_group import ProcessGroup, ReduceOp, default_group
from .reducer import Reducer

__all__ = ["DistributedDataParallel", "broadcast_coalesced"]


def broadcast_coalesced(group: ProcessGroup, tensors: list, src: int = 0) -> None:
    """Broadcast ``tensors`` from rank ``src`` in one collective per (device, dtype): packed into one flat array,
    broadcast, and copied back into each tensor's own memory (their addresses stay: a captured graph or an
    optimizer holding them sees the new values)."""
    if group.size == 1 or not tensors:  # one rank already holds rank 0's values
        return
    groups: dict[tuple, list] = {}
    for tensor in tensors:
        groups.setdefault((backend.device_of(tensor.data), tensor.data.dtype.str), []).append(tensor)
    for members in groups.values():
        xp = backend.get_array_module(members[0].data)
        with backend.on_device(backend.device_of(members[0].data)):
            flat = xp.concatenate([t.data.reshape(-1) for t in members])
        group.broadcast(flat, src).wait()
        offset = 0
        for tensor in members:
            size = tensor.data.size
            tensor.data[...] = flat[offset:offset + size].reshape(tensor.data.shape)
            bump_version(tensor, "broadcast")
            offset += size


def _verify_shapes_match(group: ProcessGroup, module: Module, device: backend.Device) -> None:
    """Every rank must wrap the same architecture: compare rank 0's parameter shapes with this rank's, and stop
    every rank together (one all-reduce of a flag) when one differs, rather than reduce mismatched buckets."""
    shapes = [p.data.shape for p in module.parameters()]
    signature = np.array([len(shapes)] + [n for shape in shapes for n in (len(shape), *shape)], dtype=np.int64)
    lengths = backend.to_device(np.array([signature.size, -signature.size], dtype=np.int64), device)
    group.all_reduce(lengths, ReduceOp.MAX).wait()  # [the longest, minus the shortest]
    longest, shortest = backend.to_device(lengths, "cpu") * np.array([1, -1])
    mismatch = longest != shortest
    if not mismatch:
        theirs = backend.to_device(signature.copy(), device)  # a copy: on the CPU to_device returns the array
        group.broadcast(theirs, 0).wait()
        mismatch = not np.array_equal(backend.to_device(theirs, "cpu"), signature)
    flag = backend.to_device(np.array([int(mismatch)], dtype=np.int32), device)
    group.all_reduce(flag, ReduceOp.MAX).wait()
    if int(backend.to_device(flag, "cpu")[0]):
        raise ValueError(f"DistributedDataParallel: the ranks' models differ (rank {group.rank} has "
                         f"{len(shapes)} parameters; some rank's parameter count or shapes are not rank 0's): "
                         "every rank must wrap the same architecture")


class DistributedDataParallel(Module):
    """``DistributedDataParallel(module, device_ids=None, output_device=None, broadcast_buffers=True,
    process_group=None, bucket_cap_mb=None, find_unused_parameters=False)``: PyTorch's arguments.

    ``module``: on this rank's device (the GPU ``init_process_group`` made current, for NCCL), every parameter on
    one device. ``bucket_cap_mb``: the bucket size (None: 25 MiB with a 1 MiB bucket for the first layers, reduced
    last). ``broadcast_buffers``: copy rank 0's buffers (batch norm's running statistics) to every rank at each
    forward that will be synchronised. ``find_unused_parameters``: see :class:`~minidnn.distributed.reducer.Reducer`.
    ``device_ids``/``output_device``: accepted for PyTorch's scripts; at most the one device the module is on.

    ``forward(*args, **kwargs)`` is the module's; the ``loss.backward()`` that follows averages the gradients.
    ``no_sync()``: a context whose forwards' backwards only accumulate locally (gradient accumulation); the first
    forward and backward after it reduce the sum. The state dict's keys start with ``module.``, as PyTorch's.
    """

    def __init__(self, module: Module, device_ids: Any = None, output_device: Any = None,
                 broadcast_buffers: bool = True, process_group: ProcessGroup | None = None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a minidnn.nn.Module, got {type(module).__name__}")
        group = process_group or default_group()
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter that "
                               "requires a gradient.")
        devices = {backend.device_of(p.data) for p in module.parameters()} | \
            {backend.device_of(b.data) for b in module.buffers()}
        if len(devices) != 1:
            raise ValueError(f"DistributedDataParallel: the module's parameters and buffers must be on one device, "
                             f"found {sorted(map(str, devices))}")
        device = devices.pop()
        if group.device is not None and device != group.device:
            raise ValueError(f"DistributedDataParallel: rank {group.rank}'s module is on {device}, but its process "
                             f"group ({group.name}) communicates on {group.device}: move the module there first "
                             f"(model.to('{group.device}'))")
        for ids, what in ((device_ids, "device_ids"), (output_device, "output_device")):
            if ids is not None:
                listed = ids if isinstance(ids, (list, tuple)) else [ids]
                if len(listed) != 1 or backend.device(f"cuda:{listed[0]}" if isinstance(listed[0], int)
                                                      else listed[0]) != device:
                    raise ValueError(f"DistributedDataParallel: {what} must name the one device the module is on "
                                     f"({device}), got {ids!r}")
        limits = bucket_size_limits(bucket_cap_mb)
        self.module = module
        self.process_group, self.device, self.broadcast_buffers = group, device, bool(broadcast_buffers)
        self.require_backward_grad_sync = True
        _verify_shapes_match(group, module, device)
        # The buffers keep their identity (.to() and load_state_dict write into them), so list them once.
        self._buffers_to_sync = list(module.buffers())
        broadcast_coalesced(group, list(module.parameters()) + self._buffers_to_sync)
        self.reducer = Reducer([p for _, p in named], [n for n, _ in named], group, limits, find_unused_parameters)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not is_grad_enabled():
            return self.module(*inputs, **kwargs)  # evaluation: no backward follows, nothing to reduce
        sync = self.require_backward_grad_sync
        self.reducer.prepare_for_forward(sync)
        if sync and self.broadcast_buffers:
            broadcast_coalesced(self.process_group, self._buffers_to_sync)
        output = self.module(*inputs, **kwargs)
        if sync and self.reducer.find_unused_parameters:
            self.reducer.mark_unused(output)
        return output

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards inside the block run backwards that only accumulate gradients locally (include the forward)."""
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def bucket_names(self) -> list[list[str]]:
        """The buckets' parameter names (the module's names), in the order they are reduced."""
        return self.reducer.bucket_names()

    def extra_repr(self) -> str:
        return f"world_size={self.process_group.size}, backend={self.process_group.name!r}"
