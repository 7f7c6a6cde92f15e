"""Public path of torchtpu.hf.generation (StaticGenerator)."""
from .hf.generation import *  # noqa: F401,F403
from .hf.generation import DEFAULT_BUCKETS, StaticGenerator  # noqa: F401
