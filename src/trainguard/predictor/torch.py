"""The failure predictor's torch side: its two nets, their training loop, and DeepSurv.

    Mlp        window features [B, F] -> 2 logits (fail within 1 h, within 24 h)
    Cnn        the window itself [B, C, W] -> dilated 1D convolutions -> mean, max and last
               step -> 2 logits
    fit_net    Adam on binary cross-entropy, early stopping on the validation loss
    DeepSurv   an MLP whose output is a log hazard ratio, trained on Cox's partial likelihood
               (Katzman et al., "DeepSurv", BMC Med Res Methodol 2018; Breslow's ties)

Small on purpose: thousands of parameters, trained on the CPU in seconds to a minute. Inputs
arrive normalised (the caller keeps the means and deviations in the model file).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

from trainguard.reliability import need

try:
    import torch
    from torch import nn
except ImportError:
    raise ImportError(
        "trainguard's failure predictor needs torch: pip install 'trainguard[predictor]'"
    ) from None

__all__ = ["Cnn", "DeepSurv", "Mlp", "build", "fit_deepsurv", "fit_net", "logits", "one_thread"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: these nets are too small to gain from more, and on a busy host
    torch's spinning worker threads made a training step 25 times slower (28 ms -> 700 ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _two_hidden(n_features: int, hidden: int, dropout: float, head: Any) -> Any:
    """Two hidden ReLU layers with dropout, then ``head``: the body of both models."""
    return nn.Sequential(
        nn.Linear(n_features, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        head,
    )


class Mlp(nn.Module):
    def __init__(self, n_features: int, hidden: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.body = _two_hidden(n_features, hidden, dropout, nn.Linear(hidden, 2))

    def forward(self, x: Any) -> Any:
        return self.body(x)


class Cnn(nn.Module):
    """Three dilated convolutions (receptive field 29 steps) over the window's channels."""

    def __init__(self, n_channels: int, width: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        layers: list[Any] = []
        c = n_channels
        for dilation in (1, 2, 4):
            layers += [nn.Conv1d(c, width, 5, padding=2 * dilation, dilation=dilation), nn.ReLU()]
            c = width
        self.conv = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Linear(3 * width, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, 2)
        )

    def forward(self, x: Any) -> Any:
        h = self.conv(x)
        return self.head(torch.cat([h.mean(2), h.amax(2), h[:, :, -1]], dim=1))


def build(arch: str, size: int, seed: int | None = None) -> Any:
    """A fresh net: ``arch`` "mlp" (``size`` features) or "cnn" (``size`` channels); its first
    weights drawn from ``seed`` (None: torch's global generator as it stands)."""
    if seed is not None:
        torch.manual_seed(seed)
    return Mlp(size) if arch == "mlp" else Cnn(size)


def logits(net: Any, x: Any, batch: int = 8192) -> Any:
    """The net's logits [N, 2] for inputs [N, ...] (numpy in, numpy out), in evaluation mode."""
    net.eval()
    out = []
    with one_thread(), torch.inference_mode():
        for i in range(0, len(x), batch):
            out.append(net(torch.as_tensor(x[i : i + batch])).numpy())
    return need("numpy").concatenate(out) if out else need("numpy").zeros((0, 2), dtype="float32")


def fit_net(
    net: Any,
    batches: Callable[[Any], Any],
    val_x: Any,
    val_y: Any,
    epochs: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    patience: int = 2,
    pos_weight: Any = None,
) -> dict[str, Any]:
    """Train on ``batches(rng)`` (an iterable of (x, y) numpy batches per epoch); keep the
    weights of the epoch with the lowest validation loss. Returns the loss curve.
    ``pos_weight`` (per output) weighs the rare failures up; calibration undoes the shift."""
    np = need("numpy")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-4)
    weight = None if pos_weight is None else torch.as_tensor(pos_weight, dtype=torch.float32)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=weight)
    vy = torch.as_tensor(val_y, dtype=torch.float32)
    best, best_state, curve, waited = math.inf, None, [], 0
    with one_thread():
        for _ in range(epochs):
            net.train()
            for x, y in batches(rng):
                opt.zero_grad()
                loss = loss_fn(net(torch.as_tensor(x)), torch.as_tensor(y, dtype=torch.float32))
                loss.backward()
                opt.step()
            val = float(loss_fn(torch.as_tensor(logits(net, val_x)), vy))
            curve.append(round(val, 5))
            if val < best - 1e-5:
                best, waited = val, 0
                best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            else:
                waited += 1
                if waited >= patience:
                    break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    return {"val_loss": curve, "epochs": len(curve)}


def input_gradients(net: Any, x: Any) -> Any:
    """d(logits)/d(input) for one input batch: [2, *x.shape] (one map per horizon)."""
    net.eval()
    grads = []
    with one_thread():
        t = torch.as_tensor(x).clone().requires_grad_(True)
        out = net(t)
        for h in range(out.shape[1]):
            (g,) = torch.autograd.grad(out[:, h].sum(), t, retain_graph=h + 1 < out.shape[1])
            grads.append(g.numpy())
    return need("numpy").stack(grads)


# -- DeepSurv -------------------------------------------------------------------------------------


class DeepSurv(nn.Module):
    def __init__(self, n_features: int, hidden: int = 32, dropout: float = 0.2) -> None:
        super().__init__()
        # a log hazard ratio: the baseline hazard absorbs any bias
        self.body = _two_hidden(n_features, hidden, dropout, nn.Linear(hidden, 1, bias=False))

    def forward(self, x: Any) -> Any:
        return self.body(x).squeeze(1)


def cox_loss(risk: Any, time: Any, event: Any) -> Any:
    """Negative Cox partial log-likelihood per event (Breslow's handling of ties): each
    failure's log risk minus the log of the summed risk of everyone still at risk then."""
    order = torch.argsort(time, descending=True)
    r, t, e = risk[order], time[order], event[order]
    log_cum = torch.logcumsumexp(r, dim=0)
    # With ties, everyone failing at one time shares the risk set of the earliest of them: the
    # cumulative sum up to the last row holding that time.
    _, counts = torch.unique_consecutive(t, return_counts=True)
    ends = torch.cumsum(counts, 0) - 1
    log_at_risk = torch.repeat_interleave(log_cum[ends], counts)
    n = e.sum().clamp(min=1.0)
    return -((r - log_at_risk) * e).sum() / n


def fit_deepsurv(
    x: Any,
    time: Any,
    event: Any,
    val: tuple[Any, Any, Any],
    epochs: int = 300,
    lr: float = 1e-3,
    weight_decay: float = 1e-3,
    seed: int = 0,
    patience: int = 30,
) -> tuple[Any, dict[str, Any]]:
    """DeepSurv on the whole training set per step (full-batch Adam), stopped early on the
    validation partial likelihood."""
    torch.manual_seed(seed)
    net = DeepSurv(x.shape[1])
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    tx, tt, te = (torch.as_tensor(a, dtype=torch.float32) for a in (x, time, event))
    vx, vt, ve = (torch.as_tensor(a, dtype=torch.float32) for a in val)
    best, best_state, waited, epoch = math.inf, None, 0, 0
    with one_thread():
        for epoch in range(1, epochs + 1):  # noqa: B007 (the count is reported)
            net.train()
            opt.zero_grad()
            loss = cox_loss(net(tx), tt, te)
            loss.backward()
            opt.step()
            net.eval()
            with torch.inference_mode():
                v = float(cox_loss(net(vx), vt, ve))
            if v < best - 1e-5:
                best, waited = v, 0
                best_state = {k: p.detach().clone() for k, p in net.state_dict().items()}
            else:
                waited += 1
                if waited >= patience:
                    break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    return net, {"epochs": epoch, "val_partial_likelihood": round(-best, 5)}


def risk_of(net: Any, x: Any) -> Any:
    """DeepSurv's log hazard ratio per row (numpy)."""
    net.eval()
    with one_thread(), torch.inference_mode():
        return net(torch.as_tensor(x, dtype=torch.float32)).numpy()
