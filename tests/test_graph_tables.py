"""The bookkeeping of the tensor tables that CUDA graphs own (csrc/common/graph_tables.h), driven
without a GPU: ``torch.classes.lamb._GraphTablesProbe`` runs the store over a scripted runtime
(device memory on the host, numbered graphs that the test captures and destroys, failures on
demand). What CUDA adds on a GPU is tested by tests/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

import inductor_lamb  # noqa: F401  (registers the probe)

HELD, SPARE, ALLOCATED, BYTES, COPIES = range(5)


def probe():
    return torch.classes.lamb._GraphTablesProbe()


def test_each_graph_has_its_own_written_table_in_any_replay_order():
    """Two graphs capture the same list size: each owns a table with its own bytes, written by
    its own captured copy, so replaying B before A (or either alone) reads B's own table."""
    p = probe()
    p.capture_graph(1)
    a = p.table(300, 1)
    p.capture_graph(2)
    b = p.table(300, 2)
    p.capture_graph(-1)
    assert a != b
    assert p.read(b, 300) == [2] * 300 and p.read(a, 300) == [1] * 300
    assert p.counts()[HELD] == 2 and p.counts()[COPIES] == 2


def test_a_table_comes_back_only_when_its_graph_is_gone():
    p = probe()
    p.capture_graph(1)
    a = p.table(100, 1)
    p.capture_graph(2)
    b = p.table(100, 2)  # graph 1 is alive: a new table, never graph 1's
    assert b != a and p.counts()[ALLOCATED] == 2
    p.capture_graph(-1)
    p.destroy_graph(1)
    assert p.counts()[:2] == [1, 1]
    p.capture_graph(3)
    c = p.table(100, 3)  # graph 1's table, rewritten for graph 3
    assert c == a and p.read(c, 100) == [3] * 100 and p.read(b, 100) == [2] * 100
    assert p.counts()[ALLOCATED] == 2


def test_memory_stays_flat_over_many_captures():
    """100 captures of lists of growing and shrinking sizes, each graph destroyed before the next
    is captured (as a re-recorded graph replaces the old one): memory is what one graph needs."""
    p = probe()
    for k in range(100):
        p.capture_graph(k)
        p.table(1000 + 37 * (k % 7), k % 250)
        p.capture_graph(-1)
        p.destroy_graph(k)
    held, spare, allocated, nbytes, copies = p.counts()
    assert (held, copies) == (0, 100)
    assert allocated == 1 and spare == 1 and nbytes == 4096


def test_memory_is_bounded_by_the_graphs_alive_at_once():
    p = probe()
    for k in range(60):
        p.capture_graph(k)
        p.table(5000, 1)
        p.capture_graph(-1)
        if k >= 3:
            p.destroy_graph(k - 3)  # at most 4 graphs alive
    assert p.counts()[ALLOCATED] == 4 and p.counts()[HELD] == 3  # (graphs 57, 58, 59)


def test_a_larger_list_takes_a_table_that_holds_it():
    p = probe()
    p.capture_graph(1)
    small = p.table(100, 1)
    p.capture_graph(-1)
    p.destroy_graph(1)
    p.capture_graph(2)
    large = p.table(10000, 2)
    assert large != small and p.read(large, 10000) == [2] * 10000
    assert p.counts()[BYTES] == 4096 + 16384


@pytest.mark.parametrize("what", ["alloc_device", "alloc_host", "give_to_graph"])
def test_a_failure_before_the_graph_holds_the_table_gives_it_back(what):
    """A failure before the graph holds its table raises (naming it), counts no table as held, and
    leaves what it took for the next capture, which then works and is that graph's only table."""
    p = probe()
    p.capture_graph(1)
    p.fail_next(what)
    with pytest.raises(RuntimeError, match=f"scripted failure of {what}"):
        p.table(200, 1)
    assert p.counts()[HELD] == 0
    t = p.table(200, 5)
    assert p.read(t, 200) == [5] * 200
    held, spare, allocated, _, _ = p.counts()
    assert (held, spare, allocated) == (1, 0, 1)


def test_a_failed_copy_leaves_the_table_with_its_graph():
    """The graph takes its table before the copy into it is captured: a copy that fails leaves the
    table with that (broken) graph, never to another capture, until the graph is destroyed."""
    p = probe()
    p.capture_graph(1)
    p.fail_next("copy_to_device")
    with pytest.raises(RuntimeError, match="scripted failure of copy_to_device"):
        p.table(200, 1)
    assert p.counts()[:3] == [1, 0, 1]
    p.capture_graph(2)
    t = p.table(200, 2)  # a table of its own
    assert p.counts()[:3] == [2, 0, 2]
    p.capture_graph(-1)
    p.destroy_graph(1)
    p.capture_graph(3)
    assert p.table(200, 3) != t and p.read(t, 200) == [2] * 200


def test_a_table_goes_only_to_captures_on_its_device():
    p = probe()
    p.capture_graph(1)
    a = p.table(100, 1)
    p.capture_graph(-1)
    p.destroy_graph(1)
    p.set_device(1)
    p.capture_graph(2)
    b = p.table(100, 2)  # device 1: not device 0's spare table
    assert b != a and p.counts()[:3] == [1, 1, 2]
    p.set_device(0)
    p.capture_graph(3)
    assert p.table(100, 3) == a


def test_only_a_capture_makes_graph_tables():
    with pytest.raises(RuntimeError, match="no graph is being captured"):
        probe().table(10, 0)
