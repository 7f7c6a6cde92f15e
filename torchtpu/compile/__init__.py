"""torch.compile(backend="tpu") and Inductor's tpu device.

Layers, bottom up: ``lower`` (FX graph -> one StableHLO program, and its
runner), ``graph_code`` (AOTAutograd's cacheable OutputCode around a lowered
graph), ``inductor`` (torchtpu as Inductor's tpu code generator), ``backend``
(the Dynamo backend "tpu" and the hooks that register it).
"""
from .backend import backend, register
from .lower import metrics, stats

__all__ = ["backend", "register", "metrics", "stats"]
