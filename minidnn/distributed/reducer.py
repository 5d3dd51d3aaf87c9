"""The reducer: DistributedDataParallel's gradient side, bucket by bucket, started from inside backward.

Each parameter's gradient lands in its slot of a flat bucket the moment autograd accumulates it (a
post-accumulate-grad hook: :meth:`minidnn.autograd.Value.register_post_accumulate_grad_hook`), and the parameter's
``.grad`` becomes a view of that slot. When a bucket's last slot is filled its all-reduce (``AVG``) starts, while
backward goes on computing the next buckets' gradients: on the GPU on NCCL's communication stream, so the two
overlap. Buckets start strictly in order (bucket k only after k-1), so every rank issues the same collectives in
the same order even when its gradients arrive in another order. When the last bucket has started, the caller's
stream is made to wait for all of them (no host wait on the GPU): the optimizer then reads averaged gradients.

Views, not copies back: the averaged values are already where ``.grad`` points, so a step copies each gradient once
(into its bucket) instead of twice, and holds one set of gradient buffers; it is PyTorch's
``gradient_as_bucket_view=True``. The bucket layout is fixed at construction, so a captured step (CUDA graph)
replays the same copies and collectives on the same addresses.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

from .. import backend
from ..autograd import Function, Value
from .buckets import bucket_order
from .process_group import ProcessGroup, ReduceOp

__all__ = ["Reducer"]


class _Bucket:
    __slots__ = ("flat", "indices", "xp", "pending", "work")

    def __init__(self, flat: Any, indices: list[int], xp: Any) -> None:
        self.flat, self.indices, self.xp = flat, indices, xp
        self.pending, self.work = len(indices), None


def _hook(reducer_ref: "weakref.ref[Reducer]", index: int):
    def on_gradient(param: Value) -> None:
        reducer = reducer_ref()
        if reducer is not None:
            reducer._on_gradient(index, param)
    return on_gradient


def leaves_reached(outputs: Any) -> set[int]:
    """The ids of the leaf tensors that require grad and that ``outputs`` (a tensor, or tuples, lists and dicts of
    them) depend on through the recorded graph."""
    roots, stack = [outputs], []
    reached: set[int] = set()
    while roots:
        item = roots.pop()
        if isinstance(item, Value):
            if item._node is not None:
                stack.append(item._node)
            elif item.requires_grad:
                reached.add(id(item))
        elif isinstance(item, (tuple, list)):
            roots.extend(item)
        elif isinstance(item, dict):
            roots.extend(item.values())
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for parent in node.parents:
            if isinstance(parent, Function):
                stack.append(parent)
            elif isinstance(parent, Value):
                reached.add(id(parent))
    return reached


class Reducer:
    """Buckets over ``params`` (registration order; ``names`` for messages), all-reduced in ``group``.

    ``limits``: the bucket byte limits (:func:`~minidnn.distributed.buckets.bucket_size_limits`).
    ``find_unused_parameters``: at each forward, walk the graph from its outputs and count the parameters it does
    not reach as ready (their slots hold zeros, or the gradient they already have), at the cost of that walk and of
    one small all-reduce per step that tells which parameters no rank used (their ``.grad`` is left alone).
    """

    def __init__(self, params: Sequence[Value], names: Sequence[str], group: ProcessGroup, limits: Sequence[int],
                 find_unused_parameters: bool = False) -> None:
        self.params, self.names, self.group = list(params), list(names), group
        self.find_unused_parameters = bool(find_unused_parameters)
        keys = [(backend.device_of(p.data), p.data.dtype.str) for p in self.params]
        self.buckets: list[_Bucket] = []
        self._bucket_of = [0] * len(self.params)
        self._views: list[Any] = [None] * len(self.params)
        for number, indices in enumerate(bucket_order([p.data.nbytes for p in self.params], limits, keys)):
            first = self.params[indices[0]].data
            xp = backend.get_array_module(first)
            with backend.on_device(backend.device_of(first)):
                flat = xp.zeros(sum(self.params[i].data.size for i in indices), dtype=first.dtype)
            offset = 0
            for i in indices:
                size = self.params[i].data.size
                self._views[i] = flat[offset:offset + size].reshape(self.params[i].data.shape)
                self._bucket_of[i] = number
                offset += size
            self.buckets.append(_Bucket(flat, list(indices), xp))
        self._ready = [False] * len(self.params)
        self._next = 0  # the next bucket to start
        self._expecting = False  # this step's backward reduces (set by prepare_for_forward)
        self._started = False  # a gradient of this step has arrived
        self._finished = False
        self._locally_unused: list[int] = []
        reference = weakref.ref(self)  # the hooks must not keep a dropped DDP (and its buckets) alive
        self._handles = [p.register_post_accumulate_grad_hook(_hook(reference, i)) for i, p in enumerate(self.params)]

    def bucket_names(self) -> list[list[str]]:
        """Each bucket's parameter names, in reduction order and, within a bucket, in buffer order."""
        return [[self.names[i] for i in bucket.indices] for bucket in self.buckets]

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # --- one step ---------------------------------------------------------------------------------
    def prepare_for_forward(self, sync: bool) -> None:
        """Called by each forward under grad mode: ``sync`` says whether its backward reduces (not under no_sync)."""
        if self._started and not self._finished:
            missing = [self.names[i] for i, ready in enumerate(self._ready) if not ready]
            self._reset(False)
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. These "
                f"parameters received no gradient in the last backward: {', '.join(missing)}. If they are not "
                "used in producing the loss, pass find_unused_parameters=True to DistributedDataParallel; if "
                "they are used after the forward returns (outside it), compute them inside the module's forward.")
        self._reset(sync)

    def _reset(self, sync: bool) -> None:
        self._expecting, self._started, self._finished = sync, False, False
        if sync:
            self._ready = [False] * len(self.params)
            for bucket in self.buckets:
                bucket.pending, bucket.work = len(bucket.indices), None
            self._next = 0
            self._locally_unused = []

    def mark_unused(self, outputs: Any) -> None:
        """find_unused_parameters: count the parameters ``outputs`` does not depend on as ready now."""
        reached = leaves_reached(outputs)
        self._locally_unused = [i for i, p in enumerate(self.params) if id(p) not in reached]
        for index in self._locally_unused:
            view, grad = self._views[index], self.params[index].grad
            if grad is None:
                view[...] = 0
            else:
                self.buckets[self._bucket_of[index]].xp.copyto(view, grad.data)
            self._count_ready(index)

    def _on_gradient(self, index: int, param: Value) -> None:
        """The hook: ``param``'s gradient has just been accumulated."""
        if not self._expecting or param is not self.params[index]:
            return  # under no_sync, or a backward of no synced forward (or a copy of the parameter): local
        bucket = self.buckets[self._bucket_of[index]]
        view, grad = self._views[index], param.grad
        if self._ready[index]:
            if self._bucket_of[index] < self._next:
                raise RuntimeError(
                    f"DistributedDataParallel: parameter {self.names[index]} received a gradient after its bucket's "
                    "all-reduce had started. Either backward ran twice after one forward, or the parameter is used "
                    "by operations whose gradients arrive far apart in backward (each use adds to its gradient); "
                    "a bucket can be reduced only once every part of its gradients is in.")
            bucket.xp.copyto(view, grad.data)  # a second use before the bucket started: the sum so far
            grad.data = view
            return
        self._started = True
        if grad.data is not view:
            bucket.xp.copyto(view, grad.data)
            grad.data = view
        self._count_ready(index)

    def _count_ready(self, index: int) -> None:
        self._ready[index] = True
        bucket = self.buckets[self._bucket_of[index]]
        bucket.pending -= 1
        if bucket.pending == 0:
            while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
                started = self.buckets[self._next]
                started.work = self.group.all_reduce(started.flat, ReduceOp.AVG)
                self._next += 1
            if self._next == len(self.buckets):
                self._finish()

    def _finish(self) -> None:
        for bucket in self.buckets:
            bucket.work.wait()  # GPU: the caller's stream waits; CPU: the host does
            bucket.work = None
        if self.find_unused_parameters:
            self._settle_unused()
        self._finished = True

    def _settle_unused(self) -> None:
        """Give the parameters this rank did not use, but another did, their averaged gradient; leave those no rank
        used as they were (no gradient stays no gradient)."""
        first = self.params[0].data
        xp = backend.get_array_module(first)
        with backend.on_device(backend.device_of(first)):
            used = xp.ones(len(self.params), dtype=xp.int32)
        used[self._locally_unused] = 0
        self.group.all_reduce(used, ReduceOp.MAX).wait()
        used = backend.to_device(used, "cpu")  # a host read: this mode cannot be captured in a CUDA graph
        for index in self._locally_unused:
            if used[index]:
                param, view = self.params[index], self._views[index]
                if param.grad is None:
                    param.grad = param._wrap(view, False)
                else:
                    param.grad.data = view
