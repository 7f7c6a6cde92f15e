"""torchtitan's own trainer on tpu vs the same model's FSDP2 recipe on CPU/Gloo, in one run.

    python benchmarks/bench_titan.py [--steps 8] [--trials 2] [--only titan_tpu_llama3,...] [--json out.json]

Needs the `titan` extra (torchtitan 0.3.0, torch 2.14.1). Every run uses 2
processes (torchrun, FSDP 2), sequence length 128, local batch 2 (4 sequences
per step), fp32 parameters:

  * titan_tpu_llama3: `torchrun -m torchtitan.train --module torchtpu.titan
    --config llama3_debugmodel` on tpu (the README command, shorter);
  * titan_tpu_qwen3: the same with `--config qwen3_debugmodel`;
  * titan_tpu_qwen3_moe: `--config qwen3_debugmodel_moe` (torchtitan's debug MoE: 64 experts of
    768 x 256 in 8 layers, 315.8M parameters, ~45M active per token);
  * titan_tpu_flux: `--config flux_testmodel` (FluxTrainer, CPU-sized FLUX, 64 px images and T5
    length 32: 48 tokens per image, validation off);
  * titan_tpu_<model>_compiled: the same with `--compile.enable` (every block and the loss
    compiled by torchtpu);
  * recipe_cpu_llama3: `torchtpu.examples.train_llama --model debugmodel
    --device cpu` (torchtitan's llama3 debug model, FSDP2 over Gloo): the CPU
    reference. torchtitan itself cannot run on CPU unpatched (docs/titan.md);
  * recipe_tpu_llama3: the same recipe on tpu.

tokens/s is per device, the median over the steps after the first two
(compiles) of each trial, then the median (and min-max) over trials; MFU is
torchtitan's own line for the titan runs. Peak used for every MFU: torchtitan's
fallback for an unknown device (the CPU plugin is "cpu:cpu"), A100 bf16 dense,
312 TFLOP/s, passed to the recipe as --peak-tflops 312: the figures compare
runs, they are not a utilisation of this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from _report import report, thread_settings  # benchmarks/_report.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN_STEP = re.compile(r"step:\s*(\d+).*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%")
SEQ, LOCAL_BATCH, NPROC = 128, 2, 2


def _env(tmp):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    e.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=os.path.join(tmp, "hf_home"),
             WANDB_MODE="disabled", TORCHTPU_CACHE_DIR=os.path.join(tmp, "cache"), OMP_NUM_THREADS="1")
    return e


def _run(cmd, cwd, env, timeout=900):
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{out[-4000:]}")
    return ANSI.sub("", out)


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}", *args]


def titan(tmp, config, steps, *flags):
    run = tempfile.mkdtemp(dir=tmp)
    os.symlink(os.path.join(tmp, "tests"), os.path.join(run, "tests"))
    target = ["--no-python", sys.executable, "-c",
              "import torchtpu, runpy; runpy.run_module('torchtitan.train', run_name='__main__', alter_sys=True)"]
    out = _run(torchrun(*target, "--module", "torchtpu.titan", "--config", config, "--training.steps", str(steps),
                        "--training.seq_len", str(SEQ), "--training.local_batch_size", str(LOCAL_BATCH),
                        "--metrics.log_freq", "1", *flags), run, _env(tmp))
    tps, mfu = {}, {}
    for line in out.splitlines():
        m = TITAN_STEP.search(line)
        if m:  # both ranks print: keep rank 0's (the first) line per step
            tps.setdefault(int(m.group(1)), float(m.group(2).replace(",", "")))
            mfu.setdefault(int(m.group(1)), float(m.group(3)))
    steady = [s for s in sorted(tps) if s > 2]
    if not steady:
        raise RuntimeError("no step lines after step 2:\n" + out[-4000:])
    return statistics.median(tps[s] for s in steady), statistics.median(mfu[s] for s in steady)


def recipe(tmp, device, steps):
    js = os.path.join(tempfile.mkdtemp(dir=tmp), "m.json")
    _run(torchrun("-m", "torchtpu.examples.train_llama", "--device", device, "--model", "debugmodel",
                  "--steps", str(steps), "--seq-len", str(SEQ), "--batch", str(NPROC * LOCAL_BATCH),
                  "--log-every", "1", "--peak-tflops", "312", "--metrics-json", js), tmp, _env(tmp))
    with open(js) as f:
        m = json.load(f)
    per = [f["tokens_per_s_per_device"] for f in m["intervals"] if f["step"] > 2]
    mfu = [f["mfu"] for f in m["intervals"] if f["step"] > 2]
    return statistics.median(per), 100 * statistics.median(mfu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--only", help="comma-separated run names (default: all)")
    ap.add_argument("--json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="torchtpu-bench-titan-")
    subprocess.run([sys.executable, "-m", "torchtpu.titan.assets", os.path.join(tmp, "tests", "assets"),
                    "--docs", "400", "--flux-test-only"], cwd=ROOT, env=_env(tmp), check=True, capture_output=True, timeout=300)
    runs = {
        "titan_tpu_llama3": lambda: titan(tmp, "llama3_debugmodel", a.steps),
        "titan_tpu_qwen3": lambda: titan(tmp, "qwen3_debugmodel", a.steps),
        "titan_tpu_llama3_compiled": lambda: titan(tmp, "llama3_debugmodel", a.steps, "--compile.enable"),
        "titan_tpu_qwen3_compiled": lambda: titan(tmp, "qwen3_debugmodel", a.steps, "--compile.enable"),
        "titan_tpu_qwen3_moe": lambda: titan(tmp, "qwen3_debugmodel_moe", a.steps),
        "titan_tpu_qwen3_moe_compiled": lambda: titan(tmp, "qwen3_debugmodel_moe", a.steps, "--compile.enable"),
        "titan_tpu_flux": lambda: titan(tmp, "flux_testmodel", a.steps, "--validator.no-enable"),
        "titan_tpu_flux_compiled": lambda: titan(tmp, "flux_testmodel", a.steps, "--validator.no-enable",
                                                 "--compile.enable"),
        "recipe_cpu_llama3": lambda: recipe(tmp, "cpu", a.steps),
        "recipe_tpu_llama3": lambda: recipe(tmp, "tpu", a.steps),
    }
    if a.only:
        unknown = set(a.only.split(",")) - set(runs)
        if unknown:
            raise SystemExit(f"unknown runs {sorted(unknown)}; choose from {sorted(runs)}")
        runs = {k: f for k, f in runs.items() if k in a.only.split(",")}
    samples = {k: [] for k in runs}
    t0 = time.time()
    for _ in range(a.trials):  # runs take turns, so drift hits each alike
        for k, f in runs.items():
            samples[k].append(f())
            print(k, "tokens/s/device %.1f  MFU %.4f%%" % samples[k][-1], flush=True)
    res = {"threads": thread_settings(), "seq_len": SEQ, "local_batch": LOCAL_BATCH, "processes": NPROC,
           "steps": a.steps, "trials": a.trials, "peak_tflops_for_mfu": 312, "wall_s": round(time.time() - t0)}
    for k, s in samples.items():
        tps = [x[0] for x in s]
        res[k] = {"tokens_per_s_per_device": statistics.median(tps), "min": min(tps), "max": max(tps),
                  "mfu_percent": statistics.median(x[1] for x in s)}
    if "recipe_cpu_llama3" in res:
        ref = res["recipe_cpu_llama3"]["tokens_per_s_per_device"]
        for k in runs:
            res[k]["vs_recipe_cpu"] = round(res[k]["tokens_per_s_per_device"] / ref, 3)
    for m in ("llama3", "qwen3", "qwen3_moe", "flux"):
        if f"titan_tpu_{m}" in res and f"titan_tpu_{m}_compiled" in res:
            res[f"titan_tpu_{m}_compiled"]["vs_eager"] = round(
                res[f"titan_tpu_{m}_compiled"]["tokens_per_s_per_device"] / res[f"titan_tpu_{m}"]["tokens_per_s_per_device"], 3)
    if "titan_tpu_qwen3" in res and "titan_tpu_qwen3_moe" in res:
        res["titan_tpu_qwen3_moe"]["vs_dense_qwen3"] = round(
            res["titan_tpu_qwen3_moe"]["tokens_per_s_per_device"] / res["titan_tpu_qwen3"]["tokens_per_s_per_device"], 3)
    report(res, a.json)


if __name__ == "__main__":
    main()
