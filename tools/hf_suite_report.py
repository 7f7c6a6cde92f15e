"""Summarises tools/hf_suite.sh's junit XML: results per model per device and failures by cause.

    python tools/hf_suite_report.py OUT            (reads OUT/<model>-<device>.xml, prints markdown)
"""
from __future__ import annotations

import collections
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

FAILED = ("failed", "error")


TIMES: dict[str, dict[str, float]] = {}  # path -> {test id: seconds}


def load(path: str) -> dict[str, tuple[str, str]]:
    """{test id: (status, message)} with status passed / failed / error / skipped."""
    out = {}
    times = TIMES.setdefault(path, {})
    for case in ET.parse(path).getroot().iter("testcase"):
        if not case.get("name"):
            continue  # pytest interrupted at the model limit writes one empty <testcase/>
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        status, msg = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed"}.get(child.tag, child.tag)
                msg = child.get("message") or (child.text or "")
                if child.tag != "skipped":
                    break
        out[test] = (status, msg)
        times[test] = float(case.get("time") or 0)
    return out


def cause(msg: str) -> str:
    """The first informative line of a failure message, with addresses and counts blurred."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else "(no message)"
    for ln in lines:  # prefer the exception line of a long message
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Failed|Timeout)\b", ln):
            line = ln
            break
    line = re.sub(r"0x[0-9a-fA-F]+", "0x…", line)
    line = re.sub(r"/[^\s'\"]+/", "…/", line)
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return line[:220]


def counts(results: dict) -> collections.Counter:
    return collections.Counter(s for s, _ in results.values())


def main(out: str) -> None:
    runs: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(out, "*-*.xml"))):
        model, device = os.path.basename(path)[:-4].rsplit("-", 1)
        runs[model][device] = load(path)
    devices = sorted({d for r in runs.values() for d in r}, key=lambda d: (d != "cpu", d))

    print("# transformers model tests: tpu against CPU\n")
    head = "| model | " + " | ".join(f"{d} passed | {d} failed | {d} skipped" for d in devices)
    print(head + " | passed on CPU, not on tpu |")
    print("|---" * (1 + 3 * len(devices) + 1) + "|")
    tpu_only = collections.defaultdict(list)     # cause -> [model::test]
    both = collections.defaultdict(list)
    cpu_only = collections.defaultdict(list)
    extra_tpu = collections.defaultdict(list)   # (model, tpu status) -> tests CPU skipped that tpu ran
    missing = collections.defaultdict(list)     # model -> tests CPU ran that tpu did not report
    for model in sorted(runs):
        r = runs[model]
        row = [model]
        for d in devices:
            c = counts(r.get(d, {}))
            if d not in r:
                row += ["-", "-", "-"]
            else:
                row += [str(c["passed"]), str(c["failed"] + c["error"]), str(c["skipped"])]
        n_tpu_only = 0
        cpu, tpu = r.get("cpu"), r.get("tpu")
        if cpu is not None and tpu is not None:
            for test, (cs, cmsg) in cpu.items():
                ts, tmsg = tpu.get(test, (None, ""))
                if ts is None:
                    missing[model].append(test)
                elif cs == "passed" and ts in FAILED:
                    tpu_only[cause(tmsg)].append(f"{model}::{test}")
                    n_tpu_only += 1
                elif cs in FAILED and ts in FAILED:
                    both[cause(cmsg)].append(f"{model}::{test}")
                elif cs in FAILED and ts == "passed":
                    cpu_only[cause(cmsg)].append(f"{model}::{test}")
                elif cs == "skipped" and ts != "skipped":
                    extra_tpu[(model, ts)].append(test)
        print("| " + " | ".join(row) + f" | {n_tpu_only if tpu is not None and cpu is not None else '-'} |")

    def groups(title: str, g: dict) -> None:
        print(f"\n## {title}\n")
        if not g:
            print("none")
            return
        for c, tests in sorted(g.items(), key=lambda kv: -len(kv[1])):
            print(f"- **{len(tests)}** × `{c}`")
            for t in sorted(tests):
                print(f"  - {t}")

    groups("Passed on CPU, failed on tpu, by cause", tpu_only)
    groups("Failed on both devices, by cause (CPU's message)", both)
    groups("Failed on CPU, passed on tpu, by cause (CPU's message)", cpu_only)
    print("\n## Skipped on CPU, run on tpu (e.g. \"requires accelerator\")\n")
    if extra_tpu:
        for (model, status), tests in sorted(extra_tpu.items()):
            print(f"- {model}: {len(tests)} {status}: " + ", ".join(t.split("::")[-1] for t in sorted(tests)))
    else:
        print("none")
    # torchtpu warns once per op and process when an op runs through the CPU fallback.
    fallbacks = collections.defaultdict(set)
    for log in sorted(glob.glob(os.path.join(out, "*-tpu.log"))):
        model = os.path.basename(log)[: -len("-tpu.log")]
        with open(log, errors="replace") as f:
            for op in re.findall(r"torchtpu: (\S+) has no native tpu lowering", f.read()):
                fallbacks[op].add(model)
    print("\n## Ops that ran through the CPU fallback on tpu\n")
    print("\n".join(f"- `{op}`: {', '.join(sorted(ms))}" for op, ms in sorted(fallbacks.items())) or "none")
    print("\n## Slowest tests on tpu (seconds on tpu / on CPU)\n")
    for model in sorted(runs):
        tp, cp = (os.path.join(out, f"{model}-{d}.xml") for d in ("tpu", "cpu"))
        if tp in TIMES:
            top = sorted(TIMES[tp].items(), key=lambda kv: -kv[1])[:3]
            cpu_t = TIMES.get(cp, {})
            print(f"- {model}: " + ", ".join(
                f"{t.split('::')[-1]} {s:.0f}/{cpu_t.get(t, float('nan')):.0f}" for t, s in top))
    if missing:
        print("\n## Run on CPU, not reported on tpu (the model's time limit stopped the run)\n")
        for model, tests in sorted(missing.items()):
            print(f"- {model}: {len(tests)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
