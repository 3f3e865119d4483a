"""Normalize and to_device, on the CPU (the same code runs on CUDA)."""
import pytest
import torch

from dataprep.serve.transfer import IMAGENET_MEAN, IMAGENET_STD, Normalize, to_device


def test_normalize_matches_the_formula():
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    y = Normalize()(x)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.allclose(y, (x.float() - mean) / std, atol=1e-5)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]
# (input dtype, top value, mean and std in the input's units)
NORM_CASES = {"uint8": (torch.uint8, 255, IMAGENET_MEAN, IMAGENET_STD),
              "uint16": (torch.uint16, 65535, (32767.5, 1000.0, 65535.0), (32767.5, 12000.0, 0.5))}


def _wrong_mean(mean: tuple, top: int, how: str) -> tuple:
    """The mean a wrong implementation would use: one input unit off, or 8-bit units for a 16-bit batch."""
    return tuple(m + 1 for m in mean) if how == "one_unit_off" else tuple(m * 255 / top for m in mean)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, impl", [("uint8", "right"), ("uint16", "right"), ("uint8", "one_unit_off"),
                                        ("uint16", "one_unit_off"), ("uint16", "8_bit_units")])
def test_normalize_gives_the_exact_values(device, case, impl):
    # impl other than "right": negative controls, Normalize given the wrong mean must fail the same check
    dtype, top, mean, std = NORM_CASES[case]
    # every value 0..top appears at the batch's corners and in between (0 and top exactly)
    x = torch.randint(0, top + 1, (2, 3, 9, 11), dtype=torch.int64, generator=torch.Generator().manual_seed(4))
    x[0, :, 0, 0], x[0, :, 0, 1] = 0, top
    x = x.to(dtype)
    used = mean if impl == "right" else _wrong_mean(mean, top, impl)
    y = Normalize(mean=used, std=std, device=device)(x.to(device)).cpu()
    want = (x.to(torch.float64) - torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)
    assert y.dtype == torch.float32 and y.shape == x.shape
    # float32 with scale and shift rounded: a few ulps of values up to ~131000 (uint16, std 0.5)
    close = torch.allclose(y.double(), want, rtol=1e-6, atol=1e-6)
    assert close if impl == "right" else not close, float((y.double() - want).abs().max())


def test_normalize_options():
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    y = Normalize(channels_last=True)(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    h = Normalize(dtype=torch.bfloat16)(x)
    assert h.dtype == torch.bfloat16 and torch.allclose(h.float(), Normalize()(x), atol=0.05)
    g = Normalize(mean=(127.5,), std=(127.5,))(torch.full((3, 1, 4, 4), 255, dtype=torch.uint8))
    assert torch.allclose(g, torch.ones_like(g))
    single = Normalize()(x[0])
    assert single.shape == (3, 16, 16)


def test_normalize_refuses_wrong_input():
    with pytest.raises(TypeError, match="uint8"):
        Normalize()(torch.zeros(1, 3, 2, 2))
    with pytest.raises(ValueError, match="1 channels"):
        Normalize()(torch.zeros(1, 1, 2, 2, dtype=torch.uint8))


def test_to_device_walks_the_batch():
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    labels = torch.tensor([1, 2])
    out = to_device({"x": (images, labels), "n": 3}, "cpu")
    assert out["x"][0] is images and out["x"][1] is labels and out["n"] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_device_cuda_pinned_non_blocking():
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    out = to_device(images, "cuda")
    assert out.is_cuda and torch.equal(out.cpu(), images)
    y = Normalize(device="cuda")(out)
    assert y.is_cuda
