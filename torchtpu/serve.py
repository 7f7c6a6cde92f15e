"""Public path of torchtpu.hf.serve: ``python -m torchtpu.serve MODEL_DIR``."""
from .hf.serve import *  # noqa: F401,F403
from .hf.serve import main

if __name__ == "__main__":
    main()
