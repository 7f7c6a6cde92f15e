"""Shared by the benchmarks: print the results and save them as JSON."""
from __future__ import annotations

import json


def report(res: dict, path: str | None) -> None:
    print(json.dumps(res, indent=2))
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=2)
