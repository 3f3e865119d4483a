"""Train a tiny GPT on a token pack, with random context windows or packed rows served by dataprep.Loader.

    python examples/prepare.py text runs/demo-text --out packs/demo-text      # a small token pack, once
    python examples/train_gpt.py packs/demo-text
    python examples/train_gpt.py packs/bpe --context 256 --batch-size 32 --steps 2000 --workers 4
    python examples/train_gpt.py PACK --checkpoint gpt.pt --checkpoint-every 200
    python examples/train_gpt.py PACK --checkpoint gpt.pt --checkpoint-every 200 --resume    # after a stop
    python examples/train_gpt.py packs/demo-text --packed            # whole documents, attention within each

What it shows:
- `TokenDataset(mode="random")` draws each window's start from (seed, epoch, index): no index file, no
  shuffle buffer, and the same windows however many workers fill the batches;
- a checkpoint holds the model, the optimizer, the step and `loader.state_dict()`, so `--resume`
  continues mid-epoch with exactly the windows the uninterrupted run would have trained on;
- `--packed [best_fit|first_fit|concat]` trains on `PackedDocuments` rows instead: whole documents placed in
  rows of --context tokens, each token attending only to its own document (`document_mask` in
  `scaled_dot_product_attention`), its position counted from its document's first token, and no loss on a
  label of -100 (a document's last token in a row, padding). Resumed the same way.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from dataprep import Loader, PackedDocuments, TokenDataset, document_mask, is_pack, to_device

PACKINGS = ("best_fit", "first_fit", "concat")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pack", help="a token pack (examples/prepare.py text, dataprep tokenize ...)")
    p.add_argument("--context", type=int, default=64, help="tokens per window (or packed row)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples", type=int, default=None, help="windows an epoch [default: as many as fit without overlap]")
    p.add_argument("--packed", nargs="?", const="best_fit", choices=PACKINGS, metavar="PACKING",
                   help="train on rows of whole documents, packed by best_fit (the default), first_fit or concat")
    p.add_argument("--workers", type=int, default=2, help="Loader worker processes (0: the main process fills batches)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps in all")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate after the warm-up (AdamW)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and the windows drawn")
    p.add_argument("--checkpoint", metavar="FILE", help="save model, optimizer, step and loader position here")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="also save every N steps (and always at the end)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint (if it exists) exactly where it stopped")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1, ...")
    p.add_argument("--log-every", type=int, default=50, help="print loss and tokens/s every N steps")
    p.add_argument("--log-batches", metavar="FILE", help="write one digest per step of the batch trained on (to compare runs)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint FILE")
    if args.packed and args.samples is not None:
        p.error("--samples counts windows; packed rows are as many as the plan makes of the documents")
    return args


# -- the model -------------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP, each added to the residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ln2, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # each position sees itself and the past: of the whole window, or (a mask) of its own document only
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, a few blocks, a final norm, and logits over the vocabulary (the
    output layer shares its weights with the token embedding)."""

    def __init__(self, vocab: int, context: int, dim: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():  # small initial weights (GPT-2's 0.02): the first logits are near uniform
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) of ids (B, T); `positions` (B, T) index the position embedding [default:
        0 to T - 1], `mask` (B, 1, T, T) says which keys each query attends to [default: causal]."""
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(self.ln(h))

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, n: int, context: int) -> torch.Tensor:
        """Greedy continuation of `ids` (1, T) by n tokens."""
        for _ in range(n):
            nxt = self(ids[:, -context:])[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
        return ids


# -- training --------------------------------------------------------------------------------------
def learning_rate(step: int, peak: float, warmup: int = 20) -> float:
    """A linear warm-up, then constant. A function of the step alone, so a resumed run needs no scheduler
    state; constant, so `--steps` only says where to stop (a decaying schedule must be planned over a
    fixed horizon, never over --steps, or a run cut short and resumed would train differently)."""
    return peak * min(1.0, (step + 1) / warmup)


def save_checkpoint(path: str, model: nn.Module, opt: torch.optim.Optimizer, step: int, loader: Loader) -> None:
    """Written to a temporary file and renamed into place: a stop while saving keeps the previous one.
    The loader's state is its position in the epoch (a few hundred bytes)."""
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "loader": loader.state_dict()}
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)
    print(f"checkpoint: {path} (step {step})", flush=True)


def resume(path: str, model: nn.Module, opt: torch.optim.Optimizer, loader: Loader) -> int:
    """Restore a checkpoint and return its step; the loader's next iter() serves the rest of its epoch.
    No checkpoint yet is a fresh start: one command line serves the first run and every restart."""
    if not os.path.exists(path):
        print(f"no checkpoint at {path} yet: starting from step 0", flush=True)
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    loader.load_state_dict(state["loader"])
    what = "rows" if isinstance(loader.dataset, PackedDocuments) else "windows"
    print(f"resumed from {path} at step {state['step']} (epoch {loader.epoch}, "
          f"{state['loader']['samples_consumed']} {what} of it trained on)", flush=True)
    return int(state["step"])


class Window:
    """Tokens, loss and the time spent waiting for batches since the last report. Figures are read
    after a device sync, so queued GPU work is counted in the window it belongs to."""

    def __init__(self, device: torch.device):
        self.device = device
        self.restart()

    def restart(self) -> None:
        self.tokens, self.steps, self.wait, self.loss = 0, 0, 0.0, torch.zeros((), device=self.device)
        self.start = time.perf_counter()

    def batches(self, loader: Loader):
        """The loader's batches, epoch after epoch (every iter() is the next one), timing every wait."""
        while True:
            it = iter(loader)
            try:
                while True:
                    t = time.perf_counter()
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                    self.wait += time.perf_counter() - t
                    yield batch
            finally:
                it.close()

    def step(self, tokens: int, loss: torch.Tensor) -> None:
        self.tokens, self.steps = self.tokens + tokens, self.steps + 1
        self.loss += loss.detach()  # summed on the device: no sync per step

    def report(self, step: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self.start
        print(f"step {step}  loss {self.loss.item() / self.steps:.4f}  {self.tokens / wall:,.0f} tokens/s  "
              f"(data path alone {self.tokens / max(self.wait, 1e-9):,.0f} tokens/s; waiting for data "
              f"{100 * self.wait / wall:.1f}% of the step)", flush=True)
        self.restart()


def batch_log(path: str | None, append: bool):
    """The --log-batches file (appended to by a resumed run), or nothing."""
    return open(path, "a" if append else "w") if path else contextlib.nullcontext()


def model_inputs(batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A batch as (ids, targets, the model's other arguments). Windows are (x, y). A packed batch is a dict:
    each token's position in its document, and the mask that keeps attention within documents (made where
    the batch is: move the batch to the device first)."""
    if isinstance(batch, dict):
        return batch["input_ids"], batch["labels"], {"positions": batch["position_ids"], "mask": document_mask(batch)}
    x, y = batch
    return x, y, {}


def batch_digest(batch) -> str:
    """A short digest of everything the step trains on (for --log-batches)."""
    parts = [batch[k] for k in ("input_ids", "labels", "position_ids", "document_ids")] if isinstance(batch, dict) else batch
    return hashlib.sha1(b"".join(t.numpy().tobytes() for t in parts)).hexdigest()[:16]


def train_step(net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, extra: dict, lr: float,
               autocast) -> torch.Tensor:
    for group in opt.param_groups:
        group["lr"] = lr
    with autocast():
        logits = net(x, **extra)
    # every position predicts the next token; a label of -100 (a packed document's last token, padding) counts nothing
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not is_pack(args.pack):
        sys.exit(f"{args.pack}: no pack there; make one first: python examples/prepare.py text DIR --out {args.pack}")
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    if args.packed:  # the plan: which documents share a row, reshuffled every epoch from (seed, epoch)
        ds = PackedDocuments(args.pack, args.context, packing=args.packed, seed=args.seed)
        plan = ds.info()
        print(f"packed rows: {plan['documents']:,} documents in {plan['rows']:,} rows of {args.context} tokens "
              f"({args.packed}; padding {plan['padding_share']:.1%}, {plan['documents_cut']:,} "
              f"document{'s' * (plan['documents_cut'] != 1)} cut)", flush=True)
    else:
        ds = TokenDataset(args.pack, args.context, mode="random", seed=args.seed, samples=args.samples)
    what = "rows" if args.packed else "windows"
    loader = Loader(ds, args.batch_size, shuffle=True, seed=args.seed, num_workers=args.workers, drop_last=True)
    if not len(loader):
        sys.exit(f"{args.pack}: {len(ds)} {what} of {args.context} tokens an epoch, fewer than one batch of {args.batch_size}")
    vocab = ds.vocab_size
    model = GPT(vocab, args.context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    step = resume(args.checkpoint, model, opt, loader) if args.resume else 0
    # bfloat16 autocast and compilation on a GPU; plain float32 on the CPU, where they would not pay off
    amp = cuda and torch.cuda.is_bf16_supported()  # bfloat16 needs no loss scaling (Ampere or newer)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    net = torch.compile(model) if cuda else model  # `model` keeps the weights; checkpoints save it, not the wrapper
    print(f"{len(ds.data.tokens):,} tokens, vocabulary {vocab}, {len(loader)} steps an epoch of "
          f"{args.batch_size} x {args.context}; {sum(p.numel() for p in model.parameters()):,} parameters; "
          f"training on {device} to step {args.steps} (workers: {args.workers})", flush=True)
    window, untimed = Window(device), step + 1  # the first step forks the workers and warms up (or compiles)
    with batch_log(args.log_batches, args.resume) as log:
        for batch in window.batches(loader) if step < args.steps else ():
            if log:
                log.write(f"{step + 1} {batch_digest(batch)}\n")
            x, y, extra = model_inputs(to_device(batch, device))
            loss = train_step(net, opt, x, y, extra, learning_rate(step, args.lr), autocast)
            step += 1
            window.step(x.numel(), loss)
            if step == untimed:
                window.restart()
            if args.checkpoint and args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
                save_checkpoint(args.checkpoint, model, opt, step, loader)
            if window.steps and (step % args.log_every == 0 or step == args.steps):
                window.report(step)
            if step >= args.steps:  # stop before asking for another batch: the loader's position is this step's
                break
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, opt, step, loader)
    loader.close()
    first = ds[0]["input_ids"] if args.packed else ds[0][0]  # a packed row starts with a document's first tokens
    prompt = first[:8].unsqueeze(0).to(device)
    print("sample:", repr(ds.tokenizer.decode(model.generate(prompt, 32, args.context)[0].tolist())), flush=True)


if __name__ == "__main__":
    sys.exit(main())
