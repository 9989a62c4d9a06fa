"""iris.ccl over several nodes: torchrun agents on one machine, each agent a node.

One launch per topology runs every collective over the world and over a group spanning
nodes (ccl_multinode_checks.py): 2 nodes x 2 ranks in the default run, 3 nodes x 1 rank
and more dtypes under ``full``.
"""

from __future__ import annotations

import os

import pytest

from iris.mem.testing import run_nodes

#: Every rank of the job runs it and prints ``CHECKS OK rank <r>`` (the first argument: ranks per node).
CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ccl_multinode_checks.py")


def test_collectives_two_nodes_of_two():
    run_nodes(CHECKS, 2, 2, "2", timeout=240)


@pytest.mark.full
def test_collectives_three_nodes_of_one():
    run_nodes(CHECKS, 3, 1, "1", timeout=240)


@pytest.mark.full
def test_collectives_two_nodes_of_two_every_dtype():
    run_nodes(CHECKS, 2, 2, "2", "--full", timeout=400)
