"""A synthetic 200-step RL run with three injected pathologies, diagnosed step by step.

Every step draws a batch of 64 responses (lengths 16..64) from a softmax policy over 16
tokens and computes what a training loop already has: sampled-token logprobs from the
trainer, the rollout engine and a second trainer pass at another batch shape, sequence
advantages, and the logits. Injected (``INJECT``):

- step 60, rollout/trainer drift: the rollout engine's logprob noise grows from the
  trainer's own re-scoring noise (sd 0.01 against the first pass) to 1.5x it, and 1 token
  in 2,000 is off by a log-ratio of +-3 (a "catastrophic" token);
- step 110, entropy collapse: advantages start to reward confident rows
  (``A += 2 * (mean log pi of the row - batch mean)``) and the logits sharpen;
- step 150, length bias: advantages start to reward long responses (``A += z_L``).

The monitored z statistics (mismatch sign test, ``Cov(log pi, A)``, length drive) go to
one ``RunMonitor`` (CUSUM, P(any false alarm in the 200 steps) <= 0.01); the entropy
series gets the permutation changepoint test. Each detector must fire within
``WINDOW`` steps of its injection and stay quiet before it
(``tests/reference/diagnostics/test_example.py``). Run
``python examples/diagnose_run.py --out DIR`` to
also save ``DIR/diagnose_run.png`` (needs the ``plot`` extra: matplotlib).

Two things the output shows that are not faults (measured over seeds 0-11):

- The CUSUM panel is a saw-tooth: a side restarts at 0 after each alarm and, while its
  change lasts, climbs back over ``h`` a few steps later and alarms again. A run has
  58-60 alarms (36 of the mismatch side, 11-12 of each of the other two), spaced, not
  one per step; only the first alarm of each statistic is its detection.
- The changepoint test on the 110 no-change steps has level 0.05, so about 1 seed in 20
  should fire there: of seeds 0-11, seed 3 does (p = 0.020) and its changepoint verdict
  reads "false alarm before the change"; the others give p between 0.125 and 0.835.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import torch

from polgrad_reference import PolicyLossConfig
from polgrad_reference import diagnostics as D

STEPS = 200
INJECT = {"mismatch": 60, "entropy": 110, "length": 150}
WINDOW = 10
"""A detector 'fires at its injection point' when it fires in ``[inject, inject + WINDOW]``;
the entropy changepoint estimate must lie in ``[inject, inject + 2 * WINDOW]``."""
MONITORED = {"mismatch": "mismatch/z", "entropy": "entropy_cov/z", "length": "length/z"}
INJECTED_BY = {stat: name for name, stat in MONITORED.items()}
LABELS = {
    "mismatch/z": "mismatch z",
    "ess/token": "token ESS/n",
    "entropy/mean": "exact entropy (from the logits)",
    "entropy_sampled/mean": "sampled entropy (-log pi of the sampled tokens)",
    "entropy_cov/z": "Cov(log pi, A) z",
    "length/drive": "length drive D",
    "cusum/mismatch/z/up": "mismatch: rollout drifts from the trainer",
    "cusum/entropy_cov/z/up": "Cov(log pi, A): entropy being drained",
    "cusum/length/z/up": "length drive: towards long",
    "cusum/length/z/down": "length drive: towards short",
}
"""Legend text for each plotted series key."""
B, T, V = 64, 64, 16
NOISE = 0.01


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Per-step series, the monitor's report and the entropy changepoint tests."""

    series: dict[str, list[float]]
    monitor: D.MonitorReport
    first_alarm: dict[str, int | None]
    entropy_full: D.ChangepointTest
    entropy_before: D.ChangepointTest
    last: dict[str, D.DiagnosticResult]


def _sharpness(step: int) -> float:
    start = INJECT["entropy"]
    return 1.0 if step < start else 1.0 + 2.5 * (1.0 - math.exp(-(step - start) / 8.0))


def synthetic_step(step: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One step's tensors, float64, with the pathologies active from their steps on."""
    lengths = torch.randint(16, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    logits = _sharpness(step) * torch.randn((B, T, V), generator=g, dtype=torch.float64)
    logp = torch.log_softmax(logits, dim=-1)
    gumbel = -torch.log(-torch.log(torch.rand((B, T, V), generator=g, dtype=torch.float64)))
    tokens = torch.argmax(logp + gumbel, dim=-1, keepdim=True)  # Gumbel-max: a draw from softmax
    true_lp = logp.gather(-1, tokens).squeeze(-1)

    def noisy(sd: float) -> torch.Tensor:
        return true_lp + sd * torch.randn((B, T), generator=g, dtype=torch.float64)

    drift = step >= INJECT["mismatch"]
    trainer, rescored = true_lp, noisy(NOISE)  # the trainer's logprobs are the policy's
    rollout = noisy(1.5 * NOISE if drift else NOISE)
    if drift:
        hit = torch.rand((B, T), generator=g) < 1 / 2000
        sign = torch.where(torch.rand((B, T), generator=g) < 0.5, -1.0, 1.0).double()
        rollout = torch.where(hit, rollout + 3.0 * sign, rollout)

    adv = torch.randn(B, generator=g, dtype=torch.float64)
    if step >= INJECT["entropy"]:
        row_lp = torch.where(mask, trainer, 0.0).sum(dim=1) / lengths
        adv = adv + 2.0 * (row_lp - row_lp.mean())
    if step >= INJECT["length"]:
        ell = lengths.double()
        adv = adv + (ell - ell.mean()) / ell.std(correction=0)
    return {
        "response_mask": mask,
        "logits": logits,
        "trainer": trainer,
        "rollout": rollout,
        "rescored": rescored,
        "advantages": adv,
    }


def diagnose_step(x: dict[str, torch.Tensor], step: int = 0) -> dict[str, D.DiagnosticResult]:
    """Every detector on one step's tensors; the randomization tests draw their
    rearrangements from ``seed=step``, independent from step to step (what the monitor's
    bound needs of their z's)."""
    mask, tr, ro, adv = x["response_mask"], x["trainer"], x["rollout"], x["advantages"]
    return {
        "ess": D.importance_ess(trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask),
        "mismatch": D.logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            rescored_logprobs=x["rescored"],
            response_mask=mask,
            seed=step,
        ),
        "clip": D.clip_report(
            PolicyLossConfig(), logprobs=tr, old_logprobs=ro, advantages=adv, response_mask=mask
        ),
        "entropy_exact": D.entropy_from_logits(logits=x["logits"], response_mask=mask),
        "entropy_sampled": D.entropy_from_logprobs(logprobs=tr, response_mask=mask),
        "cov": D.logprob_advantage_covariance(
            logprobs=tr, advantages=adv, response_mask=mask, seed=step
        ),
        "length": D.length_bias(
            advantages=adv, response_mask=mask, aggregation="token-mean", seed=step
        ),
    }


def run(seed: int = 0) -> RunResult:
    """Simulate and diagnose the whole run (deterministic for a given seed)."""
    g = torch.Generator().manual_seed(seed)
    monitor = D.RunMonitor(
        [
            D.MonitoredStatistic(MONITORED["mismatch"], direction="up"),
            D.MonitoredStatistic(MONITORED["entropy"], direction="up"),
            D.MonitoredStatistic(MONITORED["length"], direction="both"),
        ],
        horizon=STEPS,
        alpha=0.01,
    )
    series: dict[str, list[float]] = {}
    last: dict[str, D.DiagnosticResult] = {}
    for step in range(STEPS):
        last = diagnose_step(synthetic_step(step, g), step)
        metrics: dict[str, float] = {}
        for res in last.values():
            metrics |= res.as_metrics()
        metrics["entropy_sampled/mean"] = last["entropy_sampled"].as_metrics()["entropy/mean"]
        monitor.update({name: metrics[name] for name in MONITORED.values()})
        for side_name, side, s in monitor.report().cusum:
            metrics[f"cusum/{side_name}/{side}"] = s
        for key, value in metrics.items():
            series.setdefault(key, []).append(value)
    report = monitor.report()
    first = dict(report.first_alarm)
    entropy = series["entropy/mean"]
    return RunResult(
        series=series,
        monitor=report,
        first_alarm={k: first[name] for k, name in MONITORED.items()},
        entropy_full=D.entropy_trend(entropy, seed=seed),
        entropy_before=D.entropy_trend(entropy[: INJECT["entropy"]], seed=seed),
        last=last,
    )


def plot(result: RunResult, path: Path) -> Path | None:
    """Each statistic over steps with the injection points (dashed) and the alarms
    (triangles); returns None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    s = result.series
    steps = list(range(STEPS))
    colors = {"mismatch": "tab:red", "entropy": "tab:purple", "length": "tab:green"}
    panels = [
        (
            "trainer vs rollout: mismatch z (row sign-flip test; above ~3.9 all 19,999 flips "
            "are beaten)",
            ["mismatch/z"],
            "mismatch",
        ),
        ("importance weights: token ESS/n", ["ess/token"], "mismatch"),
        ("entropy (nats/token)", ["entropy/mean", "entropy_sampled/mean"], "entropy"),
        ("Cov(log pi, A): z (permutation test)", ["entropy_cov/z"], "entropy"),
        ("length drive D under token-mean (band: 95% interval)", ["length/drive"], "length"),
        (
            "CUSUM per side: restarts at 0 after each alarm, hence the saw-tooth "
            "(dashed: threshold h; ticks: alarms)",
            [k for k in s if k.startswith("cusum/")],
            None,
        ),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 13), sharex=True)
    for ax, (title, keys, what) in zip(axes, panels, strict=True):
        for key in keys:
            ax.plot(steps, s[key], lw=1.2, label=LABELS.get(key, key))
        if what == "length":
            ax.fill_between(
                steps,
                s["length/ci_low"],
                s["length/ci_high"],
                alpha=0.25,
                lw=0,
                label="95% interval",
            )
        if what == "entropy" and keys[0] == "entropy/mean":
            cp = result.entropy_full.changepoint
            ax.axvline(cp, color="black", ls=":", lw=1.2, label=f"changepoint estimate (step {cp})")
        if what is None:
            ax.axhline(result.monitor.threshold, color="black", ls="--", lw=1)
            for each in result.monitor.alarms:
                name = INJECTED_BY[each.statistic]
                ax.plot(
                    [each.step], [result.monitor.threshold], marker="|", color=colors[name], ms=10
                )
        for name, step in INJECT.items():
            ax.axvline(step, color=colors[name], ls="--", lw=1)
            alarm = result.first_alarm[name]
            if alarm is not None and what in (name, None):
                y = result.monitor.threshold if what is None else s[keys[0]][alarm]
                ax.plot([alarm], [y], marker="v", color=colors[name], ms=9)
        ax.set_title(title, fontsize=10, loc="left")
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel(
        "step (dashed: injections - rollout drift 60, entropy collapse 110, length bias 150; "
        "triangles: first alarms)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def verdicts(result: RunResult) -> list[tuple[str, int, int | None, bool]]:
    """``(detector, injected at, first alarm, within window and quiet before)``; a
    changepoint alarm on the no-change steps is a false alarm of a level-0.05 test (about
    1 seed in 20: seed 3 of 0-11), reported as such by :func:`report`."""
    rows = []
    for name, inject in INJECT.items():
        first = result.first_alarm[name]
        ok = first is not None and inject <= first <= inject + WINDOW
        rows.append((f"monitor: {MONITORED[name]}", inject, first, ok))
    cp = result.entropy_full
    inject = INJECT["entropy"]
    ok = cp.alarm and not result.entropy_before.alarm
    ok = ok and inject <= cp.changepoint <= inject + 2 * WINDOW
    rows.append(("changepoint: entropy", inject, cp.changepoint if cp.alarm else None, ok))
    return rows


def report(result: RunResult, out: Path | None) -> int:
    """Print the verdict table and the summaries, save the plot under ``out``; 0 when every
    detector fired in its window and stayed quiet before it."""
    print(f"{'detector':<32} {'injected':>8} {'fired':>6}  verdict")
    rows = verdicts(result)
    for name, inject, fired, ok in rows:
        shown = "-" if fired is None else str(fired)
        verdict = "ok" if ok else "WRONG"
        if name.startswith("changepoint") and result.entropy_before.alarm:
            verdict = "false alarm before the change"
        print(f"{name:<32} {inject:>8} {shown:>6}  {verdict}")
    print(result.monitor.summary())
    alarms = result.monitor.alarms
    print(
        f"{len(alarms)} CUSUM alarms in all: a side restarts at 0 after each alarm and "
        "re-alarms while its change lasts\n  (the saw-tooth of the plot); the first alarm of "
        "each statistic is its detection"
    )
    print("entropy before the collapse:", result.entropy_before.summary())
    if result.entropy_before.alarm:
        print(
            "  the changepoint test fired on the no-change steps: a false alarm of a test at "
            f"level {result.entropy_before.level:g}, as about 1 seed in 20 should (seed 3 "
            "of seeds 0-11, p = 0.020)"
        )
    print("entropy over the run:       ", result.entropy_full.summary())
    print("last step:")
    for res in result.last.values():
        print("  " + res.summary())
    if out is not None:
        path = plot(result, out / "diagnose_run.png")
        print(f"plot: {path}" if path else "plot skipped: install the 'plot' extra (matplotlib)")
    return 0 if all(ok for *_, ok in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for the plot")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small tensors: threads only add synchronisation
    return report(run(args.seed), args.out)


if __name__ == "__main__":
    sys.exit(main())
