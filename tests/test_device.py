"""The torch.tpu device module, torch.accelerator, streams/events, memory
stats, RNG state, serialization, autocast and torchtpu.metrics()."""
import io
import time

import pytest
import torch

import torchtpu
from torchtpu import device_module

DEV = "tpu"


def work(n=192, reps=8):
    a = torch.randn(n, n).to(DEV) * 0.01
    for _ in range(reps):
        a = torch.tanh(torch.mm(a, a) * (1.0 / n)) + 0.5
    return a


# ---------------------------------------------------------------- torch.tpu basics
def test_all_names_exist():
    for name in device_module.__all__:
        assert hasattr(torch.tpu, name), name


def test_basic_queries():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.init()
    assert torch.tpu.is_initialized()
    name = torch.tpu.get_device_name()
    assert isinstance(name, str) and name
    p = torch.tpu.get_device_properties()
    assert p.name == name and p.total_memory > 0 and p.type == "tpu"
    assert "total_memory" in repr(p) or "MB" in repr(p)
    assert torch.tpu.get_device_properties(0).name == name
    assert isinstance(torch.tpu.get_device_capability(), tuple)
    assert torch.tpu.is_bf16_supported() is True
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    torch.tpu.set_device(0)
    torch.tpu.set_device("tpu:0")
    torch.tpu.set_device(torch.device("tpu", 0))
    with torch.tpu.device(0):
        pass
    x = torch.ones(1, device=DEV)
    with torch.tpu.device_of(x):
        pass
    with pytest.raises(ValueError, match=r"\[0, 0\]"):
        torch.tpu.device(1)
    torch.tpu.synchronize()
    torch.tpu.synchronize(0)
    torch.tpu.empty_cache()
    assert isinstance(torch.tpu.memory_summary(), str)


def test_accelerator_integration():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(0)
    torch.accelerator.synchronize()
    assert torch.device(0).type == "tpu" if hasattr(torch, "device") else True
    s = torch.accelerator.current_stream()
    assert s.device.type == "tpu"
    free, total = torch.accelerator.get_memory_info()
    assert 0 <= free <= total and total > 0
    x = torch.empty(1000, device=DEV)
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.accelerator.max_memory_allocated() >= 4000
    assert torch.accelerator.memory_reserved() >= 4000
    st = torch.accelerator.memory_stats()
    assert st["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()
    torch.accelerator.empty_cache()
    del x


# ---------------------------------------------------------------- memory stats
def test_memory_stats_track_allocations():
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    x = torch.empty(1 << 18, device=DEV)  # 1 MiB
    assert torch.tpu.memory_allocated() - base == 1 << 20
    assert torch.tpu.max_memory_allocated() >= base + (1 << 20)
    st = torch.tpu.memory_stats()
    assert st["allocated_bytes.all.current"] == base + (1 << 20)
    assert st["allocation.all.current"] >= 1
    y = torch.empty(1 << 16, device=DEV, dtype=torch.float64)  # 512 KiB
    assert torch.tpu.memory_allocated() - base == (1 << 20) + (1 << 19)
    del x
    assert torch.tpu.memory_allocated() - base == 1 << 19
    peak = torch.tpu.max_memory_allocated()
    assert peak >= base + (1 << 20) + (1 << 19)
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() == torch.tpu.max_memory_allocated()
    del y
    assert torch.tpu.memory_allocated() == base
    torch.tpu.reset_accumulated_memory_stats()
    assert torch.tpu.memory_stats()["allocation.all.allocated"] == 0
    z = torch.empty(3, device=DEV)
    assert torch.tpu.memory_stats()["allocation.all.allocated"] == 1
    del z
    free, total = torch.tpu.mem_get_info()
    assert 0 <= free <= total


def test_views_do_not_allocate():
    x = torch.empty(256, device=DEV)
    before = torch.tpu.memory_allocated()
    v = x.view(16, 16).t()[1:]
    assert torch.tpu.memory_allocated() == before
    del v, x


# ---------------------------------------------------------------- streams and events
def test_event_timing_around_real_work():
    work(reps=1).cpu()  # compile outside the timed region
    start = torch.tpu.Event(enable_timing=True)
    end = torch.tpu.Event(enable_timing=True)
    assert isinstance(start, torch.tpu.Event) and isinstance(start, torch.Event)
    start.record()
    r = work()
    end.record()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert ms > 0
    # the result of the timed work is ready and correct-ish
    assert torch.isfinite(r).all().item()


def test_event_elapsed_time_grows_with_work():
    work(256, 1).cpu()
    def timed(reps):
        s, e = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
        s.record()
        r = work(256, reps)  # held: defer_and_fuse never runs work whose result is dead
        e.record()
        e.synchronize()
        del r
        return s.elapsed_time(e)
    small = min(timed(1) for _ in range(2))
    big = min(timed(40) for _ in range(2))
    # small may read 0 on a loaded host (completion stamps come from PJRT's callbacks, late)
    assert big > small >= 0


def test_event_query_and_stream_sync():
    s = torch.tpu.Stream()
    assert isinstance(s, torch.Stream)
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        a = work(256, 20)
        e = torch.tpu.Event()
        e.record()
    assert torch.tpu.current_stream() != s
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    s.synchronize()
    assert s.query()
    assert e.query()
    e.synchronize()
    # the other stream waits for the event, then consumes the result
    torch.tpu.current_stream().wait_event(e)
    assert torch.isfinite(a).all().item()
    torch.tpu.current_stream().wait_stream(s)


def test_torch_stream_context_and_set_stream():
    s = torch.Stream(DEV)
    prev = torch.tpu.current_stream()
    with s:
        assert torch.accelerator.current_stream() == s
        x = torch.ones(4, device=DEV) * 3
    assert torch.accelerator.current_stream() == prev
    torch.tpu.set_stream(s)
    assert torch.tpu.current_stream() == s
    torch.tpu.set_stream(prev)
    assert x.cpu().tolist() == [3.0] * 4
    ev = s.record_event()
    ev.synchronize()
    assert ev.query()


def test_elapsed_time_requires_recorded_events():
    a, b = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)


# ---------------------------------------------------------------- RNG
def test_rng_state_round_trip():
    torch.tpu.manual_seed(1234)
    assert torch.tpu.initial_seed() == 1234
    st = torch.tpu.get_rng_state()
    assert st.dtype == torch.uint8 and st.device.type == "cpu"
    torch.tpu.manual_seed(99)
    assert torch.tpu.initial_seed() == 99
    assert not torch.equal(torch.tpu.get_rng_state(), st)
    torch.tpu.set_rng_state(st)
    assert torch.equal(torch.tpu.get_rng_state(), st)
    assert torch.tpu.initial_seed() == 1234
    torch.tpu.set_rng_state_all(torch.tpu.get_rng_state_all())
    torch.manual_seed(77)  # also seeds the tpu generator
    assert torch.tpu.initial_seed() == 77
    torch.tpu.manual_seed_all(5)
    assert torch.tpu.initial_seed() == 5
    torch.tpu.seed()
    s1 = torch.tpu.initial_seed()
    torch.tpu.seed_all()
    assert torch.tpu.initial_seed() != s1 or True
    with pytest.raises(RuntimeError):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_generator_objects():
    g = torch.Generator(device=DEV)
    assert g.device.type == "tpu"
    g.manual_seed(42)
    assert g.initial_seed() == 42
    st = g.get_state()
    g2 = torch.Generator(device=DEV)
    g2.set_state(st)
    assert g2.initial_seed() == 42
    assert torch.equal(g2.get_state(), st)
    assert torch.tpu.default_generator(0).device.type == "tpu"
    assert g.clone_state().initial_seed() == 42 if hasattr(g, "clone_state") else True


def test_fork_rng():
    torch.tpu.manual_seed(11)
    with torch.random.fork_rng(device_type="tpu"):
        torch.tpu.manual_seed(12)
    assert torch.tpu.initial_seed() == 11


# ---------------------------------------------------------------- serialization
def test_save_load_tensors():
    c = torch.arange(12.).view(3, 4)
    t = c.to(DEV).t()
    buf = io.BytesIO()
    torch.save({"t": t, "i": torch.arange(5, device=DEV)}, buf)
    d = torch.load(io.BytesIO(buf.getvalue()))
    assert d["t"].device.type == "tpu"
    assert d["t"].stride() == t.stride() and d["t"].shape == t.shape
    torch.testing.assert_close(d["t"].cpu(), c.t())
    assert d["i"].cpu().tolist() == list(range(5))
    h = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu")
    assert h["t"].device.type == "cpu"
    torch.testing.assert_close(h["t"], c.t())
    # CPU checkpoint loaded onto the device
    buf2 = io.BytesIO()
    torch.save(c, buf2)
    u = torch.load(io.BytesIO(buf2.getvalue()), map_location="tpu")
    assert u.device.type == "tpu"
    torch.testing.assert_close(u.cpu(), c)
    # views keep sharing storage through a round trip
    buf3 = io.BytesIO()
    base = torch.zeros(6, device=DEV)
    torch.save([base, base[2:4]], buf3)
    b0, b1 = torch.load(io.BytesIO(buf3.getvalue()))
    b1.fill_(7)
    assert b0.cpu().tolist() == [0, 0, 7, 7, 0, 0]


def test_save_load_state_dict():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to(DEV)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    sd = torch.load(io.BytesIO(buf.getvalue()), map_location="tpu")
    assert all(v.device.type == "tpu" for v in sd.values())
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    m2.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), map_location="cpu"))
    m3 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to(DEV)
    m3.load_state_dict(sd)
    x = torch.randn(5, 4)
    torch.testing.assert_close(m3(x.to(DEV)).cpu(), m2(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- autocast
def test_autocast_lower_precision_ops():
    a = torch.randn(8, 16, device=DEV)
    w = torch.randn(4, 16, device=DEV)
    b = torch.randn(4, device=DEV)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.mm(a, w.t()).dtype == torch.bfloat16
        assert torch.nn.functional.linear(a, w, b).dtype == torch.bfloat16
        assert torch.addmm(b, a, w.t()).dtype == torch.bfloat16
        assert torch.matmul(a, w.t()).dtype == torch.bfloat16
        assert (a @ w.t()).dtype == torch.bfloat16
        assert torch.bmm(a[None], w.t()[None]).dtype == torch.bfloat16
        assert torch.baddbmm(b[None, None], a[None], w.t()[None]).dtype == torch.bfloat16
        # fp32 policy ops run in float32 even for bfloat16 inputs
        assert torch.softmax(a.bfloat16(), -1).dtype == torch.float32
        assert torch.log_softmax(a.bfloat16(), -1).dtype == torch.float32
        assert torch.nn.functional.layer_norm(a.bfloat16(), (16,)).dtype == torch.float32
        assert torch.exp(a.bfloat16()).dtype == torch.float32
        # ops without a policy keep their input dtype
        assert (a + 1).dtype == torch.float32
        ref = torch.mm(a.bfloat16(), w.t().bfloat16())
    torch.testing.assert_close(torch.mm(a, w.t()).to(torch.bfloat16).float().cpu(), ref.float().cpu(),
                               rtol=2e-2, atol=2e-2)
    # outside the region: float32 again
    assert torch.mm(a, w.t()).dtype == torch.float32
    with torch.autocast("tpu", dtype=torch.bfloat16, enabled=False):
        assert torch.mm(a, w.t()).dtype == torch.float32
    with torch.autocast("tpu", dtype=torch.float16):
        assert torch.mm(a, w.t()).dtype == torch.float16
    with torch.autocast("tpu"):
        assert torch.mm(a, w.t()).dtype == torch.bfloat16  # tpu default is bfloat16
    with torch.tpu.amp.autocast():
        assert torch.mm(a, w.t()).dtype == torch.bfloat16


def test_autocast_backward():
    w = torch.randn(4, 16, device=DEV, requires_grad=True)
    a = torch.randn(8, 16, device=DEV)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(a, w)
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and w.grad.shape == w.shape


def test_autocast_bce_banned():
    p = torch.rand(4, device=DEV)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(p, p)


# ---------------------------------------------------------------- metrics
def test_metrics_counts():
    torchtpu.reset_metrics()
    m = torchtpu.metrics()
    for k in ("native_ops", "cpu_fallbacks", "compiles", "cache_hits", "cache_misses",
              "bytes_host_to_device", "bytes_device_to_host", "live_buffers", "live_buffer_bytes",
              "executions", "native_executions", "mode", "compile_seconds", "executable_cache_entries"):
        assert k in m, k
    assert m["native_ops"] == {} and m["cpu_fallbacks"] == {} and m["compiles"] == 0
    x = torch.randn(37, 3).to(DEV)
    m = torchtpu.metrics()
    assert m["bytes_host_to_device"] >= 37 * 3 * 4
    deferred = torchtpu.get_mode() == "defer_and_fuse"
    for _ in range(3):
        y = x * 2.5 + x
        if deferred:
            torch.tpu.synchronize()  # one program per iteration
    m = torchtpu.metrics()
    assert m["native_ops"].get("aten::mul.Tensor", 0) == 3
    assert m["native_ops"].get("aten::add.Tensor", 0) == 3
    assert m["cache_hits"] >= (1 if deferred else 4)  # the same programs ran again
    assert m["executions"] >= (3 if deferred else 6)
    assert m["live_buffers"] >= 2 and m["live_buffer_bytes"] >= 2 * 37 * 3 * 4
    d2h = m["bytes_device_to_host"]
    y.cpu()
    assert torchtpu.metrics()["bytes_device_to_host"] - d2h == 37 * 3 * 4
    # a fresh program compiles once
    c0 = torchtpu.metrics()["compiles"] + torchtpu.metrics()["disk_cache_hits"]
    z = torch.randn(7, 13, 5).to(DEV)
    torch.tpu.synchronize()
    z.clamp(-0.123, 0.5).cpu()
    assert torchtpu.metrics()["compiles"] + torchtpu.metrics()["disk_cache_hits"] > c0
    # an op without a lowering is counted as a CPU fallback
    if "aten::cumsum" not in torchtpu.lowered_ops():
        torch.cumsum(x, 0)
        fb = torchtpu.metrics()["cpu_fallbacks"]
        assert any(k.startswith("aten::cumsum") for k in fb), fb
    assert "native ops" in torchtpu.metrics_report()


def test_modes():
    initial = torchtpu.get_mode()  # strict unless TORCHTPU_MODE says otherwise
    with torchtpu.mode("debug"):
        assert torchtpu.get_mode() == "debug"
        assert (torch.ones(3, device=DEV) + 1).cpu().tolist() == [2, 2, 2]
    with torchtpu.mode("defer_and_fuse"):
        a = torch.ones(3, device=DEV)
        b = a * 3 + 1
        assert b.cpu().tolist() == [4, 4, 4]
    assert torchtpu.get_mode() == initial
    with pytest.raises(ValueError):
        torchtpu.set_mode("nope")


# ---------------------------------------------------------------- hooks
def test_backward_uses_primary_context():
    a = torch.randn(3, 4, device=DEV, requires_grad=True)
    (a * a).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), 2 * a.detach().cpu())


def test_pin_memory():
    x = torch.empty(16, pin_memory=True)
    assert x.is_pinned()
    y = torch.randn(8).pin_memory()
    assert y.is_pinned() and y[2:].is_pinned()
    assert not torch.randn(8).is_pinned()
    assert not torch.ones(2, device=DEV).is_pinned()
    with pytest.raises(RuntimeError, match="pinned"):
        torch.empty(2, device=DEV, pin_memory=True)
    with pytest.raises(RuntimeError, match="pinned|pin"):
        torch.ones(2, device=DEV).pin_memory()
    t = y.to(DEV, non_blocking=True)
    torch.testing.assert_close(t.cpu(), y)


def test_untyped_storage_on_device():
    s = torch.UntypedStorage(32, device=DEV)
    assert s.device.type == "tpu" and s.nbytes() == 32
    s.resize_(64)
    assert s.nbytes() == 64
    cs = torch.UntypedStorage(8).tpu()
    assert cs.device.type == "tpu"


# ---------------------------------------------------------------- the CUDA plugin without a GPU
def _cuda_plugin_installed() -> bool:
    from torchtpu import _plugin

    try:
        _plugin.resolve("cuda")
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _cuda_plugin_installed(), reason="no CUDA PJRT plugin package installed")
def test_cuda_plugin_without_a_gpu_raises_a_clear_error(pyrun):
    # The plugin fails to load (no CUDA libraries or driver) or finds no device: each
    # attempt raises a RuntimeError saying what the plugin needs; the process lives on.
    code = """
import torch, torchtpu
for _ in range(2):
    try:
        x = torch.ones(4, device="tpu")
        print("STARTED", torch.tpu.get_device_name(), float(x.sum()))
        break
    except RuntimeError as e:
        print("ERROR", e)
print("ALIVE")
"""
    r = pyrun(code, env={"TORCHTPU_PLUGIN": "cuda"}, timeout=300)
    assert r.returncode == 0 and "ALIVE" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    if "STARTED" in r.stdout:
        assert "4.0" in r.stdout  # a machine with a usable GPU
        return
    errors = [l for l in r.stdout.splitlines() if l.startswith("ERROR")]
    assert len(errors) == 2, r.stdout
    for e in errors:
        assert "TORCHTPU_PLUGIN=cuda could not start the CUDA PJRT plugin" in e, e
        assert "NVIDIA GPU" in e and "TORCHTPU_PLUGIN=cpu" in e, e


def test_xla_threads_sizes_the_cpu_client_pool_and_pins_nothing(pyrun):
    """TORCHTPU_XLA_THREADS=N: the XLA CPU client's Eigen pool has N threads; the
    process and the pool keep every CPU they may run on."""
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    code = ("import os, torch, torchtpu\n"
            "x = torch.randn(256, 256, device='tpu'); (x @ x).sum().item()\n"
            "cpus = os.sched_getaffinity(0)\n"
            "pool = [t for t in os.listdir('/proc/self/task')\n"
            "        if open(f'/proc/self/task/{t}/comm').read().startswith('tf_XLAEigen')]\n"
            "assert all(os.sched_getaffinity(int(t)) == cpus for t in pool)\n"
            "print(len(pool), len(cpus))")
    one = pyrun(code, env={"TORCHTPU_XLA_THREADS": "1"})
    assert one.returncode == 0, one.stderr
    dflt = pyrun(code, env={"TORCHTPU_XLA_THREADS": None})
    assert dflt.returncode == 0, dflt.stderr
    n1, cpus = map(int, one.stdout.split()[-2:])
    nd, _ = map(int, dflt.stdout.split()[-2:])
    assert n1 == 1 and nd == cpus, (one.stdout, dflt.stdout)

# ---------------------------------------------------------------- what torchtitan reads (issue 28)
def test_memory_stats_has_cuda_keys():
    """torchtitan's DeviceMemoryMonitor reads CUDA's key names (-1 when absent)."""
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    x = torch.empty(1 << 16, device=DEV)  # 256 KiB
    st = torch.tpu.memory_stats()
    for k in ("active_bytes.all.peak", "active_bytes.all.current", "allocated_bytes.all.current",
              "allocated_bytes.all.peak", "reserved_bytes.all.current", "reserved_bytes.all.peak",
              "num_alloc_retries", "num_ooms", "allocation.all.current", "active.all.current"):
        assert isinstance(st[k], int) and st[k] >= 0, k
    assert st["active_bytes.all.peak"] >= st["active_bytes.all.current"] >= 1 << 18
    assert st["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert st["reserved_bytes.all.peak"] == torch.tpu.max_memory_reserved()
    assert st["num_alloc_retries"] == 0
    assert list(st) == sorted(st)
    if torch.cuda.is_available():  # same key set as CUDA where one can compare
        assert set(torch.cuda.memory_stats()) <= set(st) | {"requested_bytes.all.allocated"}
    del x
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.memory_stats()["active_bytes.all.peak"] == torch.tpu.memory_allocated()


def test_current_device_is_an_int_and_names():
    # torchtitan: barrier(device_ids=[device_module.current_device()])
    assert type(torch.tpu.current_device()) is int
    p = torch.tpu.get_device_properties(torch.device("tpu:0"))
    assert p.total_memory > 0 and p.name == torch.tpu.get_device_name(torch.device("tpu:0"))
    from torchtpu.device_module import _device_name
    info = {"platform_name": "tpu", "device_kind": "TPU v5 lite"}
    assert _device_name(info) == "TPU v5e"  # torchtitan's TPU peak-FLOPs table keys
    assert _device_name({"platform_name": "tpu", "device_kind": "TPU v4"}) == "TPU v4"
    assert _device_name({"platform_name": "cpu", "device_kind": "cpu"}) == "cpu:cpu"


def test_rng_state_is_philox_seed_offset_for_dtensor():
    """DTensor's OffsetBasedRNGTracker reads the state as (seed u64, offset u64) bytes."""
    from torch.distributed.tensor._random import _PhiloxState
    torch.tpu.manual_seed(1234)
    st = _PhiloxState(torch.tpu.get_rng_state())
    assert st.state.dtype == torch.uint8 and st.state.numel() == 16
    assert int(st.seed) == 1234 and int(st.offset) == 0
    a = torch.rand(8, device=DEV)
    assert int(_PhiloxState(torch.tpu.get_rng_state()).offset) > 0
    st.offset = torch.tensor([0], dtype=torch.int64)
    torch.tpu.set_rng_state(st.state)
    assert torch.equal(torch.rand(8, device=DEV).cpu(), a.cpu())


def test_stream_context_is_reusable_like_cuda():
    """torch.cuda.StreamContext is a class: libraries (SGLang's scheduler) build one
    context and enter it many times, also nested; None is a no-op."""
    s = torch.tpu.Stream()
    ctx = torch.tpu.stream(s)
    assert isinstance(ctx, torch.tpu.StreamContext)
    default = torch.tpu.current_stream()
    for _ in range(3):
        with ctx as entered:
            assert entered == s and torch.tpu.current_stream() == s
            with ctx:
                assert torch.tpu.current_stream() == s
            assert torch.tpu.current_stream() == s
        assert torch.tpu.current_stream() == default
    with torch.tpu.StreamContext(None) as none:
        assert none is None and torch.tpu.current_stream() == default
    assert torch.tpu.is_current_stream_capturing() is False


def test_per_process_memory_fraction_caps_allocations():
    from torchtpu import _C

    old = _C._memory_stats()["process_cap_bytes"]
    total = torch.tpu.mem_get_info()[1]
    try:
        torch.tpu.set_per_process_memory_fraction(0.5)
        assert abs(torch.tpu.get_per_process_memory_fraction() - 0.5) < 1e-6
        x = torch.ones(1024, device="tpu")  # small allocations still work
        with pytest.raises(torch.tpu.OutOfMemoryError):
            torch.empty(int(total * 0.6) // 4, dtype=torch.float32, device="tpu")
        assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError
        with pytest.raises(ValueError, match="fraction"):
            torch.tpu.set_per_process_memory_fraction(1.5)
        assert x.sum().item() == 1024
        assert torch.tpu.mem_get_info()[1] == total  # the device's size stays, as on CUDA
        torch.tpu.set_per_process_memory_fraction(1.0)
        assert torch.tpu.get_per_process_memory_fraction() == 1.0
    finally:
        _C._set_process_memory_cap(old)


def test_cuda_module_api_names_libraries_call():
    """The torch.cuda module-level names vLLM, SGLang, accelerate and torchtitan call
    (docs/design.md lists them), with CUDA's meanings where tpu has one."""
    x = torch.ones(256, device="tpu")
    assert torch.tpu.memory_usage() >= x.numel() * 4
    assert torch.tpu.device_memory_used() >= 0
    assert torch.tpu.memory_cached() == torch.tpu.memory_reserved()
    assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
    torch.tpu.reset_max_memory_cached()
    nested = torch.tpu.memory_stats_as_nested_dict()
    flat = torch.tpu.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"]
    torch.tpu.ipc_collect()
    assert torch.tpu.can_device_access_peer(0, 0) is False
    assert torch.tpu.get_arch_list() == [] and torch.tpu.is_tf32_supported() is False
    with pytest.raises(RuntimeError, match="debug_mode"):
        torch.tpu.set_sync_debug_mode("loud")


def test_sync_debug_mode_warns_and_raises_on_host_reads():
    x = torch.ones(4, device="tpu") * 2  # no host read: fine in every mode
    try:
        torch.tpu.set_sync_debug_mode("warn")
        assert torch.tpu.get_sync_debug_mode() == 1
        y = x + 1
        with pytest.warns(UserWarning, match="synchronizing tpu operation"):
            assert y.sum().item() == 12
        torch.tpu.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="synchronizing tpu operation"):
            x.cpu()
    finally:
        torch.tpu.set_sync_debug_mode("default")
    assert torch.tpu.get_sync_debug_mode() == 0 and x.cpu().tolist() == [2.0] * 4


def test_accelerator_device_capability_lists_the_dtypes_that_work():
    """torch.accelerator.get_device_capability(): each dtype it lists allocates
    on tpu and converts to and from float32 and the CPU; the ones it leaves out
    are refused with an error naming the dtype."""
    if not hasattr(torch.accelerator, "get_device_capability"):
        pytest.skip("torch.accelerator.get_device_capability is newer than this torch")
    listed = torch.accelerator.get_device_capability("tpu")["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
            torch.float8_e4m3fn} <= set(listed)
    for dt in listed:
        x = torch.ones(4, device="tpu").to(dt)
        assert x.dtype == dt
        back = x.cpu()
        assert back.dtype == dt
        assert torch.equal((back.real if back.is_complex() else back).to(torch.float32), torch.ones(4))
    assert torch.complex32 not in listed and torch.quint8 not in listed
    with pytest.raises(TypeError, match="ComplexHalf"):
        torch.zeros(2, dtype=torch.complex32, device="tpu")
