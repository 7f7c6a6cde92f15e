"""The issue's snippet, end to end, and the introspection API."""
import pytest
import torch

import torchtpu


def test_snippet_matches_cpu():
    x = torch.randn(4, 8, device="tpu")
    assert x.device.type == "tpu" and x.is_tpu
    y = (x @ x.T).relu_()
    xc = x.cpu()
    torch.testing.assert_close(y.cpu(), (xc @ xc.T).relu_())
    assert torch.tpu.device_count() == 1
    assert torch.tpu.memory_allocated() >= 2 * 4 * 8 * 4 - 4 * 8 * 4


def test_metrics_counts(metrics):
    a = torch.ones(1000, device="tpu")
    b = a + a
    assert b.cpu().sum().item() == 2000
    m = metrics()
    assert m["native_ops"].get("aten::add.Tensor", 0) >= 1
    assert m["bytes_device_to_host"] >= 0
    for key in ("compiles", "compile_seconds", "cache_hits", "cache_misses", "bytes_host_to_device",
                "bytes_device_to_host", "live_buffers", "live_buffer_bytes", "cpu_fallbacks"):
        assert key in m
    text = torchtpu.metrics_report()
    assert "native ops" in text


def test_same_program_is_cached(metrics):
    a = torch.randn(33, device="tpu")
    torch.tpu.synchronize()  # defer_and_fuse: randn is its own program
    (a * 2).cpu()
    before = metrics()["compiles"]
    for _ in range(3):
        (a * 2).cpu()
    assert metrics()["compiles"] == before
    assert metrics()["cache_hits"] >= 3


def test_scalar_change_does_not_recompile(metrics):
    a = torch.randn(17, device="tpu")
    torch.tpu.synchronize()
    (a * 0.5).cpu()
    before = metrics()["compiles"]
    for lr in (0.1, 0.01, 1e-3, 3.5):
        torch.testing.assert_close((a * lr).cpu(), a.cpu() * lr)
    assert metrics()["compiles"] == before


def test_cpu_index_tensors_move_to_the_device_as_on_cuda():
    c = torch.arange(12.0).reshape(3, 4)
    t = c.to("tpu")
    i, j = torch.tensor([0, 2]), torch.tensor([1, 3])
    assert torch.equal(t[i].cpu(), c[i])
    assert torch.equal(t[i, j].cpu(), c[i, j])
    assert torch.equal(t[:, j].cpu(), c[:, j])
    m = torch.tensor([True, False, True])
    assert torch.equal(t[m].cpu(), c[m])
    t[i, j] = 7.0
    c[i, j] = 7.0
    t[m] += 1
    c[m] += 1
    assert torch.equal(t.cpu(), c)


def test_cpu_tensor_among_tpu_tensors_names_the_devices():
    with pytest.raises(RuntimeError, match=r"found at least two devices, tpu:0 and cpu.*argument other in method aten::add"):
        torch.ones(3, device="tpu") + torch.ones(3)
    # a CPU 0-d tensor is a number, as on CUDA
    assert torch.equal((torch.ones(3, device="tpu") + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))
