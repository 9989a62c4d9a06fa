"""Collective kernels written in Gluon (``triton.experimental.gluon``), selected with
``Config(variant="gluon")``. They compile for NVIDIA GPUs only: the ``cpu`` backend
(Triton's interpreter) cannot run them.
"""
