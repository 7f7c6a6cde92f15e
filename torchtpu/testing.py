"""Public path of torchtpu.hf.testing: the device spec for transformers' test
suite (``TRANSFORMERS_TEST_DEVICE_SPEC``; a file that does
``from torchtpu.testing import *``)."""
from .hf.testing import *  # noqa: F401,F403
from .hf.testing import __all__  # noqa: F401
