"""PyTorch's side of `cargo xtask bench --vs-torch` (issue 16).

The bench embeds this file and runs it as `PYTHON -c SCRIPT [--quick] CASE`, one interpreter per
CASE (`NAME` or `NAME/ARG`, ARG a batch, a matrix size or a worker count). The script sets the case up (model,
optimizer, inputs; one warm-up call), prints one JSON line

    {"torch": "2.x", "threads": 2}        or        {"error": "..."}

(a `gpu_` case adds `"device": "<GPU name>"`), then answers each line it reads on standard input
with one figure, measured afresh:

    {"value": 12.3, "unit": "ms"}         or        {"error": "..."}

and exits at the end of its input. The bench alternates these rounds with its own measurement of
the same case, so the two figures of each round are taken within seconds of each other. A
figure is measured the way the bench measures kiln's: one untimed warm-up call, then the median
(steps, optimizer and clip cases) or the best (matmul) of the timed calls. The models are
defined here (torchvision's ResNet-18 layout, the train example's narrower CIFAR ResNet, a
784-512-256-10 MLP, a small GPT), so nothing but `torch` is needed, except by the `data` group's
`image_folder_epoch`, which reads the bench's image folder with torchvision's `ImageFolder`. The `gpu_` cases run on
`cuda:0` and are timed as the bench's GPU cases are: warm-up calls, then the best of three
rounds of calls between two synchronisations.

Invariants: every case uses the same model, batch, loss, optimizer and options as the kiln case
of the same name in xtask/src/bench/; nothing is downloaded; an error is a JSON line, never a
traceback in place of one.
"""

import json
import subprocess
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F


def median_ms(runs, fn):
    fn()
    times = []
    for _ in range(max(runs, 1)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def adaptive_median_ms(reps, fn):
    """The bench's `median_secs`: at least `reps` calls, up to ~0.3 s of samples, at most 200."""
    start = time.perf_counter()
    fn()
    warm = time.perf_counter() - start
    runs = min(max(int(0.3 / max(warm, 1e-6)), max(reps, 1)), 200)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


class BasicBlock(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        # In place where torchvision's BasicBlock is (`nn.ReLU(inplace=True)`, `out +=
        # identity`): PyTorch's CPU tensors do not come from a cache, so every new activation
        # is fresh memory, and the in-place form is what torchvision users run.
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        out += identity
        return F.relu(out, inplace=True)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout; `width` and `blocks` per stage make the train example's
    smaller CIFAR ResNet (16, 1)."""

    def __init__(self, num_classes, small_input, width=64, blocks=2):
        super().__init__()
        if small_input:
            self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for i, planes in enumerate([width, 2 * width, 4 * width, 8 * width]):
            for b in range(blocks):
                layers.append(BasicBlock(cin, planes, 2 if b == 0 and i > 0 else 1))
                cin = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x)), inplace=True))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def labels(batch, classes):
    return torch.tensor([(i * 7 + 3) % classes for i in range(batch)], dtype=torch.long)


def clipped_step(model, opt, x, y, steps):
    """A measurement of a training step (cross-entropy, backward, clip_grad_norm_(1.0), step,
    zero_grad): median ms of `steps` steps after a warm-up step."""
    params = list(model.parameters())

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return lambda: median_ms(steps, step)


def resnet_step(size, batch, steps, classes):
    torch.manual_seed(0)
    model = ResNet18(classes, small_input=size == 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size)
    return clipped_step(model, opt, x, labels(batch, classes), steps)


def small_resnet(train):
    """The train example's CIFAR ResNet (width 16, one block per stage, 10 classes)."""
    torch.manual_seed(0)
    model = ResNet18(10, small_input=True, width=16, blocks=1)
    return model if train else model.eval()


def small_resnet_step(batch, steps):
    model = small_resnet(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32)
    return clipped_step(model, opt, x, labels(batch, 10), steps)


def small_resnet_eval(batch, runs):
    model, x = small_resnet(False), torch.randn(batch, 3, 32, 32)

    def forward():
        with torch.no_grad():
            model(x)

    forward()
    return lambda: median_ms(runs, forward)


def spinner():
    """A busy competing process: a shell loop spinning on one core (the bench's own spinner)."""
    return subprocess.Popen(["sh", "-c", "while :; do :; done"])


def contended(measure):
    """`measure` while the competing process spins, as the bench's kiln side does."""

    def run():
        spin = spinner()
        try:
            return measure()
        finally:
            spin.kill()
            spin.wait()

    return run


def resnet_eval(batch, runs):
    torch.manual_seed(0)
    model = ResNet18(1000, small_input=False).eval()
    x = torch.randn(batch, 3, 224, 224)

    def forward():
        with torch.no_grad():
            model(x)

    forward()
    return lambda: median_ms(runs, forward)


def matmul(n, reps):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    torch.matmul(a, b)

    def gflops():
        torch.matmul(a, b)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        return 2.0 * n**3 / best / 1e9

    return gflops


def cross_entropy(rows, classes, reps):
    """The `ops` group's loss case: F.cross_entropy then backward on [rows, classes] logits."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(rows, classes, generator=gen) * 2.0).requires_grad_()
    y = labels(rows, classes)

    def call():
        x.grad = None
        F.cross_entropy(x, y).backward()

    return lambda: adaptive_median_ms(reps, call)


def mlp_step(batch, steps):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 784)
    return clipped_step(model, opt, x, labels(batch, 10), steps)


class Gpt(nn.Module):
    """The `train` group's GPT (train_gpt.rs): token and position embeddings, pre-norm causal
    `nn.TransformerEncoderLayer` blocks with tanh-GELU, a final LayerNorm, a bias-free head."""

    def __init__(self, vocab=65, block=64, layers=4, heads=4, width=128):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.h = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, heads, 4 * width, 0.0,
                activation=lambda x: F.gelu(x, approximate="tanh"),
                batch_first=True, norm_first=True,
            )
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block))

    def forward(self, x):
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for block in self.h:
            h = block(h, src_mask=self.mask, is_causal=True)
        return self.lm_head(self.ln_f(h))


def gpt_step(batch, steps):
    """The `train` group's GPT step: next-token cross-entropy over the fixed token pattern of
    train_gpt.rs, AdamW, clip."""
    torch.manual_seed(0)
    model = Gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = (torch.arange(batch * 64) * 7919) % 65
    x, y = ids.view(batch, 64), (ids + 1) % 65
    params = list(model.parameters())

    def step():
        F.cross_entropy(model(x).view(-1, 65), y).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return lambda: median_ms(steps, step)


def resnet18_lens():
    """The bench's `resnet18` gradient set: torchvision ResNet-18's 62 parameter sizes."""
    v, cin = [64 * 3 * 7 * 7, 64, 64], 64
    for layer, c in enumerate([64, 128, 256, 512]):
        for block in range(2):
            inc = cin if block == 0 else c
            v += [c * inc * 9, c, c, c * c * 9, c, c]
            if block == 0 and layer > 0:
                v += [c * cin, c, c]
        cin = c
    return v + [1000 * 512, 1000]


def params_with_grads(lens):
    """Parameters of 0.01 with the bench's deterministic gradient values."""
    params = []
    for i, n in enumerate(lens):
        p = torch.full((n,), 0.01, requires_grad=True)
        k = torch.arange(n, dtype=torch.int64)
        p.grad = ((k * 7 + i) % 1013).to(torch.float32) * 1e-3 - 0.5
        params.append(p)
    return params


SHRINK = 0.99


def adamw(lens, reps, clip):
    params = params_with_grads(lens)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    if not clip:
        return lambda: adaptive_median_ms(reps, opt.step)
    total = [float(torch.nn.utils.clip_grad_norm_(params, float("inf")))]

    def clip_then_step():
        total[0] = float(torch.nn.utils.clip_grad_norm_(params, total[0] * SHRINK)) * SHRINK
        opt.step()

    return lambda: adaptive_median_ms(reps, clip_then_step)


def clip_only(lens, reps):
    params = params_with_grads(lens)
    total = [float(torch.nn.utils.clip_grad_norm_(params, float("inf")))]

    def clip():
        total[0] = float(torch.nn.utils.clip_grad_norm_(params, total[0] * SHRINK)) * SHRINK

    return lambda: adaptive_median_ms(reps, clip)


def gpu_per_call(fn, round_s, reps=None):
    """Seconds per call of `fn` on the GPU, as the bench's `per_call`: two warm-up calls (the
    second timed), then the best of three rounds of calls between two synchronisations, `reps`
    calls a round, or as many as fill `round_s` (1 to 200); a call slower than four rounds gets
    one more timed call instead of three rounds."""
    sync = torch.cuda.synchronize
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    warm = max(time.perf_counter() - start, 1e-7)
    if reps is None:
        reps = min(max(int(round_s / warm), 1), 200)
        rounds = 1 if warm > 4 * round_s else 3
    else:
        rounds = 3
    best = warm if rounds == 1 else float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def gpu_matmul(n, dtype, reps):
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(n, n, generator=gen, device="cuda", dtype=dtype)
    b = torch.randn(n, n, generator=gen, device="cuda", dtype=dtype)
    return lambda: 2.0 * n**3 / gpu_per_call(lambda: torch.matmul(a, b), 0, reps) / 1e9


def gpu_resnet_step(batch, reps):
    """The bench's GPU step: 224x224, 1000 classes, bf16 autocast, SGD momentum, no clip."""
    torch.manual_seed(0)
    model = ResNet18(1000, small_input=False).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = labels(batch, 1000).cuda()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return lambda: gpu_per_call(step, 0, reps) * 1e3


# ResNet18's distinct convolutions at 224x224, as the bench's `RESNET18_224_CONVS`:
# (C_in, C_out, input size, kernel, stride, uses in the model); padding is kernel // 2.
RESNET18_224_CONVS = [
    (3, 64, 224, 7, 2, 1),
    (64, 64, 56, 3, 1, 4),
    (64, 128, 56, 3, 2, 1),
    (128, 128, 28, 3, 1, 3),
    (64, 128, 56, 1, 2, 1),
    (128, 256, 28, 3, 2, 1),
    (256, 256, 14, 3, 1, 3),
    (128, 256, 28, 1, 2, 1),
    (256, 512, 14, 3, 2, 1),
    (512, 512, 7, 3, 1, 3),
    (256, 512, 14, 1, 2, 1),
]


def gpu_conv_passes(batch, reps):
    """ms of ResNet18's convolutions pass by pass alone in bf16 (cuDNN): each shape's forward,
    input gradient and weight gradient timed as the bench's `per_call`, times its uses."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    cases = []
    for cin, cout, size, k, stride, uses in RESNET18_224_CONVS:
        def normal(*shape):
            return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)

        x, w = normal(batch, cin, size, size), normal(cout, cin, k, k)
        g = normal(*F.conv2d(x, w, stride=stride, padding=k // 2).shape)
        cases.append((x, w, g, stride, k // 2, uses))

    def total():
        ms = 0.0
        for x, w, g, stride, pad, uses in cases:
            passes = (
                lambda: F.conv2d(x, w, stride=stride, padding=pad),
                lambda: torch.nn.grad.conv2d_input(x.shape, w, g, stride=stride, padding=pad),
                lambda: torch.nn.grad.conv2d_weight(x, w.shape, g, stride=stride, padding=pad),
            )
            ms += uses * sum(gpu_per_call(p, 0, reps) for p in passes) * 1e3
        return ms

    return total


def gpt2_small_lens():
    """The bench's `gpt2-small` gradient set (its 148 parameter sizes)."""
    d, v = 768, [50257 * 768, 1024 * 768]
    for _ in range(12):
        v += [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]
    return v + [d, d]


GPU_SETS = {"resnet18": resnet18_lens, "gpt2": gpt2_small_lens, "2000x1000": lambda: [1000] * 2000}


def gpu_params(lens):
    """Parameters of 0.01 on cuda:0 with N(0, 0.1) gradients, as the bench's `device_params`."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    params = []
    for n in lens:
        p = torch.full((n,), 0.01, device="cuda", requires_grad=True)
        p.grad = torch.randn(n, generator=gen, device="cuda") * 0.1
        params.append(p)
    return params


def gpu_adamw(lens, round_s):
    opt = torch.optim.AdamW(gpu_params(lens), lr=1e-4, weight_decay=0.01, fused=True)
    return lambda: gpu_per_call(opt.step, round_s) * 1e3


def gpu_clip(lens, round_s):
    """clip_grad_norm_ as PyTorch runs it on CUDA (foreach; the norm stays a device tensor),
    with max_norm 0.999 x the norm the gradients have at each call, as the bench's clip cases."""
    params = gpu_params(lens)
    bound = [float(torch.nn.utils.clip_grad_norm_(params, float("inf"))) * SHRINK]

    def clip():
        torch.nn.utils.clip_grad_norm_(params, bound[0])
        bound[0] *= SHRINK

    return lambda: gpu_per_call(clip, round_s) * 1e3


def set_up_gpu(name, arg, quick):
    """A `gpu_` case on cuda:0, set up: (a function measuring one figure, its unit)."""
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    round_s = 0.01 if quick else 0.05
    reps = 3 if quick else 20
    if name == "gpu_matmul_f32":
        return gpu_matmul(arg, torch.float32, reps), "GFLOP/s"
    if name == "gpu_matmul_bf16":
        return gpu_matmul(arg, torch.bfloat16, reps), "GFLOP/s"
    if name == "gpu_resnet18_224_step_bf16":
        return gpu_resnet_step(arg, 2 if quick else 10), "ms"
    if name == "gpu_conv_passes_bf16":
        return gpu_conv_passes(arg, 2 if quick else 10), "ms"
    for prefix, make in (("gpu_adamw_", gpu_adamw), ("gpu_clip_", gpu_clip)):
        if name.startswith(prefix) and name[len(prefix):] in GPU_SETS:
            return make(GPU_SETS[name[len(prefix):]](), round_s), "ms"
    raise ValueError(f"unknown case `{name}`")


def set_up(name, arg, quick):
    """Case `name` at `arg`, set up: (a function measuring one figure, its unit)."""
    if name.startswith("gpu_"):
        return set_up_gpu(name, arg, quick)
    steps = 1 if quick else 5
    reps = 1 if quick else 5
    if name == "resnet18_cifar_step":
        return resnet_step(32, arg, steps, 10), "ms"
    if name == "threads_cifar_step":
        # The `threads` group: the CIFAR step at `arg` threads (kiln's batch: 4 quick, else 32).
        torch.set_num_threads(arg)
        return resnet_step(32, 4 if quick else 32, steps, 10), "ms"
    if name == "threads_eval":
        # The `threads` group: the batch-1 eval at `arg` threads.
        torch.set_num_threads(arg)
        return resnet_eval(1, 3 if quick else 20), "ms"
    if name == "threads_eval_odd":
        # The `threads` group: the eval at batch `arg` + 1 on `arg` threads.
        torch.set_num_threads(arg)
        return resnet_eval(arg + 1, 3 if quick else 20), "ms"
    if name == "resnet18_cifar_step_contended":
        return contended(resnet_step(32, arg, 1 if quick else 3, 10)), "ms"
    if name == "resnet18_224_step":
        return resnet_step(224, arg, steps, 1000), "ms"
    if name == "small_resnet_step":
        return small_resnet_step(arg, steps), "ms"
    if name == "small_resnet_eval":
        return small_resnet_eval(arg, 3 if quick else 20), "ms"
    if name == "resnet18_224_eval":
        return resnet_eval(arg, 3 if quick else 20), "ms"
    if name == "image_folder_epoch":
        return image_folder_epoch(arg, 1 if quick else 5), "ms"
    if name == "matmul":
        return matmul(arg, 2 if quick else 10), "GFLOP/s"
    if name.startswith("cross_entropy_") and name.endswith("_classes"):
        classes = int(name[len("cross_entropy_"):-len("_classes")])
        return cross_entropy(arg, classes, 2 if quick else 10), "ms"
    if name == "mlp_step":
        return mlp_step(arg, 3 if quick else 30), "ms"
    if name == "gpt_step":
        return gpt_step(arg, 3 if quick else 20), "ms"
    if name == "adamw_resnet18":
        return adamw(resnet18_lens(), reps, clip=False), "ms"
    if name == "clip_adamw_resnet18":
        return adamw(resnet18_lens(), reps, clip=True), "ms"
    if name == "adamw_2000x1000":
        return adamw([1000] * 2000, reps, clip=False), "ms"
    if name == "clip_2000x1000":
        return clip_only([1000] * 2000, reps), "ms"
    if name == "clip_resnet18":
        return clip_only(resnet18_lens(), reps), "ms"
    raise ValueError(f"unknown case `{name}`")


def image_folder_epoch(workers, runs):
    """The `data` group (data.rs): an epoch of torchvision's `ImageFolder` over the bench's
    $TMPDIR/kiln-bench-image-folder: resize to 224x224, crop (padding 4), flip, normalise
    (ImageNet), shuffled batches of 16 from `workers` processes kept between epochs."""
    import os, tempfile, torchvision
    from torchvision import transforms as T
    imagenet = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    transform = T.Compose([T.Resize((224, 224)), T.RandomCrop(224, padding=4),
                           T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*imagenet)])
    root = os.path.join(tempfile.gettempdir(), "kiln-bench-image-folder")
    loader = torch.utils.data.DataLoader(
        torchvision.datasets.ImageFolder(root, transform=transform), batch_size=16,
        shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    return lambda: median_ms(runs, lambda: [None for _ in loader])


def say(obj):
    print(json.dumps(obj), flush=True)


def failure(e):
    return {"error": f"{type(e).__name__}: {e}"}


def main(argv):
    quick = "--quick" in argv
    cases = [a for a in argv if a != "--quick"]
    if len(cases) != 1:
        say({"error": f"expected one case, got {cases}"})
        return
    name, _, arg = cases[0].partition("/")
    try:
        measure, unit = set_up(name, int(arg) if arg else 0, quick)
    except Exception as e:  # the bench reads the reason from this line
        say(failure(e))
        return
    ready = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if name.startswith("gpu_"):
        ready["device"] = torch.cuda.get_device_name(0)
    say(ready)
    for _ in sys.stdin:
        try:
            say({"value": measure(), "unit": unit})
        except Exception as e:
            say(failure(e))


if __name__ == "__main__":
    main(sys.argv[1:])
