"""Error paths: each is a clear Python exception, never a crash."""
import re

import pytest
import torch

import torchtpu

DEV = "tpu"


def _ok(p):
    assert p.returncode == 0, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-3000:]}"
    return p.stdout


# ---------------------------------------------------------------- plugin
MISSING = r"""
import torch, torchtpu
assert torch.tpu.is_available() is False
assert torch.tpu.device_count() == 0
assert torch.accelerator.device_count() == 0 or True
for f in (lambda: torch.ones(2, device="tpu").cpu(), lambda: torch.zeros(3).to("tpu"),
          lambda: torch.tpu.synchronize(), lambda: torch.tpu.get_device_name()):
    try:
        f()
    except (RuntimeError, ImportError) as e:
        print("ERR", type(e).__name__, str(e).replace("\n", " "))
    else:
        print("NOERR")
# the CPU keeps working
print("CPU", (torch.ones(2) + 1).tolist())
"""


@pytest.mark.parametrize("plugin,pattern", [
    ("/nonexistent.so", r"/nonexistent\.so.*no such file"),
    ("tpu", r"libtpu|no TPU|Cloud TPU"),
    ("bogus", r"unknown TORCHTPU_PLUGIN"),
])
def test_missing_plugin(pyrun, plugin, pattern):
    out = _ok(pyrun(MISSING, env={"TORCHTPU_PLUGIN": plugin, "TPU_LIBRARY_PATH": None}))
    lines = [l for l in out.splitlines() if l.startswith(("ERR", "NOERR"))]
    assert len(lines) == 4 and all(l.startswith("ERR") for l in lines), out
    for l in lines:
        assert re.search(pattern, l), l
    if plugin == "tpu":
        import importlib.util

        # libtpu absent: how to install it; present (torchtpu[tpu] on a host with no TPU): no hang, no TPU here
        hint = "pip install libtpu" if importlib.util.find_spec("libtpu") is None else "this host has no TPU"
        assert all(hint in l for l in lines), out
    assert "CPU [2.0, 2.0]" in out


def test_not_a_pjrt_plugin(pyrun):
    import ctypes.util
    import glob

    libs = glob.glob("/lib/x86_64-linux-gnu/libm.so.6") + glob.glob("/usr/lib/x86_64-linux-gnu/libm.so.6")
    if not libs:
        pytest.skip("no libm to point at")
    code = r"""
import torch, torchtpu
try:
    torch.ones(2, device="tpu").cpu()
except RuntimeError as e:
    print("ERR", e)
"""
    out = _ok(pyrun(code, env={"TORCHTPU_PLUGIN": libs[0]}))
    assert "ERR" in out and "not a PJRT plugin" in out, out


def test_failing_pjrt_call_surfaces_plugin_message():
    bad = ("module { func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> {"
           " %0 = stablehlo.add %a, %a : tensor<2xf32> return %0 : tensor<3xf32> } }")
    with pytest.raises(RuntimeError, match=r"PJRT.*expects different type"):
        torchtpu._C._compile(bad)
    # and the device keeps working
    assert (torch.ones(2, device=DEV) + 1).cpu().tolist() == [2.0, 2.0]


# ---------------------------------------------------------------- device indices
def test_bad_device_index():
    torch.ones(1, device=DEV).cpu()  # started
    with pytest.raises(ValueError, match=r"\[0, 0\]"):
        torch.tpu.set_device(5)
    for make in (lambda: torch.empty(2, device="tpu:3"), lambda: torch.zeros(2, device="tpu:1"),
                 lambda: torch.ones(2).to("tpu:2"), lambda: torch.empty_strided((2,), (1,), device="tpu:4")):
        with pytest.raises(RuntimeError, match=r"valid range of device indices is \[0, 0\]"):
            make()
    assert torch.empty(2, device="tpu:0").device == torch.device("tpu", 0)
    with pytest.raises(RuntimeError, match=r"tpu:7"):
        with torch.device("tpu:7"):
            torch.empty(1)


def test_set_device_before_start_out_of_range(pyrun):
    code = r"""
import torch, torchtpu
torch.tpu.set_device(5)
try:
    torch.ones(2, device="tpu").cpu()
except RuntimeError as e:
    print("ERR", e)
"""
    # the CPU plugin creates as many devices as needed: device 5 is driven
    out = _ok(pyrun(code + "print('OK', (torch.ones(2, device='tpu') * 2).cpu().tolist())\n",
                    env={"TORCHTPU_CPU_DEVICE_COUNT": "1"}))
    assert "ERR" not in out and "OK [2.0, 2.0]" in out, out


# ---------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.bits8, torch.complex32], ids=str)
def test_unsupported_dtype_names_it(dtype):
    name = str(dtype).replace("torch.", "")
    with pytest.raises((TypeError, RuntimeError)) as ei:
        torch.empty(2, dtype=dtype, device=DEV)
    msg = str(ei.value)
    alias = {"complex32": "complexhalf"}.get(name, name)
    assert alias in msg.lower(), msg
    assert "tpu" in msg


def test_quantized_dtype_is_an_error():
    with pytest.raises((TypeError, RuntimeError, NotImplementedError)):
        torch.empty(2, dtype=torch.quint8, device=DEV)


def test_mixed_device_error():
    t = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"tpu|cpu|device"):
        torch.add(t, torch.ones(3))


def test_shape_errors_are_pytorch_errors():
    a = torch.ones(2, 3, device=DEV)
    with pytest.raises(RuntimeError, match="size of tensor a|broadcast"):
        a + torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        torch.mm(a, a)
    with pytest.raises(RuntimeError):
        a.view(4)
    # still usable
    assert (a * 2).sum().item() == 12


# ---------------------------------------------------------------- out of memory
OOM = r"""
import gc, torch, torchtpu
xs = []
try:
    for _ in range(100):
        xs.append(torch.ones(4 << 20, device="tpu"))  # 16 MiB each
except torch.OutOfMemoryError as e:
    print("OOM1", len(xs), str(e).replace("\n", " "))
print("ALLOC", torch.tpu.memory_allocated())
# an op whose output does not fit
try:
    y = xs[0] + xs[1]
except torch.OutOfMemoryError as e:
    print("OOM2", str(e).replace("\n", " "))
# growing a storage past the limit
try:
    xs[0].resize_(8 << 20)
except torch.OutOfMemoryError as e:
    print("OOM3", str(e).replace("\n", " "))
try:
    xs[1].untyped_storage().resize_(64 << 20)
except torch.OutOfMemoryError as e:
    print("OOM4", str(e).replace("\n", " "))
print("NOOMS", torch.tpu.memory_stats()["num_ooms"])
xs.clear(); gc.collect()
print("FREED", torch.tpu.memory_allocated())
z = torch.ones(4 << 20, device="tpu") * 3
w = torch.ones(4 << 20, device="tpu") + z
print("AFTER", w[:2].cpu().tolist(), w.sum().item())
"""


def test_out_of_memory(pyrun):
    out = _ok(pyrun(OOM, env={"TORCHTPU_MEMORY_LIMIT": "64M"}))
    lines = dict(l.split(" ", 1) for l in out.splitlines() if " " in l)
    assert lines["OOM1"].startswith("4 "), out
    for k in ("OOM1", "OOM2", "OOM3", "OOM4"):
        assert k in lines, out
        assert "out of memory" in lines[k] and "64.00 MiB" in lines[k], lines[k]
        assert "already allocated" in lines[k] and "limit" in lines[k], lines[k]
    assert "16.00 MiB" in lines["OOM1"]
    assert "TORCHTPU_MEMORY_LIMIT" in lines["OOM1"]
    assert int(lines["ALLOC"]) == 64 << 20
    assert int(lines["NOOMS"]) == 4
    assert int(lines["FREED"]) == 0
    assert lines["AFTER"].startswith("[4.0, 4.0]")


def test_allocation_beyond_device_capacity():
    with pytest.raises(torch.OutOfMemoryError, match="device capacity|TORCHTPU_MEMORY_LIMIT"):
        torch.empty(1 << 50, device=DEV, dtype=torch.uint8)
    assert (torch.ones(2, device=DEV) * 2).cpu().tolist() == [2.0, 2.0]


def test_bad_memory_limit_value(pyrun):
    p = pyrun("import torch, torchtpu", env={"TORCHTPU_MEMORY_LIMIT": "lots"})
    assert p.returncode != 0 and "TORCHTPU_MEMORY_LIMIT" not in p.stderr or "byte size" in p.stderr, p.stderr
    assert "Segmentation" not in p.stderr and "core dumped" not in p.stderr


# ---------------------------------------------------------------- misc
def test_blocklisted_ops_never_fall_back():
    t = torch.ones(3, device=DEV)
    # views are never computed on the CPU: a tpu view must alias tpu storage
    assert t.view(3, 1).untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def test_item_of_multi_element_errors():
    with pytest.raises(RuntimeError, match="a Tensor with 3 elements cannot be converted to Scalar"):
        torch.ones(3, device=DEV).item()


def test_errors_leave_region_clean():
    a = torch.ones(2, 2, device=DEV)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            torch.mm(a, torch.ones(3, 3, device=DEV))
    assert torch.mm(a, a).cpu().tolist() == [[2.0, 2.0], [2.0, 2.0]]


@pytest.mark.parametrize("dtype,value", [(torch.int8, 300), (torch.int8, -128.7), (torch.uint8, 256), (torch.uint8, -1),
                                         (torch.float16, 1e6), (torch.float16, float("inf")), (torch.int32, 2**31),
                                         (torch.int8, 127), (torch.bool, 5), (torch.bfloat16, 1e38)])
def test_fill_value_overflow_raises_like_cpu(dtype, value):
    try:
        want = torch.full((2,), value, dtype=dtype)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.full((2,), value, dtype=dtype, device="tpu")
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.zeros(2, dtype=dtype, device="tpu").fill_(value)
        return
    assert torch.equal(torch.full((2,), value, dtype=dtype, device="tpu").cpu(), want)
