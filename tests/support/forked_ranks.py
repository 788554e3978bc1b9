"""Runs a distributed worker's ranks as forked processes and collects what each saved; what
the distributed tests compare them with."""

import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from formats import bit_view

RANKS_TIMEOUT_S = 300  # a hung collective fails the tests instead of stalling the suite


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(run_rank, world: int, out: str) -> list:
    """`run_rank(rank, out, port)` on `world` forked processes (they inherit the modules the
    test process imported: import what the ranks use first), then each rank's results, saved
    by it as `<out>/rank<r>.pt`. A rank's exception is raised here; ranks still running after
    RANKS_TIMEOUT_S are killed and the test fails."""
    ranks = mp.start_processes(run_rank, args=(out, _free_port()), nprocs=world, join=False,
                               start_method="fork")
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not ranks.join(timeout=1):  # raises what a rank raised
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"the {world} ranks did not finish in {RANKS_TIMEOUT_S} s")
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False)
            for r in range(world)]


@pytest.fixture(autouse=True)
def one_thread():
    """(Autouse in the modules that import it.) The one-process references run with the ranks'
    one intra-op thread: a CPU GEMM may order its sums by its thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_equal_bits(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(bit_view(actual), bit_view(expected))
