"""Calibration benchmark of the diagnostics: null rates and power, now and before.

For every detector, the fraction of null batches (or series, or runs) on which it alarms,
with its Monte Carlo standard error ``sqrt(r (1 - r) / R)``, at the batch sizes
``B in {4, 8, 16, 64, 128}``, with and without errors shared within a row and with AR(1)
series; beside it the power at a stated effect, and the same figures for the code of
``BASE`` (the audited tree, issue 29), loaded from ``git show`` into a scratch package.
A null row is ``ok`` when its rate is ``<= nominal + 2 se``. ``undecided`` counts the
batches at which the detector refused ("too few rows to decide"); they never alarm.
The monitor rows feed the library's own z's to ``RunMonitor`` over runs of 200 and 2,000
steps: the z's of ``2 R`` null batches at a shape, resampled with replacement into runs.
Rows marked ``shown`` are not a detector of the library (unit-variance ``t_5`` steps fed
as z's): the bound is not claimed for them, and they show why.

Run: ``nice python bench/calibration.py [--reps R] [--quick] [--no-old] [--only SECTION]``
(one thread; ``--quick`` divides every replicate count by 4; ``--only`` repeats). On 2
shared cores ``--quick`` takes about 15-30 minutes. Summary: ``docs/diagnostics.md``.
"""

from __future__ import annotations

import argparse
import importlib
import math
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polgrad_reference import diagnostics as D  # noqa: E402

BASE = "8709ddd"
"""The tree the audit of issue 29 ran on."""
SIZES = (4, 8, 16, 64, 128)
SECTIONS = ("covariance", "length", "mismatch", "changepoint", "entropy", "ess", "monitor")
HORIZONS = (200, 2000)
"""Steps of a monitored run: the example's, and the audit's 2,000."""
F64 = torch.float64


@dataclass
class Row:
    section: str
    case: str
    size: str
    nominal: float | None
    """The level a null row is held to; None for a power row."""
    new: tuple[float, float, int] | None = None
    """``(rate, se, undecided)``."""
    old: tuple[float, float] | None = None
    claimed: bool = True
    """False: a null row whose level the library does not claim (shown for contrast)."""


def rate(hits: int, reps: int) -> tuple[float, float]:
    r = hits / reps
    return r, math.sqrt(max(r * (1 - r), 1e-12) / reps)


# ----------------------------------------------------------------------------- old code


def load_old(rev: str) -> Any | None:
    """The diagnostics package at ``rev`` as module ``pgold.diagnostics`` (its relative
    imports of the rest of ``polgrad_reference`` resolve to today's modules)."""
    try:
        names = subprocess.run(
            ["git", "ls-tree", "--name-only", f"{rev}:polgrad_reference/diagnostics"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    tmp = Path(tempfile.mkdtemp(prefix="pgold-"))
    pkg = tmp / "pgold" / "diagnostics"
    pkg.mkdir(parents=True)
    (tmp / "pgold" / "__init__.py").write_text("")
    for name in names:
        text = subprocess.run(
            ["git", "show", f"{rev}:polgrad_reference/diagnostics/{name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (pkg / name).write_text(text)
    sys.path.insert(0, str(tmp))
    parent = importlib.import_module("pgold")
    import polgrad_reference

    for sub in ("_validate", "errors", "aggregate", "config", "entropy", "ratios", "surrogates"):
        mod = importlib.import_module(f"polgrad_reference.{sub}")
        sys.modules[f"pgold.{sub}"] = mod
        setattr(parent, sub, mod)
    assert isinstance(polgrad_reference, types.ModuleType)
    return importlib.import_module("pgold.diagnostics")


# ----------------------------------------------------------------------------- data


def cov_batch(
    g: torch.Generator, b: int, *, gamma: float, row_effect: float, t: int = 20
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logprobs with a per-row confidence level (``row_effect``: errors shared within a
    row), advantages ``gamma (row mean logprob - mean) + N(0, 1)``."""
    mask = torch.arange(t)[None] < torch.randint(2, t + 1, (b, 1), generator=g)
    level = row_effect * torch.randn((b, 1), generator=g, dtype=F64)
    lp = -torch.nn.functional.softplus(level + torch.randn((b, t), generator=g, dtype=F64))
    row_mean = torch.where(mask, lp, 0.0).sum(dim=1) / mask.sum(dim=1)
    adv = gamma * (row_mean - row_mean.mean()) + torch.randn(b, generator=g, dtype=F64)
    return lp, adv, mask


def length_batch(
    g: torch.Generator, b: int, *, beta: float = 0.0, prompts: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The example's shape: lengths U(16..64), ``A = beta z_L + N(0, 1)``; with
    ``prompts`` groups, advantages centred and scaled per prompt (GRPO) after a
    per-prompt reward level."""
    lengths = torch.randint(16, 65, (b,), generator=g)
    mask = torch.arange(64)[None] < lengths[:, None]
    ell = lengths.double()
    adv = beta * (ell - 40.0) / 14.0 + torch.randn(b, generator=g, dtype=F64)
    groups = None
    if prompts:
        groups = torch.arange(b) * prompts // b
        adv = adv + 3.0 * groups.double()
        for k in range(prompts):
            sel = groups == k
            adv[sel] = (adv[sel] - adv[sel].mean()) / adv[sel].std()
    return adv, mask, groups


def mismatch_batch(
    g: torch.Generator,
    b: int,
    *,
    t: int = 64,
    rollout: float = 1.0,
    trainer: float = 1.0,
    row_share: float = 0.0,
    full: bool = False,
    sigma0: float = 0.01,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Trainer, rollout, re-score = truth + noise of sd ``sigma0`` times their scales;
    ``row_share`` of each noise's variance shared along the row."""
    mask = torch.arange(t)[None] < torch.randint(1, t + 1, (b, 1), generator=g)
    if full:
        mask = torch.ones((b, t), dtype=torch.bool)
    truth = -3.0 * torch.rand((b, t), generator=g, dtype=F64)

    def noisy(scale: float) -> torch.Tensor:
        tok = torch.randn((b, t), generator=g, dtype=F64)
        row = torch.randn((b, 1), generator=g, dtype=F64)
        e = math.sqrt(1 - row_share) * tok + math.sqrt(row_share) * row
        return truth + scale * sigma0 * e

    return noisy(trainer), noisy(rollout), noisy(1.0), mask


def ar1(g: torch.Generator, reps: int, n: int, phi: float) -> torch.Tensor:
    e = torch.randn((reps, n + 50), generator=g, dtype=F64)
    x = torch.zeros_like(e)
    for step in range(1, n + 50):
        x[:, step] = phi * x[:, step - 1] + e[:, step]
    return x[:, 50:]


# ----------------------------------------------------------------------------- sections


def covariance(reps: int, old: Any) -> tuple[list[Row], dict[str, list[float]]]:
    rows, pools = [], {}
    for row_effect, label in ((0.0, "rows i.i.d."), (1.0, "row-correlated logprobs")):
        for b in SIZES:
            g = torch.Generator().manual_seed(100 + b)
            hit = undecided = old_hit = 0
            zs, old_zs = [], []
            for i in range(reps):
                lp, adv, mask = cov_batch(g, b, gamma=0.0, row_effect=row_effect)
                out = D.logprob_advantage_covariance(
                    logprobs=lp, advantages=adv, response_mask=mask, seed=i
                )
                hit += out.alarm
                undecided += not out.decided
                zs.append(out.z)
                if old is not None:
                    z = old.logprob_advantage_covariance(
                        logprobs=lp, advantages=adv, response_mask=mask
                    ).z
                    old_hit += abs(z) > 1.96
                    old_zs.append(z)
            if row_effect and b == 8:
                pools["cov z, B = 8"] = zs
                if old_zs:
                    pools["old cov z, B = 8"] = old_zs
            rows.append(
                Row(
                    "covariance",
                    f"null, {label}",
                    str(b),
                    0.05,
                    (*rate(hit, reps), undecided),
                    rate(old_hit, reps) if old is not None else None,
                )
            )
    # token-varying advantages (GAE-like): the clustered-t approximation, from 32 rows
    for b in (16, 32, 64, 128):
        g = torch.Generator().manual_seed(150 + b)
        hit = undecided = 0
        for i in range(reps):
            lp, adv, mask = cov_batch(g, b, gamma=0.0, row_effect=1.0)
            tok = adv[:, None] + 0.5 * torch.randn(mask.shape, generator=g, dtype=F64)
            out = D.logprob_advantage_covariance(
                logprobs=lp, advantages=tok, response_mask=mask, seed=i
            )
            hit += out.alarm
            undecided += not out.decided
        rows.append(
            Row(
                "covariance",
                "null, token-varying A (clustered-t), row-correlated",
                str(b),
                0.05,
                (*rate(hit, reps), undecided),
            )
        )
    g = torch.Generator().manual_seed(199)
    hit = old_hit = 0
    for i in range(reps):
        lp, adv, mask = cov_batch(g, 64, gamma=0.5, row_effect=1.0)
        hit += D.logprob_advantage_covariance(
            logprobs=lp, advantages=adv, response_mask=mask, seed=i
        ).alarm
        if old is not None:
            z = old.logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask).z
            old_hit += z > 1.645  # one-sided at 0.05, as the new test
    rows.append(
        Row(
            "covariance",
            "power, A += 0.5 (row mean log pi - mean)",
            "64",
            None,
            (*rate(hit, reps), 0),
            rate(old_hit, reps) if old is not None else None,
        )
    )
    return rows, pools


def length(reps: int, old: Any, pool: int) -> tuple[list[Row], dict[str, list[float]]]:
    rows, pools = [], {}
    for prompts, label in ((0, "A ~ N(0, 1), no groups"), (2, "two prompt groups (GRPO)")):
        for b in SIZES if not prompts else (8, 16, 64, 128):
            g = torch.Generator().manual_seed(200 + b + prompts)
            hit = undecided = old_hit = 0
            for i in range(reps):
                adv, mask, groups = length_batch(g, b, prompts=prompts)
                kw: dict[str, Any] = {"aggregation": "token-mean", "groups": groups}
                out = D.length_bias(advantages=adv, response_mask=mask, seed=i, **kw)
                hit += out.alarm
                undecided += not out.decided
                if old is not None:
                    old_hit += old.length_bias(advantages=adv, response_mask=mask, **kw).alarm
            rows.append(
                Row(
                    "length bias",
                    f"null, {label}",
                    str(b),
                    0.05,
                    (*rate(hit, reps), undecided),
                    rate(old_hit, reps) if old is not None else None,
                )
            )
    # the z's themselves at the example's shape: variance and P(|z| > 1.96)
    g = torch.Generator().manual_seed(264)
    new_z, old_z = [], []
    for i in range(pool):
        adv, mask, _ = length_batch(g, 64)
        new_z.append(
            D.length_bias(advantages=adv, response_mask=mask, aggregation="token-mean", seed=i).z
        )
        if old is not None:
            old_z.append(
                old.length_bias(advantages=adv, response_mask=mask, aggregation="token-mean").z
            )
    pools["length z, B = 64"] = new_z
    if old is not None:
        pools["old length z, B = 64"] = old_z
    g = torch.Generator().manual_seed(208)
    small, old_small = [], []
    for i in range(pool):
        adv, mask, _ = length_batch(g, 8)
        kw8: dict[str, Any] = {"advantages": adv, "response_mask": mask}
        small.append(D.length_bias(**kw8, aggregation="token-mean", seed=i).z)
        if old is not None:
            old_small.append(old.length_bias(**kw8, aggregation="token-mean").z)
    pools["length z, B = 8"] = small
    if old is not None:
        pools["old length z, B = 8"] = old_small
    for name, zs in (("new", new_z), ("old", old_z)):
        if zs:
            z = torch.tensor(zs, dtype=F64)
            print(
                f"  length z at B = 64, L ~ U(16..64), {len(zs)} draws ({name}): variance "
                f"{float(z.var()):.3f} (se {float(z.var()) * math.sqrt(2 / len(zs)):.3f}), "
                f"P(|z| > 1.96) = {float((z.abs() > 1.96).double().mean()):.4f}"
            )
    for beta in (0.25,):
        g = torch.Generator().manual_seed(265)
        hit = old_hit = 0
        for i in range(reps):
            adv, mask, _ = length_batch(g, 64, beta=beta)
            hit += D.length_bias(
                advantages=adv, response_mask=mask, aggregation="token-mean", seed=i
            ).alarm
            if old is not None:
                old_hit += old.length_bias(
                    advantages=adv, response_mask=mask, aggregation="token-mean"
                ).alarm
        rows.append(
            Row(
                "length bias",
                f"power, A = {beta} z_L + N(0, 1)",
                "64",
                None,
                (*rate(hit, reps), 0),
                rate(old_hit, reps) if old is not None else None,
            )
        )
    return rows, pools


def mismatch(reps: int, old: Any) -> list[Row]:
    rows = []
    boundary: dict[str, Any] = {"margin": 1.0, "atol": 0.0}
    for share, label in ((0.0, "token noise i.i.d."), (0.5, "half the noise shared by a row")):
        for b in SIZES:
            g = torch.Generator().manual_seed(300 + b + int(10 * share))
            hit = undecided = old_hit = 0
            for i in range(reps):
                tr, ro, rs, mask = mismatch_batch(g, b, row_share=share)
                kw: dict[str, Any] = {
                    "trainer_logprobs": tr,
                    "rollout_logprobs": ro,
                    "rescored_logprobs": rs,
                    "response_mask": mask,
                    "alpha": 0.05,
                }
                out = D.logprob_mismatch(**kw, **boundary, seed=i)
                hit += out.alarm
                undecided += not out.decided
                if old is not None:
                    old_hit += old.logprob_mismatch(**kw).alarm
            rows.append(
                Row(
                    "mismatch",
                    f"null boundary (margin 1, atol 0), {label}",
                    str(b),
                    0.05,
                    (*rate(hit, reps), undecided),
                    rate(old_hit, reps) if old is not None else None,
                )
            )
    cases: list[tuple[str, str, float | None, Callable[[torch.Generator], Any]]] = [
        (
            "null: rollout 5% noisier, 32k tokens (defaults, alpha 1e-3)",
            "512",
            1e-3,
            lambda g: mismatch_batch(g, 512, rollout=1.05, full=True),
        ),
        ("null: bitwise rescore, rollout +-1e-6 (defaults)", "64", 1e-3, None),  # type: ignore[list-item]
        (
            "power: rollout 1.5x, exact trainer (the example)",
            "64",
            None,
            lambda g: mismatch_batch(g, 64, rollout=1.5, trainer=0.0),
        ),
        (
            "power: rollout 1.5x, trainer noisy too",
            "64",
            None,
            lambda g: mismatch_batch(g, 64, rollout=1.5),
        ),
        (
            "power: rollout 1.5x, trainer noisy too (margin 1, atol 0)",
            "64",
            None,
            lambda g: mismatch_batch(g, 64, rollout=1.5),
        ),
        (
            "power: rollout 1.5x, exact trainer",
            "16",
            None,
            lambda g: mismatch_batch(g, 16, rollout=1.5, trainer=0.0),
        ),
        (
            "power: rollout 1.5x, trainer noisy too (margin 1, atol 0)",
            "16",
            None,
            lambda g: mismatch_batch(g, 16, rollout=1.5),
        ),
    ]
    for case, size, nominal, make in cases:
        g = torch.Generator().manual_seed(390 + len(rows))
        n = max(20, reps // 10) if size == "512" else reps
        hit = undecided = old_hit = 0
        for i in range(n):
            if make is None:
                tr, _, _, mask = mismatch_batch(g, 64)
                ro = tr + 1e-6 * torch.randn(tr.shape, generator=g, dtype=F64)
                rs = tr.clone()
            else:
                tr, ro, rs, mask = make(g)
            kw = {
                "trainer_logprobs": tr,
                "rollout_logprobs": ro,
                "rescored_logprobs": rs,
                "response_mask": mask,
            }
            options = boundary if "margin 1" in case else {}
            out = D.logprob_mismatch(**kw, **options, seed=i)
            hit += out.alarm
            undecided += not out.decided
            if old is not None:
                old_hit += old.logprob_mismatch(**kw).alarm
        rows.append(
            Row(
                "mismatch",
                case,
                size,
                nominal,
                (*rate(hit, n), undecided),
                rate(old_hit, n) if old is not None else None,
            )
        )
    return rows


def trend(reps: int, old: Any) -> list[Row]:
    rows = []
    for phi in (0.0, 0.5, 0.8):
        for n in (30, 100, 200):
            g = torch.Generator().manual_seed(400 + n + int(10 * phi))
            xs = ar1(g, reps, n, phi)
            hit = undecided = old_hit = 0
            for i in range(reps):
                out = D.entropy_trend(xs[i], seed=i)
                hit += out.alarm
                undecided += not out.decided
                if old is not None:
                    old_hit += old.entropy_trend(xs[i], seed=i).alarm
            rows.append(
                Row(
                    "changepoint",
                    f"null, AR(1) phi = {phi}",
                    f"n={n}",
                    0.05,
                    (*rate(hit, reps), undecided),
                    rate(old_hit, reps) if old is not None else None,
                )
            )
    for phi, n in ((0.0, 30), (0.0, 100), (0.5, 100), (0.5, 200)):
        g = torch.Generator().manual_seed(450 + n + int(10 * phi))
        xs = ar1(g, reps, n, phi) * math.sqrt(1 - phi * phi)  # unit marginal variance
        xs[:, n // 2 :] -= 1.0
        hit = old_hit = exch = 0
        for i in range(reps):
            hit += D.entropy_trend(xs[i], seed=i).alarm
            exch += D.entropy_trend(xs[i], seed=i, dependence="exchangeable").alarm
            if old is not None:
                old_hit += old.entropy_trend(xs[i], seed=i).alarm
        rows.append(
            Row(
                "changepoint",
                f"power, 1-sd drop at n/2, AR(1) phi = {phi}",
                f"n={n}",
                None,
                (*rate(hit, reps), 0),
                rate(old_hit, reps) if old is not None else None,
            )
        )
        rows.append(
            Row(
                "changepoint",
                f"  (dependence='exchangeable', phi = {phi})",
                f"n={n}",
                None,
                (*rate(exch, reps), 0),
            )
        )
    return rows


def entropy(reps: int) -> list[Row]:
    rows = []
    for b in (2, *SIZES):
        g = torch.Generator().manual_seed(500 + b)
        inside = normal = 0
        for _ in range(reps):
            mask = torch.arange(16)[None] < torch.randint(1, 17, (b, 1), generator=g)
            logits = 1.5 * torch.randn((b, 16, 12), generator=g, dtype=F64)
            probs = torch.softmax(logits, dim=-1).reshape(-1, 12)
            tok = torch.multinomial(probs, 1, generator=g).reshape(b, 16, 1)
            lp = torch.log_softmax(logits, dim=-1).gather(-1, tok).squeeze(-1)
            exact = D.entropy_from_logits(logits=logits, response_mask=mask).mean
            est = D.entropy_from_logprobs(logprobs=lp, response_mask=mask)
            lo, hi = est.interval(0.95)
            inside += not lo <= exact <= hi
            normal += abs(est.mean - exact) > 1.96 * est.stderr
        rows.append(
            Row(
                "entropy",
                "interval misses the exact entropy (1 - coverage)",
                str(b),
                0.05,
                (*rate(inside, reps), 0),
                rate(normal, reps),
            )
        )
    return rows


def ess(reps: int) -> None:
    """Mean ESS/n against exp(-sigma^2) at n = 16,384 (the finite-n bias)."""
    n = 16_384
    for sigma in (0.5, 1.0, 1.5, 2.0):
        g = torch.Generator().manual_seed(600 + int(10 * sigma))
        vals = torch.tensor(
            [
                D.importance_ess(
                    trainer_logprobs=sigma * torch.randn((128, 128), generator=g, dtype=F64),
                    rollout_logprobs=torch.zeros((128, 128), dtype=F64),
                    response_mask=torch.ones((128, 128), dtype=torch.bool),
                ).token
                for _ in range(reps)
            ],
            dtype=F64,
        )
        target = D.lognormal_ess(sigma)
        bias = float(vals.mean()) / target - 1.0
        se = float(vals.std()) / math.sqrt(reps) / target
        print(
            f"  ESS/n at sigma = {sigma}, n = {n}: mean {float(vals.mean()):.5f} vs "
            f"exp(-sigma^2) = {target:.5f}: bias {bias:+.1%} (se {se:.1%})"
        )


def monitor(pools: dict[str, list[float]], runs: int) -> list[Row]:
    rows = []
    g = torch.Generator().manual_seed(700)
    for horizon in HORIZONS:
        n_runs = runs
        t5 = torch.randn((6, n_runs, horizon), generator=g, dtype=F64)
        t5 = t5[0] / torch.sqrt(t5[1:].square().mean(dim=0))
        p5 = torch.tensor(
            [1.0 - D._common.student_t_cdf(x, 5) for x in t5.flatten().tolist()], dtype=F64
        )
        inputs: dict[str, tuple[torch.Tensor, str]] = {
            "N(0, 1) inputs": (torch.randn((n_runs, horizon), generator=g, dtype=F64), "both"),
            "unit-variance t_5 as z (shown)": (t5 / math.sqrt(5 / 3), "both"),
            "t_5 as p-values (kind='p_value')": (
                -torch.special.ndtri(p5.clamp(1e-300, 1.0).reshape(n_runs, horizon)),
                "up",
            ),
        }
        for name, zs in pools.items():
            pool = torch.tensor(zs, dtype=F64)
            pick = torch.randint(0, pool.numel(), (n_runs, horizon), generator=g)
            inputs[f"library {name} ({pool.numel()} null draws)"] = (
                pool[pick],
                "both" if "length" in name else "up",
            )
        for name, (z, direction) in inputs.items():
            for alpha in (0.05, 0.01):
                mon = D.RunMonitor(
                    [D.MonitoredStatistic("z", direction=direction)], horizon=horizon, alpha=alpha
                )
                over = D.cusum_paths(z, drift=mon.drift).gt(mon.threshold).any(dim=-1)
                if direction == "both":
                    over |= D.cusum_paths(-z, drift=mon.drift).gt(mon.threshold).any(dim=-1)
                hits = int(over.sum())
                old = name.startswith("library old")
                rows.append(
                    Row(
                        "monitor",
                        f"{name.replace('old ', '')}, {direction}",
                        f"{horizon}@{alpha:g}",
                        alpha,
                        None if old else (*rate(hits, n_runs), 0),
                        rate(hits, n_runs) if old else None,
                        claimed="(shown)" not in name,
                    )
                )
    return rows


# ----------------------------------------------------------------------------- report


def show(rows: list[Row]) -> None:
    print(
        f"{'detector':<12} {'case':<58} {'B':>6} {'nominal':>7}  {'now (se)':>17} "
        f"{'undec':>5}  {'before (se)':>17}  verdict"
    )
    for r in rows:
        now = "-" if r.new is None else f"{r.new[0]:.4f} ({r.new[1]:.4f})"
        und = "-" if r.new is None else str(r.new[2])
        before = "-" if r.old is None else f"{r.old[0]:.4f} ({r.old[1]:.4f})"
        nominal = "power" if r.nominal is None else f"{r.nominal:g}"
        verdict = ""
        if r.nominal is not None and r.new is not None:
            verdict = "ok" if r.new[0] <= r.nominal + 2 * r.new[1] else "OVER"
            if not r.claimed:
                verdict = f"({verdict}: not claimed)"
        print(
            f"{r.section:<12} {r.case:<58} {r.size:>6} {nominal:>7}  {now:>17} {und:>5}  "
            f"{before:>17}  {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000, help="replicates per null cell")
    parser.add_argument("--quick", action="store_true", help="a quarter of every count")
    parser.add_argument("--no-old", action="store_true", help=f"skip the code of {BASE}")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this section (repeatable; the monitor needs covariance and length)",
    )
    args = parser.parse_args()
    only = set(args.only or SECTIONS)
    if "monitor" in only:
        only |= {"covariance", "length"}
    torch.set_num_threads(1)
    reps = args.reps // 4 if args.quick else args.reps
    old = None if args.no_old else load_old(BASE)
    started = time.perf_counter()
    rows: list[Row] = []
    pools: dict[str, list[float]] = {}

    def run(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        print(f"[{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
        return out

    if "covariance" in only:
        cov_rows, cov_pools = run("covariance", lambda: covariance(reps // 2, old))
        rows += cov_rows
        pools |= cov_pools
    if "length" in only:
        len_rows, len_pools = run("length", lambda: length(reps, old, 2 * reps))
        rows += len_rows
        pools = len_pools | pools
    if "mismatch" in only:
        rows += run("mismatch", lambda: mismatch(reps, old))
    if "changepoint" in only:
        rows += run("changepoint", lambda: trend(reps // 2, old))
    if "entropy" in only:
        rows += run("entropy", lambda: entropy(reps))
    if "ess" in only:
        run("ess", lambda: ess(2 * reps))
    if "monitor" in only:
        rows += run("monitor", lambda: monitor(pools, 2 * reps))
    print()
    show(rows)
    print(
        f"\nwall time {time.perf_counter() - started:.0f} s (reps {reps}, old code: "
        f"{'yes, ' + BASE if old is not None else 'no'})"
    )


if __name__ == "__main__":
    main()
