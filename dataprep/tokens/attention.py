"""Attention within segments: takes a packed batch's `document_ids` and `position_ids`, gives what each
attention kernel needs to keep a token's attention inside its own segment: a boolean mask for
`scaled_dot_product_attention` (`document_mask`), FlexAttention's `BlockMask` (`flex_block_mask`), and
`cu_seqlens` / `max_seqlen` for FlashAttention's varlen kernels (`cu_seqlens`).

A segment is a run of one document's tokens in a row. One starts where `position_ids` is 0, where the
document id changes (to or from padding, id -1, too) and at every row's first token. Two pieces of one cut
document in a row are two segments, kept apart by their position 0: the later piece's first token repeats
the earlier one's last, and attending across would show a piece the text it continues. A run of padding is
a segment like any other, so each padding query has at least itself to attend to (a query with nothing
to attend to gives NaN in `scaled_dot_product_attention`); its outputs have no target.
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..errors import DataprepError, UsageError


def segment_ids(batch: Mapping) -> torch.Tensor:
    """Each token's segment, numbered from 0 over the whole batch (row by row), so that equal numbers mean
    the same segment of the same row.

    Args:
        batch: A mapping with `document_ids` and `position_ids`, (B, L) tensors or arrays of integers.

    Returns:
        (B, L) int64 on the batch's device.
    """
    try:
        doc, pos = torch.as_tensor(batch["document_ids"]), torch.as_tensor(batch["position_ids"])
    except KeyError as e:
        raise UsageError(f"batch has no {e.args[0]!r}: a packed batch carries document_ids and position_ids") from None
    if doc.ndim != 2 or doc.shape != pos.shape:
        raise UsageError(f"batch's document_ids {tuple(doc.shape)} and position_ids {tuple(pos.shape)} must be one "
                         "(batch, length) shape")
    start = pos == 0
    start[:, 1:] |= doc[:, 1:] != doc[:, :-1]
    start[:, 0] = True
    return start.reshape(-1).cumsum(0).reshape(start.shape) - 1


def document_mask(batch: Mapping) -> torch.Tensor:
    """The mask `scaled_dot_product_attention` takes for a packed batch: query i attends key j where both
    are in one segment and j <= i (causal within each document's piece, nothing across).

    It holds B x L x L booleans (128 MiB at batch 8 and 4096 tokens); FlexAttention's block mask
    (`flex_block_mask`) or FlashAttention's `cu_seqlens` skip the masked blocks instead.

    Args:
        batch: A mapping with `document_ids` ((B, L), -1 on padding) and `position_ids` ((B, L), 0 at each
            segment's first token), tensors or arrays.

    Returns:
        (B, 1, L, L) bool on the batch's device: True where attention is allowed; every query allows at
        least itself, padding included, so no row of the softmax is empty.
    """
    seg = segment_ids(batch)
    length = seg.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril_()
    return ((seg[:, :, None] == seg[:, None, :]) & causal).unsqueeze(1)


def flex_block_mask(batch: Mapping, block_size: int = 128):
    """FlexAttention's `BlockMask` for the same rule as `document_mask` (one segment, causal), for
    `torch.nn.attention.flex_attention.flex_attention(q, k, v, block_mask=...)`.

    Args:
        batch: A mapping with `document_ids` and `position_ids`, as `document_mask` takes.
        block_size: FlexAttention's block of queries and keys (128 is its default).

    Returns:
        A `torch.nn.attention.flex_attention.BlockMask` of shape (B, 1, L, L) on the batch's device.
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError:
        raise DataprepError(f"flex_block_mask needs FlexAttention (torch.nn.attention.flex_attention, torch 2.5 or "
                            f"later); this is torch {torch.__version__}: use document_mask with "
                            "scaled_dot_product_attention, or cu_seqlens with FlashAttention") from None
    seg = segment_ids(batch)
    rows, length = seg.shape

    def same_segment(b, h, q, kv):
        return (seg[b, q] == seg[b, kv]) & (kv <= q)

    return create_block_mask(same_segment, rows, None, length, length, device=seg.device, BLOCK_SIZE=block_size)


def cu_seqlens(batch: Mapping) -> tuple[torch.Tensor, int]:
    """The segments of the flattened batch as FlashAttention's varlen kernels take them
    (`flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)`,
    q, k, v of shape (B * L, heads, dim)).

    Args:
        batch: A mapping with `document_ids` and `position_ids`, as `document_mask` takes.

    Returns:
        `cu_seqlens`: int32 offsets of every segment's first token in the flattened batch, then B * L (row
        ends and padding runs are boundaries too), on the batch's device; and `max_seqlen`, the longest
        segment's tokens.
    """
    seg = segment_ids(batch).reshape(-1)
    start = torch.ones_like(seg, dtype=torch.bool)
    start[1:] = seg[1:] != seg[:-1]
    bounds = torch.cat([start.nonzero().reshape(-1), torch.tensor([seg.numel()], device=seg.device)])
    return bounds.to(torch.int32), int((bounds[1:] - bounds[:-1]).max()) if seg.numel() else 0
