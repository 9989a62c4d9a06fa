"""iris.ops over several nodes: torchrun agents on one machine, each agent a node.

One launch per topology runs every fused op over the world and over a group spanning nodes
(ops_multinode_checks.py): 2 nodes x 2 ranks, and 3 nodes x 1 rank with a third dtype, both
under ``full`` (the default run's time budget).
"""

from __future__ import annotations

import os

import pytest

from iris.mem.testing import run_nodes

#: Every rank of the job runs it and prints ``CHECKS OK rank <r>`` (the first argument: ranks per node).
CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops_multinode_checks.py")


@pytest.mark.full
def test_fused_ops_two_nodes_of_two():
    run_nodes(CHECKS, 2, 2, "2", timeout=240)


@pytest.mark.full
def test_fused_ops_three_nodes_of_one():
    run_nodes(CHECKS, 3, 1, "1", "--full", timeout=240)
