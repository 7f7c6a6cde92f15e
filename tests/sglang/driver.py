"""Runs SGLang's offline ``sgl.Engine`` on "tpu" in a fresh process (for tests/sglang).

    python tests/sglang/driver.py SPEC.json      # prints one line "RESULT <json>"

SPEC: {"model": dir, "engine": {Engine kwargs}, "batches": [{generate kwargs}, ...]}. Each batch
is one ``Engine.generate`` call on the same engine; the result lists, per batch, every request's
output ids, text and SGLang's meta_info (cached tokens, logprobs, finish reason).
"""
from __future__ import annotations

import json
import os
import sys


def run(spec: dict) -> dict:
    import sglang as sgl
    from sglang.srt.platforms import current_platform

    eng = sgl.Engine(model_path=spec["model"], **spec.get("engine", {}))
    batches = []
    steps = os.environ.get("TORCHTPU_SGLANG_STEP_LOG")
    for i, kwargs in enumerate(spec["batches"]):
        if steps:  # a boundary between batches in the model process's step records
            with open(steps, "a") as f:
                f.write(json.dumps({"batch": i}) + "\n")
        outs = eng.generate(**kwargs)
        if isinstance(outs, dict):
            outs = [outs]
        batches.append([{"output_ids": o.get("output_ids"), "text": o.get("text"), "meta_info": o["meta_info"]}
                        for o in outs])
    if steps:
        with open(steps, "a") as f:
            f.write(json.dumps({"batch": len(spec["batches"])}) + "\n")
    info = eng.get_server_info()
    eng.shutdown()
    return {"batches": batches, "platform": type(current_platform).__qualname__,
            "attention_backend": info.get("attention_backend"), "grammar_backend": info.get("grammar_backend"),
            "max_running_requests": info.get("max_running_requests")}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        result = run(spec)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    os._exit(0)
