"""iris.ops over several nodes: torchrun agents on one machine, each agent a node.

One launch per topology runs every fused op over the world and over a group spanning nodes
(ops_multinode_checks.py): 2 nodes x 2 ranks, and 3 nodes x 1 rank with a third dtype, both
under ``full`` (the default run's time budget).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

CHECKS = "ops_multinode_checks.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_agents(script: str, nodes: int, per_node: int, timeout: float, extra: tuple[str, ...] = ()) -> None:
    """Start ``nodes`` torchrun agents of ``per_node`` ranks each on this machine (static
    rendezvous on a free port), each running ``script``; kill them all at ``timeout``
    seconds and check that every agent, and so every rank, exited 0 with ``CHECKS OK``."""
    port = _free_port()
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env.pop("IRIS_NODE_ID", None)
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={per_node}"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={port}", "--max_restarts=0"]
    agents = [
        subprocess.Popen(
            [*cmd, f"--node_rank={i}", os.path.join(here, script), str(per_node), *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for i in range(nodes)
    ]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    text = "\n".join(outputs)
    assert len(outputs) == nodes, f"the agents did not finish within {timeout} s:\n{text[-4000:]}"
    codes = [agent.returncode for agent in agents]
    assert codes == [0] * nodes, f"agent exit codes {codes}:\n{text[-6000:]}"
    oks = {line.split()[-1] for line in text.splitlines() if line.startswith("CHECKS OK rank")}
    assert oks == {str(r) for r in range(nodes * per_node)}, (
        f"ranks reporting CHECKS OK: {sorted(oks)}\n{text[-4000:]}"
    )


@pytest.mark.full
def test_fused_ops_two_nodes_of_two():
    run_agents(CHECKS, nodes=2, per_node=2, timeout=240)


@pytest.mark.full
def test_fused_ops_three_nodes_of_one():
    run_agents(CHECKS, nodes=3, per_node=1, timeout=240, extra=("--full",))
