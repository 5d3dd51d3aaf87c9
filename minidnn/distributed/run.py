"""The launcher: ``python -m minidnn.distributed.run --nproc-per-node N script.py args...``, as torchrun does.

It starts N copies of the script on this node, each with the environment ``init_process_group`` reads (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), forwards
the signals it receives to them, and waits. The job ends with the first rank that fails: the launcher says which
rank died and how, stops the others (SIGTERM, then SIGKILL after a grace period) and exits with the dead rank's
code, so a dead rank never leaves the others hanging in a collective. On several machines run one launcher per
node with ``--nnodes M --node-rank R --master-addr A --master-port P``; ranks of another node that die end their
own node's launcher, and the ranks here then fail in their next collective (a closed socket, or the timeout).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

__all__ = ["main", "rank_environment", "free_port"]

PROGRAM = "python -m minidnn.distributed.run"


def rank_environment(local_rank: int, nproc_per_node: int, nnodes: int, node_rank: int, master_addr: str,
                     master_port: int) -> dict[str, str]:
    """The variables one process gets (torchrun's names): its global and local rank and the job's shape."""
    return {"RANK": str(node_rank * nproc_per_node + local_rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(nnodes * nproc_per_node), "LOCAL_WORLD_SIZE": str(nproc_per_node),
            "GROUP_RANK": str(node_rank), "NODE_RANK": str(node_rank), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port)}


def free_port() -> int:
    """A TCP port free on this machine now, for ``--master-port`` when none is given by the user."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description="Start one process per GPU (or CPU rank) of a "
                                     "data-parallel job and stop them all when one fails.")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, dest="nproc_per_node",
                        help="processes on this node (one per GPU for NCCL)")
    parser.add_argument("--nnodes", type=int, default=1, help="machines in the job")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, dest="node_rank",
                        help="this machine's number, 0..nnodes-1 (node 0 runs rank 0 and the rendezvous store)")
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1", dest="master_addr",
                        help="address of node 0, which every node can reach")
    parser.add_argument("--master-port", "--master_port", type=int, default=29500, dest="master_port",
                        help="a free TCP port on node 0 for the rendezvous store")
    parser.add_argument("--grace-period", type=float, default=5.0, dest="grace_period",
                        help="seconds the other ranks get to exit after SIGTERM, before SIGKILL")
    parser.add_argument("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    parser.add_argument("script", help="the training script (or module, with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def _check(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> None:
    if arguments.nproc_per_node < 1:
        parser.error(f"--nproc-per-node must be >= 1, got {arguments.nproc_per_node}")
    if arguments.nnodes < 1:
        parser.error(f"--nnodes must be >= 1, got {arguments.nnodes}")
    if not 0 <= arguments.node_rank < arguments.nnodes:
        parser.error(f"--node-rank must be in 0..{arguments.nnodes - 1}, got {arguments.node_rank}")
    if not 0 < arguments.master_port < 65536:
        parser.error(f"--master-port must be in 1..65535, got {arguments.master_port}")
    if arguments.grace_period < 0:
        parser.error(f"--grace-period must be >= 0, got {arguments.grace_period}")


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _exit_code(code: int) -> int:
    """The launcher's exit code for a rank's: its own, or 128 + the signal that killed it (as a shell reports)."""
    return code if code >= 0 else 128 - code


class _Job:
    """The running processes of this node, by pid, and how to stop them."""

    def __init__(self, commands: list[list[str]], environments: list[dict[str, str]], ranks: list[int]) -> None:
        self.ranks = ranks
        self.processes = [subprocess.Popen(command, env=environment)
                          for command, environment in zip(commands, environments)]
        self.rank_of = {process.pid: rank for process, rank in zip(self.processes, ranks)}
        self.alive = {process.pid: process for process in self.processes}

    def reap(self, block: bool) -> tuple[int, int] | None:
        """(rank, exit code) of a process that ended (the first to end, when several have), or None."""
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:  # no child left to wait for: none of ours is running
            self.alive.clear()
            return None
        if pid == 0 or pid not in self.alive:
            return None
        process = self.alive.pop(pid)
        process.returncode = os.waitstatus_to_exitcode(status)
        return self.rank_of[pid], process.returncode

    def signal_all(self, signum: int) -> None:
        # os.kill, not Popen.send_signal: that polls first, and a poll that reaps a rank which has just
        # ended hides it from reap's waitpid, so the launcher would wait out the grace period for it.
        for pid in self.alive:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, grace_period: float) -> None:
        """SIGTERM to every process still running, SIGKILL to those left after ``grace_period`` seconds."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_period
        while self.alive and time.monotonic() < deadline:
            if self.reap(block=False) is None:
                time.sleep(0.01)
        self.signal_all(signal.SIGKILL)
        while self.alive and self.reap(block=True) is not None:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    arguments = parser.parse_args(argv)
    _check(parser, arguments)
    per_node = arguments.nproc_per_node
    target = ["-m", arguments.script] if arguments.module else [arguments.script]
    command = [sys.executable, "-u", *target, *arguments.script_args]
    environments = []
    for local_rank in range(per_node):
        environment = dict(os.environ)
        environment.update(rank_environment(local_rank, per_node, arguments.nnodes, arguments.node_rank,
                                            arguments.master_addr, arguments.master_port))
        if per_node > 1:
            # As torchrun: N processes each running a full-width BLAS pool would oversubscribe the cores.
            environment.setdefault("OMP_NUM_THREADS", "1")
        environments.append(environment)
    ranks = [arguments.node_rank * per_node + local_rank for local_rank in range(per_node)]

    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        job.signal_all(signum)

    job = _Job([command] * per_node, environments, ranks)
    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while job.alive:
            ended = job.reap(block=True)
            if ended is None:
                continue
            rank, code = ended
            if received:
                name = signal.Signals(received[0]).name
                sys.stderr.write(f"{PROGRAM}: received {name}; forwarded it to the ranks and stopping them\n")
                job.stop(arguments.grace_period)
                return 128 + received[0]
            if code != 0:
                others = len(job.alive)
                sys.stderr.write(f"{PROGRAM}: rank {rank} (local rank {rank - arguments.node_rank * per_node}, "
                                 f"pid {job.processes[ranks.index(rank)].pid}) {_how(code)}; stopping the other "
                                 f"{others} rank(s) of this node and ending the job with its exit code\n")
                sys.stderr.flush()
                job.stop(arguments.grace_period)
                return _exit_code(code)
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if job.alive:
            job.stop(arguments.grace_period)


if __name__ == "__main__":
    sys.exit(main())
