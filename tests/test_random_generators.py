"""In-place random fills with an explicit tpu generator (vLLM's sampler calls
exponential_(generator=g)), their CPU argument checks, and the PrivateUse1
host allocator (torch.accelerator.empty_host_cache)."""
import math

import pytest
import torch

import torchtpu  # noqa: F401

N = 20000
FILLS = {  # name: (fill, expected mean or None)
    "exponential_": (lambda x, g: x.exponential_(2.0, generator=g), 0.5),
    "log_normal_": (lambda x, g: x.log_normal_(0.0, 0.5, generator=g), math.exp(0.125)),
    "cauchy_": (lambda x, g: x.cauchy_(generator=g), None),
    "geometric_": (lambda x, g: x.geometric_(0.25, generator=g), 4.0),
    "uniform_": (lambda x, g: x.uniform_(generator=g), 0.5),
    "normal_": (lambda x, g: x.normal_(generator=g), 0.0),
}


@pytest.mark.parametrize("name", list(FILLS))
def test_fill_with_generator_is_seeded_and_distributed(name):
    fill, mean = FILLS[name]

    def draw(seed):
        g = torch.Generator(device="tpu")
        g.manual_seed(seed)
        return fill(torch.empty(N, device="tpu"), g).cpu()

    a, b, c = draw(1), draw(1), draw(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.isfinite(a).all()
    if name == "geometric_":
        assert (a >= 1).all() and torch.equal(a, a.round())
    if name == "cauchy_":
        assert abs(a.median().item()) < 0.1  # no mean; the median is 0
    elif mean is not None:
        assert abs(a.mean().item() - mean) < 0.05 * max(1.0, abs(mean)), a.mean()


@pytest.mark.parametrize("fn,msg", [
    (lambda x: x.exponential_(-1.0), "exponential_ expects lambda > 0.0"),
    (lambda x: x.log_normal_(1.0, -2.0), "log_normal_ expects std > 0.0"),
    (lambda x: x.geometric_(1.5), r"geometric_ expects p to be in \(0, 1\)"),
])
def test_bad_arguments_raise_cpus_error(fn, msg):
    with pytest.raises(RuntimeError, match=msg):
        fn(torch.empty(4))
    with pytest.raises(RuntimeError, match=msg):
        fn(torch.empty(4, device="tpu"))


def test_empty_host_cache_and_pinned_memory(pyrun):
    r = pyrun("import torch, torchtpu\n"
              "x = torch.randn(8).pin_memory()\n"
              "assert x.is_pinned()\n"
              "torch.accelerator.empty_host_cache()\n"
              "print('ok')\n")
    assert r.returncode == 0, r.stderr
