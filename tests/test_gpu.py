"""Normalize and to_device, on the CPU (the same code runs on CUDA)."""
import pytest
import torch

from dataprep.serve.gpu import IMAGENET_MEAN, IMAGENET_STD, Normalize, to_device


def test_normalize_matches_the_formula():
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    y = Normalize()(x)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.allclose(y, (x.float() - mean) / std, atol=1e-5)


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
