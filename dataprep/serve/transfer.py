"""Host to device: takes uint8 batches from the loader, gives normalised float tensors on the device.

Keeping batches uint8 until the GPU moves 4x fewer bytes through the loader, shared memory and PCIe,
and spends no CPU on float conversion; `Normalize` does the conversion where it is cheap.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

IMAGENET_MEAN = (123.675, 116.28, 103.53)  # 0-255 units: 255 x (0.485, 0.456, 0.406)
IMAGENET_STD = (58.395, 57.12, 57.375)  # 255 x (0.229, 0.224, 0.225)


class Normalize(torch.nn.Module):
    """(x - mean) / std on the device, from a uint8 (or, for 16-bit packs, uint16) (N, C, H, W) or (C, H, W) batch.

    Args:
        mean, std: per channel, in the input's units (0-255 for uint8, 0-65535 for uint16; one value
            each for grayscale packs).
        device: where to compute [default: where the module's buffers are; move it with `.to(device)`].
        dtype: output dtype (torch.float32, torch.float16, torch.bfloat16).
        channels_last: return channels-last memory (what convolutions on recent GPUs prefer).
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32, channels_last: bool = False):
        super().__init__()
        if len(mean) != len(std) or any(s == 0 for s in std):
            raise ValueError("mean and std need one value per channel, and std must not be 0")
        std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        # x * scale + shift == (x - mean) / std, one fused multiply-add per element
        self.register_buffer("scale", (1.0 / std_t).to(dtype), persistent=False)
        self.register_buffer("shift", (-mean_t / std_t).to(dtype), persistent=False)
        self.dtype = dtype
        self.channels_last = channels_last
        if device is not None:
            self.to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise a batch (or one image) on the module's device.

        Args:
            x: uint8 or uint16, (N, C, H, W) or (C, H, W).

        Returns:
            (x - mean) / std as `dtype`, of the same shape.
        """
        if x.dtype not in (torch.uint8, torch.uint16):
            raise TypeError(f"Normalize takes uint8 or uint16 batches, got {x.dtype}")
        batched = x.ndim == 4
        if not batched:
            x = x.unsqueeze(0)
        if x.shape[1] != self.scale.shape[1]:
            raise ValueError(f"batch has {x.shape[1]} channels, mean/std have {self.scale.shape[1]}")
        x = x.to(self.scale.device, non_blocking=True).to(self.dtype)
        x = torch.addcmul(self.shift, x, self.scale)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x if batched else x[0]


def to_device(batch: Any, device: torch.device | str, pin: bool = True) -> Any:
    """Copy a batch (tensors in tuples, lists or dicts) to `device`.

    For CUDA the copy goes through pinned memory with non_blocking=True, so it overlaps with compute.

    Args:
        batch: A tensor, or tuples, lists and dicts of them.
        device: The device to copy to.
        pin: Pin CPU tensors first (for CUDA).

    Returns:
        The batch, of the same structure, on `device`; on the CPU the batch unchanged.
    """
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        if device.type == "cpu":
            return batch if batch.device.type == "cpu" else batch.cpu()
        if pin and batch.device.type == "cpu" and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, pin) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, pin) for k, v in batch.items()}
    return batch
