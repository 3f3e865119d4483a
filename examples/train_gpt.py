"""Train a tiny GPT on a token pack, with random context windows served by dataprep.Loader.

    python examples/prepare.py text runs/demo-text --out packs/demo-text      # a small token pack, once
    python examples/train_gpt.py packs/demo-text
    python examples/train_gpt.py packs/bpe --context 256 --batch-size 32 --steps 2000 --workers 4
    python examples/train_gpt.py PACK --checkpoint gpt.pt --checkpoint-every 200
    python examples/train_gpt.py PACK --checkpoint gpt.pt --checkpoint-every 200 --resume    # after a stop

What it shows:
- `TokenDataset(mode="random")` draws each window's start from (seed, epoch, index): no index file, no
  shuffle buffer, and the same windows however many workers fill the batches;
- a checkpoint holds the model, the optimizer, the step and `loader.state_dict()`, so `--resume`
  continues mid-epoch with exactly the windows the uninterrupted run would have trained on.
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

from dataprep import Loader, TokenDataset, is_pack, to_device


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pack", help="a token pack (examples/prepare.py text, dataprep tokenize ...)")
    p.add_argument("--context", type=int, default=64, help="tokens per window")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples", type=int, default=None, help="windows an epoch [default: as many as fit without overlap]")
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
    return args


# -- the model -------------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP, each added to the residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ln2, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # each position sees itself and the past
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, a few blocks, a final norm, and logits over the vocabulary (the
    output layer shares its weights with the token embedding)."""

    def __init__(self, vocab: int, context: int, dim: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():  # small initial weights (GPT-2's 0.02): the first logits are near uniform
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.ln(self.blocks(h)))

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
    print(f"resumed from {path} at step {state['step']} (epoch {loader.epoch}, "
          f"{state['loader']['samples_consumed']} windows of it trained on)", flush=True)
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


def train_step(net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, lr: float, autocast) -> torch.Tensor:
    for group in opt.param_groups:
        group["lr"] = lr
    with autocast():
        logits = net(x)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())  # every position predicts the next token
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
    ds = TokenDataset(args.pack, args.context, mode="random", seed=args.seed, samples=args.samples)
    loader = Loader(ds, args.batch_size, shuffle=True, seed=args.seed, num_workers=args.workers, drop_last=True)
    if not len(loader):
        sys.exit(f"{args.pack}: {len(ds)} windows of {args.context} tokens an epoch, fewer than one batch of {args.batch_size}")
    model = GPT(ds.vocab_size, args.context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    step = resume(args.checkpoint, model, opt, loader) if args.resume else 0
    # bfloat16 autocast and compilation on a GPU; plain float32 on the CPU, where they would not pay off
    amp = cuda and torch.cuda.is_bf16_supported()  # bfloat16 needs no loss scaling (Ampere or newer)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    net = torch.compile(model) if cuda else model  # `model` keeps the weights; checkpoints save it, not the wrapper
    print(f"{len(ds.data.tokens):,} tokens, vocabulary {ds.vocab_size}, {len(loader)} steps an epoch of "
          f"{args.batch_size} x {args.context}; {sum(p.numel() for p in model.parameters()):,} parameters; "
          f"training on {device} to step {args.steps} (workers: {args.workers})", flush=True)
    window, untimed = Window(device), step + 1  # the first step forks the workers and warms up (or compiles)
    with batch_log(args.log_batches, args.resume) as log:
        for x, y in window.batches(loader) if step < args.steps else ():
            if log:
                log.write(f"{step + 1} {hashlib.sha1(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:16]}\n")
            x, y = to_device((x, y), device)
            loss = train_step(net, opt, x, y, learning_rate(step, args.lr), autocast)
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
    prompt = ds[0][0][:8].unsqueeze(0).to(device)
    print("sample:", repr(ds.tokenizer.decode(model.generate(prompt, 32, args.context)[0].tolist())), flush=True)


if __name__ == "__main__":
    sys.exit(main())
