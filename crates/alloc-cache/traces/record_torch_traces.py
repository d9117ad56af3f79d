"""Records allocation traces from real PyTorch training runs, in kiln's trace format.

Issue 17 holds kiln's allocator to its goals on traces recorded from others' runs too, not only
kiln's own. This script trains the same runs as `cargo xtask record-traces` (same models,
shapes, batches, optimizers and step counts) in PyTorch on the CPU and writes every allocation
and free that PyTorch's CPU allocator made during the run, as reported by the profiler
(`torch.profiler.profile(profile_memory=True)`: one `[memory]` event per allocation and per
free, with its address and signed byte count). Each trace is written as `torch_NAME.trace`
beside this script:

- allocations are paired with their frees by address (an address is reused only after its
  block was freed); frees of blocks allocated before the recording started are dropped;
- ids are renumbered densely, the smallest free id reused first (as kiln's
  `compact_recording` does, so the files are already compact), and what is still live at the
  end (model, optimizer state) is freed at the end in id order;
- the running sum of the byte counts is checked against the profiler's `Total Allocated` at
  every event, so a lost or reordered event fails the recording instead of writing a wrong
  trace.

These are PyTorch's CPU allocations (oneDNN convolutions, CPU attention kernels), not a GPU
run's: like kiln's own recordings they stand in for a training step's request stream. The
models are written the way a PyTorch user writes them (torchvision's ResNet-18 and
VisionTransformer, a nanoGPT-style GPT with `scaled_dot_product_attention`).

Usage (PyTorch installed; one thread, so the allocation order is fixed):
    python record_torch_traces.py [--only NAME] [--seed N] [--out DIR]
"""

import argparse
import bisect
import heapq
import json
import os
import random
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.profiler import ProfilerActivity, profile, record_function

# Prefix of the profiler ranges that mark where each step starts.
MARK = "kiln-trace-mark: "

# name -> (kind, settings); the same runs as xtask/src/record_traces.rs's RUNS.
RUNS = {
    "resnet18_sgd": ("resnet", dict(side=64, batch=16, steps=6)),
    "gpt_varlen_adamw": (
        "gpt",
        dict(vocab=4096, block=256, layers=4, heads=4, width=256, batch=8, lengths=(32, 256), steps=8),
    ),
    "finetune_resnet18_varbatch": ("finetune", dict(side=64, batches=(8, 12, 16), steps=8)),
    "vit_adamw": (
        "vit",
        dict(side=64, patch=8, layers=6, heads=3, width=192, mlp=768, classes=10, batch=16, steps=6),
    ),
    "resnet18_sgd_gpu": ("resnet", dict(side=224, batch=128, steps=6)),
    "gpt_varlen_adamw_gpu": (
        "gpt",
        dict(vocab=16384, block=1024, layers=4, heads=8, width=256, batch=8, lengths=(256, 1024), steps=8),
    ),
    "finetune_resnet18_varbatch_gpu": ("finetune", dict(side=224, batches=(64, 96, 128), steps=8)),
    "vit_adamw_gpu": (
        "vit",
        dict(side=224, patch=16, layers=12, heads=6, width=384, mlp=1536, classes=100, batch=32, steps=6),
    ),
}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Gpt(nn.Module):
    """A nanoGPT-style GPT with an untied, bias-free head (kiln's `Gpt` layout)."""

    def __init__(self, vocab, block, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def train_step(model, opt, x, y, classes):
    """forward -> cross entropy -> backward -> step -> zero_grad(set_to_none)."""
    logits = model(x).reshape(-1, classes)
    loss = F.cross_entropy(logits, y)
    del logits
    loss.backward()
    del loss
    opt.step()
    opt.zero_grad(set_to_none=True)


def run(kind, s, rng, mark):
    """Trains run `kind` with settings `s`; `mark(text)` notes where each step starts."""
    if kind == "resnet":
        model = torchvision.models.resnet18(num_classes=10)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for step in range(1, s["steps"] + 1):
            mark(f"step {step} batch {s['batch']}")
            x = torch.randn(s["batch"], 3, s["side"], s["side"])
            y = torch.randint(0, 10, (s["batch"],))
            train_step(model, opt, x, y, 10)
    elif kind == "gpt":
        model = Gpt(s["vocab"], s["block"], s["layers"], s["heads"], s["width"])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        for step in range(1, s["steps"] + 1):
            t = rng.randint(*s["lengths"])
            mark(f"step {step} batch {s['batch']} seq {t}")
            x = torch.randint(0, s["vocab"], (s["batch"], t))
            y = torch.randint(0, s["vocab"], (s["batch"] * t,))
            train_step(model, opt, x, y, s["vocab"])
    elif kind == "finetune":
        model = torchvision.models.resnet18(num_classes=10)
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("fc."))
        opt = torch.optim.SGD(model.fc.parameters(), lr=0.01, momentum=0.9)
        for step in range(1, s["steps"] + 1):
            if step == 4:
                backbone = [p for n, p in model.named_parameters() if not n.startswith("fc.")]
                for p in backbone:
                    p.requires_grad_(True)
                opt.add_param_group({"params": backbone, "lr": 0.001})
            batch = rng.choice(s["batches"])
            phase = "frozen" if step < 4 else "unfrozen"
            mark(f"step {step} batch {batch} backbone {phase}")
            x = torch.randn(batch, 3, s["side"], s["side"])
            y = torch.randint(0, 10, (batch,))
            train_step(model, opt, x, y, 10)
    elif kind == "vit":
        model = torchvision.models.VisionTransformer(
            image_size=s["side"],
            patch_size=s["patch"],
            num_layers=s["layers"],
            num_heads=s["heads"],
            hidden_dim=s["width"],
            mlp_dim=s["mlp"],
            num_classes=s["classes"],
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(1, s["steps"] + 1):
            mark(f"step {step} batch {s['batch']}")
            x = torch.randn(s["batch"], 3, s["side"], s["side"])
            y = torch.randint(0, s["classes"], (s["batch"],))
            train_step(model, opt, x, y, s["classes"])
    else:
        raise ValueError(f"unknown kind {kind}")
    # Stop recording while the model and optimizer are alive (their frees come last, in id
    # order, from `to_trace`).
    return model, opt


def to_trace(mem, marks, header):
    """kiln's trace text from the memory events and the step marks (event index, text)."""
    out = [f"# {line}" for line in header]
    live = {}  # address -> id
    free_ids = []  # ids free for reuse (a min-heap)
    next_id = 1
    total = None
    m = 0
    for i, a in enumerate(mem):
        while m < len(marks) and marks[m][0] <= i:
            out.append(f"# {marks[m][1]}")
            m += 1
        nbytes, addr = a["Bytes"], a["Addr"]
        if total is not None and total + nbytes != a["Total Allocated"]:
            raise SystemExit(
                f"event {i}: running total {total} + {nbytes} != profiler's {a['Total Allocated']}: "
                "an event is missing or out of order"
            )
        total = a["Total Allocated"]
        if nbytes > 0:
            if addr in live:
                raise SystemExit(f"event {i}: address {addr:#x} allocated again while live")
            ident = heapq.heappop(free_ids) if free_ids else next_id
            if ident == next_id:
                next_id += 1
            live[addr] = ident
            out.append(f"a {ident} {nbytes}")
        elif nbytes < 0:
            ident = live.pop(addr, None)
            if ident is not None:  # else allocated before the recording started
                heapq.heappush(free_ids, ident)
                out.append(f"f {ident}")
    while m < len(marks):
        out.append(f"# {marks[m][1]}")
        m += 1
    rest = sorted(live.values())
    if rest:
        out.append(f"# {len(rest)} blocks still live at the end, freed here")
        out.extend(f"f {i}" for i in rest)
    return "\n".join(out) + "\n"


def record(name, seed):
    kind, settings = RUNS[name]
    torch.manual_seed(seed)
    rng = random.Random(seed)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        # A mark is an empty profiler range, so it is timed on the profiler's own clock.
        def mark(text):
            with record_function(MARK + text):
                pass

        kept = run(kind, settings, rng, mark)
        mark("end of training: what is still live (model, optimizer state) is freed here")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        mem, placed = read_profile(path)
    del kept
    header = [
        f"PyTorch {torch.__version__} training run `{name}` on the CPU, recorded by "
        f"`python crates/alloc-cache/traces/record_torch_traces.py --only {name} --seed {seed}`",
        "PyTorch's CPU allocations from its profiler (profile_memory=True); requested bytes per "
        "allocation; ids are renumbered (a freed id is reused)",
    ]
    return to_trace(mem, placed, header)


def read_profile(path):
    """The CPU `[memory]` events of a profiler trace in the order they happened, and each mark
    as (index of the first memory event after it, text)."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    mem = [e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0]
    mem.sort(key=lambda e: e["args"]["Ev Idx"])
    stamps = [float(e["ts"]) for e in mem]
    if stamps != sorted(stamps):
        raise SystemExit("the profiler's event numbers and times disagree on the order")
    marks = sorted(
        (float(e["ts"]), e["name"][len(MARK) :]) for e in events if e.get("name", "").startswith(MARK)
    )
    placed = [(bisect.bisect_left(stamps, ts), text) for ts, text in marks]
    return [e["args"] for e in mem], placed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=sorted(RUNS), help="record only this run")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = p.parse_args()
    torch.set_num_threads(1)
    for name in RUNS:
        if args.only and args.only != name:
            continue
        start = time.time()
        text = record(name, args.seed)
        path = os.path.join(args.out, f"torch_{name}.trace")
        with open(path, "w") as f:
            f.write(text)
        print(f"{path}: {len(text)} bytes in {time.time() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
