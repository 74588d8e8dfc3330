"""Diagnosis: which registered semantics does a function actually implement?

The function is evaluated on the canonical corpus and compared, within the engine's
tolerance model, against every point of a candidate space built from the loss algebra:
ratio kind x surrogate x clip range (each PPO-style clip also with verl's always-on dual
clip c = 3) x aggregation (including token-sum-norm with the batch's padded width as
budget, a known framework variant) x KL term, plus every registry entry's own loss. The
closest candidates are then refined along the KL estimator (k1/k2/k3 and any variant the
reference offers, e.g. straight-through "k3+") and the rollout IS correction. Candidates
are ranked by their worst error in units of tolerance; ``<= 1`` is a match.

Value and gradient are scored separately, so "the value matches but the gradient does not"
(a missing or misplaced stop-gradient) is a diagnosis of its own; and a match that differs
from the reference only in constants its source leaves unstated is reported as such, with
the marker line that declares the function's value.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import torch

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    ClipBounds,
    ClipConfig,
    KLEstimator,
    KLRatioWeight,
    PolgradError,
    PolicyLossConfig,
    PolicyLossOutput,
    RatioKind,
    SurrogateKind,
    Unstated,
)
from pytest_polgrad.core.calls import FunctionUnderTest, on_canonical_batch
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.snippets import config_source
from pytest_polgrad.core.tolerance import KINK_ULPS, Tolerance, unit_roundoff
from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.kinds.policy_loss.diagnose.clip_fit import (
    SIDES,
    bracket,
    intervals,
    linear,
    shortest,
)
from pytest_polgrad.kinds.policy_loss.diagnose.clip_fit import solve as solve_bounds
from pytest_polgrad.kinds.policy_loss.diagnose.divisor import Divisor, divisors_for, row_terms
from pytest_polgrad.kinds.policy_loss.oracle import Oracle, OracleResult

__all__ = [
    "Explanation",
    "Match",
    "closest",
    "describe_config",
    "diagnose",
    "explain",
    "holds_on",
    "registry_names",
]

DUAL_CLIP_C = 3.0
"""The dual-clip constant frameworks apply by default (verl 0.9.1 ``clip_ratio_c``)."""
_REFINE = 4
"""How many of the best first-pass candidates are refined along KL and IS variants."""


@dataclasses.dataclass(frozen=True)
class Match:
    """A candidate semantics and how far the function is from it (in tolerances)."""

    config: PolicyLossConfig
    error: float
    padded_width_budget: bool = False
    value_error: float = math.inf
    """Worst loss-value error over the corpus, in tolerances."""
    grad_error: float = math.inf
    """Worst gradient error over the corpus, in tolerances."""
    divisor: Divisor | None = None
    """The config's divisor shifted by a whole count (an off-by-one aggregation), if any."""

    @property
    def matches(self) -> bool:
        return self.error <= 1.0

    @property
    def value_matches(self) -> bool:
        return self.value_error <= 1.0

    def describe(self) -> str:
        text = describe_config(self.config)
        if self.padded_width_budget:
            text = text.replace(
                f"token-sum-norm (budget {self.config.budget})",
                "token-sum-norm dividing by the padded width T (a batch-dependent budget)",
            )
        names = registry_names(self.config)
        text += f" — {', '.join(names)}" if names else ""
        return text + (f", except that {self.divisor.describe()}" if self.divisor else "")


def describe_config(cfg: PolicyLossConfig) -> str:
    """One line naming every semantic choice of a loss config."""
    clip = cfg.clip
    parts = [cfg.aggregation.value + (f" (budget {cfg.budget})" if cfg.budget else "")]
    parts.append(f"{cfg.ratio.value} ratio")
    if cfg.surrogate in (SurrogateKind.PG_CLIP, SurrogateKind.CISPO):
        dual = f", dual-clip {clip.dual_clip:g}" if clip.dual_clip else ""
        if clip.bounds is ClipBounds.ABSOLUTE:
            lo = "0" if clip.low is None else f"{clip.low:g}"
            hi = "inf" if clip.high is None else f"{clip.high:g}"
            parts.append(f"{cfg.surrogate.value} ratio bounds [{lo}, {hi}] (absolute){dual}")
        else:
            lo = "none" if clip.eps_low is None else f"{clip.eps_low:g}"
            hi = "none" if clip.eps_high is None else f"{clip.eps_high:g}"
            parts.append(f"{cfg.surrogate.value} eps {lo}/{hi}{dual}")
    elif cfg.params is not None:
        fields = dataclasses.fields(cfg.params)
        values = ", ".join(f"{f.name}={_short(getattr(cfg.params, f.name))}" for f in fields)
        parts.append(f"{cfg.surrogate.value} ({values})")
    else:
        parts.append(cfg.surrogate.value)
    if cfg.kl_in_loss:
        assert cfg.kl is not None
        weight = cfg.kl.ratio_weight
        weighted = "" if weight is KLRatioWeight.NONE else f" ({weight.value} ratio-weighted)"
        parts.append(f"{cfg.kl.estimator.value} KL{weighted} x {cfg.kl.coef:g} in the loss")
    else:
        parts.append("no KL term")
    if cfg.is_correction is not None:
        c = cfg.is_correction
        parts.append(f"rollout IS {c.level.value} {c.mode.value}")
    return ", ".join(parts)


def _short(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def registry_names(cfg: PolicyLossConfig) -> list[str]:
    """Registry entries whose policy loss equals ``cfg``. A KL placed in the reward does
    not change the loss; an entry whose as-loss KL term is the only difference is named
    ``"<name> without its KL term"``."""
    out = []
    for name, spec in ALGORITHMS.items():
        loss = spec.loss if spec.loss.kl_in_loss else spec.loss.replace(kl=None)
        if loss == cfg:
            out.append(name)
        elif loss.kl_in_loss and loss.replace(kl=None) == cfg:
            out.append(f"{name} without its KL term")
    return out


# --------------------------------------------------------------------- candidate space


def _with_dual(clip: ClipConfig) -> ClipConfig | None:
    """``clip`` with the always-on dual clip, when that is a valid config."""
    if clip.dual_clip is not None:
        return None
    try:
        out: ClipConfig = clip.replace(dual_clip=DUAL_CLIP_C)
    except PolgradError:
        return None
    return out


def _unique(items: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item is not None and item not in out:
            out.append(item)
    return out


def _clips(target: PolicyLossConfig) -> list[ClipConfig]:
    base = [target.clip] + [spec.loss.clip for spec in ALGORITHMS.values()]
    base += [
        ClipConfig(0.2, 0.2),
        ClipConfig(0.2, 0.28),
        ClipConfig(0.1, 0.1),
        ClipConfig(0.3, 0.3),
        ClipConfig(None, 0.2),
        ClipConfig(None, 0.28),
    ]
    # eps_low and eps_high passed in each other's place (a swapped argument pair)
    base += [
        c.replace(eps_low=c.eps_high, eps_high=c.eps_low)
        for c in base
        if c.eps_low is not None and c.eps_high is not None and c.eps_low != c.eps_high
    ]
    return _unique([*base, *(_with_dual(c) for c in base)])


_CLASSIC_SURROGATES = (
    SurrogateKind.PG_CLIP,
    SurrogateKind.PG,
    SurrogateKind.REINFORCE,
    SurrogateKind.CISPO,
)
_CLASSIC_RATIOS = (RatioKind.TOKEN, RatioKind.SEQUENCE, RatioKind.SEQUENCE_TOKEN)


class _Takes(Protocol):
    """What the candidate space reads of a function under test: the optional tensors it
    takes (:class:`FunctionUnderTest` has both)."""

    @property
    def takes_ref(self) -> bool: ...

    @property
    def takes(self) -> tuple[str, ...]: ...


def _usable(cfg: PolicyLossConfig, fut: _Takes) -> bool:
    """A candidate needs only the tensors the function receives."""
    if cfg.kl_in_loss and not fut.takes_ref:
        return False
    return cfg.is_correction is None or "rollout_logprobs" in fut.takes


def _registry_losses(fut: _Takes) -> list[PolicyLossConfig]:
    """Every registry entry's loss (its as-loss KL dropped when the function cannot
    receive ``ref_logprobs``, its IS correction when it cannot receive rollout ones)."""
    out = []
    for spec in ALGORITHMS.values():
        loss = spec.loss if spec.loss.kl_in_loss else spec.loss.replace(kl=None)
        if loss.kl_in_loss and not fut.takes_ref:
            loss = loss.replace(kl=None)
        if not _usable(loss, fut):
            loss = _replace(loss, is_correction=None) or loss
        if _usable(loss, fut):
            out.append(loss)
    return _unique(out)


def _with_bounds(cfg: PolicyLossConfig, bounds: Mapping[str, Any]) -> PolicyLossConfig | None:
    """``cfg`` with the clip bounds named (``eps_low`` / ``eps_high``) set as given."""
    try:
        clip: ClipConfig = cfg.clip.replace(**bounds)
    except PolgradError:
        return None
    return _replace(cfg, clip=clip)


def _replace(cfg: PolicyLossConfig, **changes: Any) -> PolicyLossConfig | None:
    try:
        out: PolicyLossConfig = cfg.replace(**changes)
    except PolgradError:
        return None
    return out


def _with_aggregation(cfg: PolicyLossConfig, agg: Aggregation) -> PolicyLossConfig | None:
    budget = cfg.budget if agg is Aggregation.TOKEN_SUM_NORM else None
    if agg is Aggregation.TOKEN_SUM_NORM and budget is None:
        budget = 1  # placeholder, replaced per batch by the padded width
    return _replace(cfg, aggregation=agg, budget=budget)


def _first_pass(target: PolicyLossConfig, fut: FunctionUnderTest) -> tuple[PolicyLossConfig, ...]:
    """The classic loss algebra (ratio x PPO-clip/PG/REINFORCE/CISPO x clip x aggregation
    x KL on/off), then every other surrogate the reference offers and every registry
    loss, each under every aggregation. It depends on the function only through the
    optional tensors it takes, so it is built once per (target, those) in a process (some
    six hundred validated configs, about 5 ms to build)."""
    return _first_pass_of(target, fut.takes_ref, "rollout_logprobs" in fut.takes)


@functools.lru_cache(maxsize=64)
def _first_pass_of(
    target: PolicyLossConfig, takes_ref: bool, takes_rollout: bool
) -> tuple[PolicyLossConfig, ...]:
    return tuple(_generate_first_pass(target, _Inputs(takes_ref, takes_rollout)))


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The optional tensors a function takes, as the candidate space reads them."""

    takes_ref: bool
    takes_rollout: bool

    @property
    def takes(self) -> tuple[str, ...]:
        return ("rollout_logprobs",) if self.takes_rollout else ()


def _generate_first_pass(target: PolicyLossConfig, fut: _Takes) -> Iterator[PolicyLossConfig]:
    kls = [target.kl, None] if target.kl_in_loss else [None]
    for ratio, surr, clip, agg, kl in itertools.product(
        _CLASSIC_RATIOS, _CLASSIC_SURROGATES, _clips(target), Aggregation, kls
    ):
        if surr in (SurrogateKind.PG, SurrogateKind.REINFORCE) and clip != target.clip:
            continue  # the clip does not enter these surrogates
        if clip.dual_clip is not None and surr is not SurrogateKind.PG_CLIP:
            continue  # the dual clip bounds the PPO-clip surrogate only
        base = _replace(target, ratio=ratio, surrogate=surr, clip=clip, kl=kl)
        cfg = None if base is None else _with_aggregation(base, agg)
        if cfg is not None:
            yield cfg
    others = [_replace(target, surrogate=s) for s in SurrogateKind if s not in _CLASSIC_SURROGATES]
    for base in [*others, *_registry_losses(fut)]:
        if base is None:
            continue
        for agg in Aggregation:
            cfg = _with_aggregation(base, agg)
            if cfg is not None:
                yield cfg
        if base.kl_in_loss:
            yield from filter(None, [_replace(base, kl=None)])


def _refinements(cfg: PolicyLossConfig, target: PolicyLossConfig) -> Iterator[PolicyLossConfig]:
    """Variants of one candidate: KL estimator x ratio weighting, absolute clip bounds
    (TRL's CISPO cap), and the rollout IS corrections the registry knows."""
    if target.kl is not None and target.kl_in_loss:
        for est, weight in itertools.product(KLEstimator, KLRatioWeight):
            kl = _replace_kl(target, estimator=est, ratio_weight=weight)
            if kl is not None:
                new = _replace(cfg, kl=kl)
                if new is not None:
                    yield new
    if cfg.surrogate is SurrogateKind.CISPO and cfg.clip.bounds is ClipBounds.RELATIVE:
        absolute = _replace(
            cfg, clip=ClipConfig(None, cfg.clip.eps_high, bounds=ClipBounds.ABSOLUTE)
        )
        if absolute is not None:
            yield absolute
    if target.is_correction is not None:
        for spec in ALGORITHMS.values():
            corr = spec.loss.is_correction
            if corr is not None:
                new = _replace(cfg, is_correction=corr)
                if new is not None:
                    yield new
        none = _replace(cfg, is_correction=None)
        if none is not None:
            yield none


def _replace_kl(target: PolicyLossConfig, **changes: Any) -> Any:
    assert target.kl is not None
    try:
        return target.kl.replace(**changes)
    except PolgradError:
        return None


def _terms(out: PolicyLossOutput) -> tuple[float, float]:
    """``(policy term, KL term)`` of a reference output: its loss is their sum."""
    kl = out.kl_loss
    return float(out.policy_loss), 0.0 if kl is None else float(kl)


_SIGN_RTOL = {torch.float64: 1e-6, torch.float32: 1e-2}
"""How closely the per-batch KL coefficients must agree: a float32 loss moves the fitted
coefficient by about ``u |loss| / |KL term|`` (1e-4 on the corpus); half precision cannot
tell (no claim is made)."""


def _negated_kl(target: PolicyLossConfig, scorer: _Scorer) -> float | None:
    """``c < 0`` with ``loss = policy term + c * KL term`` of ``target`` on every corpus
    batch: the function's KL term enters with the opposite sign (which no config can
    express, a KL coefficient being >= 0); None otherwise."""
    rtol = _SIGN_RTOL.get(scorer.tolerance.input_dtype)
    if not target.kl_in_loss or target.kl is None or rtol is None:
        return None
    unit = target.replace(kl=target.kl.replace(coef=1.0))
    try:
        coef = scorer.solve(lambda name: scorer.terms(unit, name), rtol=rtol)
    except PolgradError:
        return None
    return coef if coef is not None and coef < 0 else None


# --------------------------------------------------------------------------- scoring


def _observe(
    fut: FunctionUnderTest, corpus: Mapping[str, Mapping[str, torch.Tensor]]
) -> dict[str, tuple[float, torch.Tensor]]:
    observed: dict[str, tuple[float, torch.Tensor]] = {}
    for name, batch in corpus.items():
        with on_canonical_batch(name):
            ev = fut.call(batch)
        assert ev.grad is not None
        observed[name] = (float(ev.loss), ev.grad.to(torch.float64))
    return observed


_Key = tuple[PolicyLossConfig, bool, "Divisor | None"]
"""A candidate's identity in one ranking: config, padded-width budget, shifted divisor."""
_T = TypeVar("_T")


def _key(m: Match) -> _Key:
    return m.config, m.padded_width_budget, m.divisor


@functools.lru_cache(maxsize=4096)
def _with_budget(cfg: PolicyLossConfig, budget: int) -> PolicyLossConfig:
    """``cfg`` with the token-sum budget ``budget`` (a batch's padded width), once per
    process: every diagnosis scores the same candidates on the same corpus widths."""
    return cfg.replace(budget=budget)


def _padded_options(cfg: PolicyLossConfig) -> list[bool]:
    """A token-sum-norm candidate is also tried with the padded width as budget (only so,
    for the placeholder budget 1)."""
    if cfg.aggregation is not Aggregation.TOKEN_SUM_NORM:
        return [False]
    return [True] if cfg.budget == 1 else [False, True]


class _ReferenceCache:
    """Reference results on the canonical corpus, shared by every diagnosis in the process.

    They depend on the candidate config, the corpus (input dtype, advantages layout), the
    batch and the kink band only, never on the function under test, so the second failing
    function diagnosed around the same reference costs a fraction of the first. Bounded:
    the least recently used entries are dropped past ``size`` (an entry holds a few
    ``[B, T]`` tensors of a corpus batch, at most 4 x 10: about 1 KB on average). A
    :class:`PolgradError` is remembered and raised again. The reference library is taken
    as fixed for the process: code that patches it and then diagnoses clears the cache
    (``_REFERENCES.clear()``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._store: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.computed = collections.Counter[str]()
        """Evaluations made, by kind (``"call"`` is one with the gradient)."""

    def get(self, key: tuple[Any, ...], compute: Callable[[], _T]) -> _T:
        with self._lock:
            found = key in self._store
            if found:
                self._store.move_to_end(key)
                out = self._store[key]
        if not found:
            try:
                out = compute()
            except PolgradError as exc:
                out = exc
            with self._lock:
                self.computed[key[0]] += 1
                self._store[key] = out
                while len(self._store) > self.size:
                    self._store.popitem(last=False)
        if isinstance(out, PolgradError):
            raise out
        return out  # type: ignore[no-any-return]

    def clear(self) -> None:
        with self._lock:
            self._store.clear()
            self.computed.clear()


_REFERENCES = _ReferenceCache(20_000)
"""The process's reference results on the corpus (one diagnosis makes about 5 000)."""


class _Scorer:
    """Candidate scoring on the corpus for one diagnosis, with the least reference work that
    yields the ranking full scoring would.

    - Every reference evaluation (value; value and gradient; bare loss, terms or row
      contributions) goes through :data:`_REFERENCES`: refinements, fitted constants,
      shifted divisors and rescoring revisit configs already evaluated, and so does the
      next diagnosis around the same reference.
    - Values are scored first, in corpus order, up to the first batch that misses (the
      recorded value error is that prefix's worst); the gradient only for a value match.
    - A value match's gradient is scored batch by batch, the batch that has rejected the
      most candidates so far first, and stops at the first batch that rejects it: its
      ``grad_error`` is then a lower bound above 1 and the candidate is *pending*.
      :meth:`settle` completes exactly the pending candidates that can reach a given head
      of a ranking. Completing only raises an error, and ties fall back to the order the
      candidates were generated in (:meth:`by_error`, :meth:`by_rank`), so every decision
      taken on a settled head is the one exact scores give.
    """

    def __init__(
        self,
        corpus: Mapping[str, Mapping[str, torch.Tensor]],
        observed: Mapping[str, tuple[float, torch.Tensor]],
        tolerance: Tolerance,
        advantages: str,
    ) -> None:
        self.corpus, self.observed, self.tolerance = corpus, observed, tolerance
        self._where = (tolerance.input_dtype, advantages)
        """What the corpus batches depend on (:func:`canonical_corpus`)."""
        self._fits: dict[PolicyLossConfig, PolicyLossConfig | None] = {}
        self._misplaced: dict[PolicyLossConfig, list[tuple[str, float, float]]] = {}
        self.read_off: dict[PolicyLossConfig, tuple[dict[str, tuple[float, float]], int]] = {}
        """Each config whose clip bounds were read off the function: the bracket each bound
        was solved in, and how many shorter writings of the same solution precede it
        (:meth:`fitted_clips`)."""
        self._alive: list[Match] = []
        self._seq: dict[int, int] = {}
        """``id(match)`` -> generation order (every match stays alive in ``_alive``)."""
        self._pending: dict[_Key, tuple[str, ...]] = {}
        """Batches whose gradient a pending candidate has not been scored on."""
        self._done: dict[_Key, Match] = {}
        """Completed pending candidates (lists built earlier hold the pending form)."""
        self._rejects = dict.fromkeys(corpus, 0)

    # -- reference evaluations, shared through _REFERENCES

    def value(self, cfg: PolicyLossConfig, name: str) -> tuple[float, float, int]:
        """:meth:`Oracle.value` on corpus batch ``name``."""
        batch = self.corpus[name]
        return _REFERENCES.get(("value", cfg, *self._where, name), lambda: Oracle(cfg).value(batch))

    def loss(self, cfg: PolicyLossConfig, name: str) -> float:
        """``cfg``'s reference loss on ``name`` (:meth:`value`'s first field, without its
        scale)."""
        batch = self.corpus[name]
        key = ("loss", cfg, *self._where, name)
        return _REFERENCES.get(key, lambda: float(Oracle(cfg).reference(batch).loss))

    def terms(self, cfg: PolicyLossConfig, name: str) -> tuple[float, float]:
        """``(policy term, KL term)`` of ``cfg`` on ``name``: its loss is their sum."""
        batch = self.corpus[name]
        key = ("terms", cfg, *self._where, name)
        return _REFERENCES.get(key, lambda: _terms(Oracle(cfg).reference(batch)))

    def rows(self, cfg: PolicyLossConfig, name: str) -> tuple[torch.Tensor | None, torch.Tensor]:
        """:func:`row_terms` of ``cfg``'s reference output on ``name``, and its aggregated
        mask."""

        def compute() -> tuple[torch.Tensor | None, torch.Tensor]:
            out = Oracle(cfg).reference(self.corpus[name])
            return row_terms(out), out.response_mask

        return _REFERENCES.get(("rows", cfg, *self._where, name), compute)

    def _call(self, cfg: PolicyLossConfig, name: str) -> OracleResult:
        kink = self.tolerance.loosest

        def compute() -> OracleResult:
            out = Oracle(cfg)(self.corpus[name], kink_eps=kink)
            # only what _compare reads without as_checked is kept
            return dataclasses.replace(out, grad_scale_native=None, cond=None, cond_native=None)

        return _REFERENCES.get(("call", cfg, *self._where, name, kink), compute)

    def value_error(self, cfg: PolicyLossConfig, name: str) -> float:
        try:
            expected, scale, n_tokens = self.value(cfg, name)
        except PolgradError:
            return math.inf
        return self.tolerance.value(self.observed[name][0], expected, scale, n_tokens).error

    def errors(
        self, cfg: PolicyLossConfig, name: str, divisor: Divisor | None = None
    ) -> tuple[float, float]:
        """``(value error, gradient error)`` of ``cfg`` (``divisor`` shifted) on ``name``."""
        loss, grad = self.observed[name]
        try:
            ref = self._call(cfg, name)
            shifted = None if divisor is None else _shifted(*self.rows(cfg, name), divisor)
        except PolgradError:
            return math.inf, math.inf
        return _compare(ref, shifted, self.corpus[name], loss, grad, self.tolerance, divisor)

    # -- fitted constants

    def solve(self, at: Callable[[str], tuple[float, float]], rtol: float = 1e-6) -> float | None:
        """The constant ``c`` with ``observed = a + c * b`` on every corpus batch, where
        ``at(name) -> (a, b)``; None when the batches disagree beyond ``rtol`` (not a
        constant). Stops at the first batch that disagrees: most candidates fit no
        constant, and the second batch already says so."""
        c: float | None = None
        for name in self.corpus:
            a, b = at(name)
            if abs(b) > 1e-9 * (1.0 + abs(a)):
                v = float((self.observed[name][0] - a) / b)
                if not math.isfinite(v):
                    return None
                if c is None:
                    c = v
                elif not abs(v - c) <= rtol * max(abs(c), 1e-12):
                    return None
        return c

    def fitted(self, cfg: PolicyLossConfig) -> PolicyLossConfig | None:
        """``cfg`` with a constant fitted to the observed losses: the token-sum-norm budget
        (``loss = S / budget``) or the as-loss KL coefficient (``loss = pg + coef * KL``),
        so that an unpublished constant the function chose is named, not missed."""
        if cfg not in self._fits:
            self._fits[cfg] = self._fit(cfg)
        return self._fits[cfg]

    def _fit(self, cfg: PolicyLossConfig) -> PolicyLossConfig | None:
        try:
            if cfg.aggregation is Aggregation.TOKEN_SUM_NORM and not cfg.kl_in_loss:
                one = cfg.replace(budget=1)
                inverse = self.solve(lambda name: (0.0, self.loss(one, name)))
                if inverse is None or inverse <= 0:
                    return None
                budget = round(1.0 / inverse)
                return _replace(cfg, budget=budget) if budget >= 1 else None
            if cfg.kl_in_loss and cfg.kl is not None:
                unit = cfg.replace(kl=cfg.kl.replace(coef=1.0))
                coef = self.solve(lambda name: self.terms(unit, name))
                if coef is None or coef <= 0:
                    return None
                return _replace(cfg, kl=cfg.kl.replace(coef=float(f"{coef:.6g}")))
        except PolgradError:
            return None
        return None

    def misplaced_bounds(self, cfg: PolicyLossConfig) -> list[tuple[str, float, float]]:
        """``(knob, lower, upper)`` for each relative PPO-clip bound of ``cfg`` outside the
        bracket the function's gradient puts it in (:func:`.clip_fit.bracket`), widened by
        the kink band, and at least by the inputs' own rounding (a loss computing in
        bfloat16 rounds its ratios so, whatever precision judges it): a ratio the function
        rounds across the bound is not evidence. Only tokens where ``cfg``'s own gradient is
        nonzero count (a row a rollout mask zeroes is not clipped)."""
        if cfg not in self._misplaced:  # the ranking's clip fit and explain() both ask
            self._misplaced[cfg] = self._find_misplaced(cfg)
        return self._misplaced[cfg]

    def _find_misplaced(self, cfg: PolicyLossConfig) -> list[tuple[str, float, float]]:
        if cfg.surrogate is not SurrogateKind.PG_CLIP or cfg.clip.bounds is not ClipBounds.RELATIVE:
            return []
        band = max(
            self.tolerance.kink_band[0], KINK_ULPS * unit_roundoff(self.tolerance.input_dtype)
        )
        grads = {name: grad for name, (_, grad) in self.observed.items()}
        try:
            own = {name: self._call(cfg, name).grad for name in self.corpus}
        except PolgradError:
            return []
        out = []
        for knob, side in SIDES.items():
            found = bracket(self.corpus, grads, cfg.ratio, side, own)
            bound = getattr(cfg.clip, knob)
            if found is None or bound is None:
                continue
            lower, upper = found
            if not lower - band * (1.0 + lower) <= bound < upper + band * (1.0 + upper):
                out.append((knob, lower, upper))
        return out

    def fitted_clips(self, cfg: PolicyLossConfig) -> list[PolicyLossConfig]:
        """``cfg`` with its relative clip bounds read off the function (:mod:`.clip_fit`):
        for PPO-clip, each bound the gradient brackets away from ``cfg``'s; for a CISPO
        cap, the bound tried between each pair of the corpus's ratios. So a clip range no
        registry entry uses (``eps_high=0.25``) is named, not missed. Not at half
        precision, where the losses cannot pin a bound down."""
        rtol = _SIGN_RTOL.get(self.tolerance.precisions[-1])
        if rtol is None or cfg.clip.bounds is not ClipBounds.RELATIVE or _placeholder(cfg):
            return []
        if cfg.surrogate is SurrogateKind.CISPO and cfg.ratio is RatioKind.TOKEN:
            found = [self._fit_bounds(cfg, {"eps_high": b}, rtol) for b in intervals(self.corpus)]
            return [c for c in _unique(itertools.chain(*found)) if c.clip != cfg.clip]
        if cfg.surrogate is not SurrogateKind.PG_CLIP:
            return []
        moved = {knob: (lower, upper) for knob, lower, upper in self.misplaced_bounds(cfg)}
        return self._fit_bounds(cfg, moved, rtol) if moved else []

    def _fit_bounds(
        self, cfg: PolicyLossConfig, brackets: Mapping[str, tuple[float, float]], rtol: float
    ) -> list[PolicyLossConfig]:
        """``cfg`` with each clip bound ``knob`` in its bracket ``[lower, upper)`` solved
        from the observed losses (linear in the bounds there), written to the decimals
        that fit within ``rtol`` and within finer tolerances, shortest first (scoring picks:
        a true 0.2475 is not the 0.25 within 1% of it); empty when no bounds reproduce
        the losses."""
        knobs = list(brackets)
        points = {k: linear(*brackets[k]) for k in knobs}
        base = _with_bounds(cfg, {k: p[0] for k, p in points.items()})
        if base is None:
            return []
        moved = [_with_bounds(base, {k: points[k][1]}) for k in knobs]
        steps = [points[k][1] - points[k][0] for k in knobs]
        starts = [points[k][0] for k in knobs]
        rows = []
        try:
            for name in self.corpus:
                at = self.loss(base, name)
                slopes = [
                    (self.loss(m, name) - at) / d for m, d in zip(moved, steps, strict=True) if m
                ]
                if len(slopes) < len(knobs):
                    return []
                offset = at - sum(s * x for s, x in zip(slopes, starts, strict=True))
                rows.append((self.observed[name][0], offset, slopes))
        except PolgradError:
            return []
        values = solve_bounds(rows, rtol)
        if values is None:
            return []
        out: list[PolicyLossConfig] = []
        for tol in sorted({rtol, 1e-4, 1e-6, 1e-9}, reverse=True):
            if tol > rtol:
                continue
            bounds = [shortest(v, *brackets[k], tol) for k, v in zip(knobs, values, strict=True)]
            fitted = None
            if None not in bounds:
                fitted = _with_bounds(cfg, dict(zip(knobs, bounds, strict=True)))
            if fitted is not None and fitted not in out:
                self.read_off[fitted] = (dict(brackets), len(out))
                out.append(fitted)
        return out

    # -- candidates

    def add(self, m: Match) -> Match:
        """Register ``m`` in generation order (the tie-break of every ranking)."""
        self._seq[id(m)] = len(self._alive)
        self._alive.append(m)
        return m

    def rank(
        self, configs: Iterable[PolicyLossConfig], seen: set[tuple[PolicyLossConfig, bool]]
    ) -> list[Match]:
        """Score every config not yet ``seen`` (each padded-width option of it)."""
        out = []
        for cfg in configs:
            for padded in _padded_options(cfg):
                if (cfg, padded) in seen:
                    continue
                seen.add((cfg, padded))
                out.append(self.add(self._score(cfg, padded)))
        return out

    def _per_batch(self, cfg: PolicyLossConfig, padded: bool) -> dict[str, PolicyLossConfig]:
        return {
            name: _with_budget(cfg, batch["response_mask"].shape[1]) if padded else cfg
            for name, batch in self.corpus.items()
        }

    def _score(self, cfg: PolicyLossConfig, padded: bool) -> Match:
        """Value errors first (no backward pass); the gradient only for a candidate whose
        value matches (``grad_error`` stays inf, "not looked at", otherwise)."""
        configs = self._per_batch(cfg, padded)
        value = 0.0
        for name in self.corpus:
            value = max(value, self.value_error(configs[name], name))
            if value > 1.0:
                return Match(cfg, value, padded, value)
        order = sorted(self.corpus, key=lambda name: -self._rejects[name])
        grad = 0.0
        for i, name in enumerate(order):
            grad = max(grad, self.errors(configs[name], name)[1])
            if grad > 1.0:
                self._rejects[name] += 1
                if order[i + 1 :]:
                    self._pending[(cfg, padded, None)] = tuple(order[i + 1 :])
                break
        return Match(cfg, max(value, grad), padded, value, grad)

    def _complete(self, m: Match) -> Match:
        key = _key(m)
        if key in self._done:
            return self._done[key]
        names = self._pending.pop(key, None)
        if names is None:
            return m
        configs = self._per_batch(m.config, m.padded_width_budget)
        grad = m.grad_error
        for name in names:
            grad = max(grad, self.errors(configs[name], name)[1])
        done = dataclasses.replace(m, error=max(m.value_error, grad), grad_error=grad)
        self._done[key] = done
        self._alive.append(done)
        self._seq[id(done)] = self._seq[id(m)]
        return done

    def pending(self, m: Match) -> bool:
        return _key(m) in self._pending

    def fresh(self, items: Iterable[Match]) -> list[Match]:
        """``items`` with every candidate completed since in its completed form."""
        if not self._done:
            return list(items)
        return [self._done.get(_key(m), m) for m in items]

    def by_error(self, m: Match) -> tuple[float, int]:
        return m.error, self._seq[id(m)]

    def by_rank(self, m: Match) -> tuple[float, float, int]:
        return m.error, m.value_error, self._seq[id(m)]

    def settle(
        self, items: list[Match], key: Callable[[Match], Any], head: int | None
    ) -> list[Match]:
        """``items`` (sorted by ``key``) with their first ``head`` (every one for None)
        scored exactly, sorted by ``key``; unchanged when nothing needed completing."""
        if not self._pending and not self._done:
            return items
        out = self.fresh(items)
        changed = any(a is not b for a, b in zip(out, items, strict=True))
        while True:
            if changed:
                out.sort(key=key)
            todo = [i for i, m in enumerate(out[:head]) if self.pending(m)]
            if not todo:
                return out
            for i in todo:
                out[i] = self._complete(out[i])
            changed = True

    def finish(self, items: list[Match]) -> list[Match]:
        """``items`` (sorted by :meth:`by_rank`), every one scored exactly: from here on
        nothing is pending and lists need no refreshing."""
        out = self.settle(items, self.by_rank, None)
        self._done.clear()
        return out

    def settle_fits(
        self, ranked: list[Match], seen: set[tuple[PolicyLossConfig, bool]]
    ) -> list[Match]:
        """``ranked`` (sorted by :meth:`by_error`) with every pending token-sum-norm or
        as-loss-KL candidate whose fitted config is new scored exactly: the order of the
        new fitted configs follows their sources' places in the ranking."""

        def new(cfg: PolicyLossConfig | None) -> bool:
            return cfg is not None and any((cfg, p) not in seen for p in _padded_options(cfg))

        todo = [
            m
            for m in ranked
            if self.pending(m)
            and (m.config.aggregation is Aggregation.TOKEN_SUM_NORM or m.config.kl_in_loss)
            and new(self.fitted(m.config))
        ]
        for m in todo:
            self._complete(m)
        return self.settle(ranked, self.by_error, 0) if todo else ranked


def diagnose(
    fut: FunctionUnderTest,
    target: PolicyLossConfig,
    tolerance: Tolerance,
    *,
    top: int = 3,
) -> list[Match]:
    """Rank candidate semantics by how well they explain ``fut`` on the corpus; raises
    :class:`Verdict` when ``fut`` cannot be evaluated on a corpus batch.

    Each corpus batch is evaluated separately (a padded-width budget differs per batch);
    a candidate's error is its worst over batches and over loss and gradient. ``top <= 0``
    returns the whole ranking.
    """
    ranking, scorer = _ranking(fut, target, tolerance)
    head = top if top > 0 else None
    return scorer.settle(ranking, scorer.by_rank, head)[:head]


_Observed = tuple[
    Mapping[str, Mapping[str, torch.Tensor]], Mapping[str, tuple[float, torch.Tensor]]
]
"""The canonical corpus and the function's ``(loss, gradient)`` on each of its batches."""


def _observed(fut: FunctionUnderTest, tolerance: Tolerance) -> _Observed:
    corpus = canonical_corpus(dtype=tolerance.input_dtype, advantages=fut.options.advantages)
    return corpus, _observe(fut, corpus)


def _ranking(
    fut: FunctionUnderTest,
    target: PolicyLossConfig,
    tolerance: Tolerance,
) -> tuple[list[Match], _Scorer]:
    """The ranking and its scorer. When some candidate matches, candidates whose gradient
    was rejected early may still be pending (:class:`_Scorer`): every match is scored
    exactly, and :meth:`_Scorer.settle` scores any other head exactly."""
    s = _Scorer(*_observed(fut, tolerance), tolerance, fut.options.advantages)
    seen: set[tuple[PolicyLossConfig, bool]] = set()
    first = s.rank(_first_pass(target, fut), seen)
    first = s.settle(sorted(first, key=s.by_error), s.by_error, _REFINE)
    refined: list[Match] = []
    for m in first[:_REFINE]:
        variants = [c for c in _refinements(m.config, target) if _usable(c, fut)]
        refined += s.rank(variants, seen)
    ranked = s.settle(sorted(s.fresh([*first, *refined]), key=s.by_error), s.by_error, _REFINE)
    ranked = s.settle_fits(ranked, seen)
    sums = [m for m in ranked if m.config.aggregation is Aggregation.TOKEN_SUM_NORM]
    kls = [m for m in ranked if m.config.kl_in_loss]
    best = ranked[:_REFINE] + sums + kls
    fitted = [s.fitted(m.config) for m in best]
    refined += s.rank(_unique(fitted), seen)
    ranking = sorted(s.fresh([*first, *refined]), key=s.by_rank)
    if any(m.matches for m in ranking):
        return ranking, s
    # a clip range no candidate has: read it off the function (its gradient brackets each
    # bound, its losses pin it down), for the reference's semantics and the closest ones
    sources = _unique([target, *(m.config for m in ranking[:_REFINE])])
    clips = _unique(c for cfg in sources if _usable(cfg, fut) for c in s.fitted_clips(cfg))
    if clips:
        ranking = sorted(s.fresh([*ranking, *s.rank(clips, seen)]), key=s.by_rank)
        if any(m.matches for m in ranking):
            return ranking, s
    ranking = s.finish(ranking)
    probes = [_with_aggregation(target, agg) for agg in Aggregation]
    probes += [m.config for m in ranking[:_REFINE]] + _registry_losses(fut)
    shifted = _divisor_matches(
        [c for c in _unique(probes) if _usable(c, fut) and not _placeholder(c)], s
    )
    ranking = sorted([*ranking, *shifted], key=lambda m: (m.error, m.value_error))
    if any(m.matches for m in ranking):
        return ranking, s
    # Nothing matches, so one of these is named as the closest: value-only scoring stopped
    # at the first batch whose value missed and never looked at the gradient, so a
    # candidate whose value happens to come near (a KL-Cov selection against a KL term of
    # the wrong sign: 1.2x) would be named although its gradient is 3e5x off. The nearest
    # few by value, and the nearest few with the reference's own semantics, are scored in
    # full, and the closest is chosen on value and gradient together.
    plain = [m for m in ranking if m.divisor is None]  # a shifted divisor is scored in full
    own = [m for m in plain if _is_own(m, target)][:_RESCORE]
    todo = {(m.config, m.padded_width_budget): m for m in [*plain[:_RESCORE], *own]}
    new = {k: _rescored(m, s) for k, m in todo.items()}
    ranking = [
        m if m.divisor is not None else new.get((m.config, m.padded_width_budget), m)
        for m in ranking
    ]
    return sorted(ranking, key=lambda m: (m.error, m.value_error)), s


_RESCORE = 8
"""How many of the nearest non-matching candidates by value (and of the reference's own
semantics) get their gradient scored: :func:`closest` names one of them."""


def _rescored(m: Match, s: _Scorer) -> Match:
    """``m`` with value and gradient scored on every corpus batch."""
    value = grad = 0.0
    for name, batch in s.corpus.items():
        cfg = m.config
        if m.padded_width_budget:
            cfg = cfg.replace(budget=batch["response_mask"].shape[1])
        v, g = (math.inf if math.isnan(e) else e for e in s.errors(cfg, name))
        value, grad = max(value, v), max(grad, g)
    return dataclasses.replace(m, error=max(value, grad), value_error=value, grad_error=grad)


def _is_own(m: Match, target: PolicyLossConfig) -> bool:
    """``m`` is the reference's own semantics under some aggregation (or budget)."""
    return m.divisor is None and set(_differences(m.config, target)) <= {"aggregation", "budget"}


def _placeholder(cfg: PolicyLossConfig) -> bool:
    """A token-sum-norm candidate whose budget 1 stands for the padded width."""
    return cfg.aggregation is Aggregation.TOKEN_SUM_NORM and cfg.budget == 1


def _divisor_matches(configs: Iterable[PolicyLossConfig], s: _Scorer) -> list[Match]:
    """Each config with its divisor shifted by a whole count (:mod:`.divisor`) whose loss
    VALUE matches on every corpus batch, scored like any candidate. One reference call per
    batch and config serves every shift; the gradient is computed only for a value match.
    A shift that does not match is not returned: it is no 'closest' semantics to name."""
    out = []
    for cfg in configs:
        shifts = divisors_for(cfg.aggregation)
        if not shifts:
            continue
        rows: dict[str, tuple[torch.Tensor, torch.Tensor, float, int]] = {}
        try:
            for name in s.corpus:
                terms, mask = s.rows(cfg, name)
                _, scale, n_tokens = s.value(cfg, name)
                if terms is None:
                    break
                rows[name] = (terms, mask, scale, n_tokens)
        except PolgradError:
            continue
        if len(rows) < len(s.corpus):
            continue
        for divisor in shifts:
            if _shifted_value_error(divisor, rows, s.observed, s.tolerance) > 1.0:
                continue
            value = grad = 0.0
            for name in s.corpus:
                v, e = s.errors(cfg, name, divisor)
                value, grad = max(value, v), max(grad, e)
            out.append(s.add(Match(cfg, max(value, grad), False, value, grad, divisor)))
    return out


def _shifted_value_error(
    divisor: Divisor,
    rows: Mapping[str, tuple[torch.Tensor, torch.Tensor, float, int]],
    observed: Mapping[str, tuple[float, torch.Tensor]],
    tolerance: Tolerance,
) -> float:
    """Worst value error of a shifted divisor over the corpus, from each batch's per-row
    contributions ``c_b``, aggregated mask, value scale and token count."""
    worst = 0.0
    for name, (terms, mask, scale, n_tokens) in rows.items():
        rho = divisor.factors(mask)
        if rho is None:
            return math.inf
        expected = float((rho * terms).sum())
        if not math.isfinite(expected):
            return math.inf  # never a NaN error: max() would pass it over
        err = tolerance.value(observed[name][0], expected, scale * float(rho.max()), n_tokens)
        worst = max(worst, err.error)
        if worst > 1.0:
            break
    return worst


def holds_on(
    match: Match,
    fut: FunctionUnderTest,
    batch: Mapping[str, torch.Tensor],
    tolerance: Tolerance,
) -> bool:
    """Whether ``fut`` still matches ``match`` on one more batch (e.g. the failing one)."""
    cfg = match.config
    if match.padded_width_budget:
        cfg = cfg.replace(budget=batch["response_mask"].shape[1])
    try:
        ev = fut.call(batch)
    except Verdict:
        return False
    assert ev.grad is not None
    loss, grad = float(ev.loss), ev.grad.to(torch.float64)
    divisor = match.divisor
    try:
        ref = Oracle(cfg)(batch, kink_eps=tolerance.loosest)
        shifted = None
        if divisor is not None:
            out = Oracle(cfg).reference(batch)
            shifted = _shifted(row_terms(out), out.response_mask, divisor)
    except PolgradError:
        return False
    v, g = _compare(ref, shifted, batch, loss, grad, tolerance, divisor, as_checked=True)
    return max(v, g) <= 1.0


def _compare(
    ref: OracleResult,
    shifted: tuple[torch.Tensor, torch.Tensor] | None,
    batch: Mapping[str, torch.Tensor],
    loss: float,
    grad: torch.Tensor,
    tolerance: Tolerance,
    divisor: Divisor | None = None,
    *,
    as_checked: bool = False,
) -> tuple[float, float]:
    """``(value error, gradient error)`` of the reference result ``ref`` (its divisor
    shifted by ``divisor``, ``shifted`` being :func:`_shifted` of it) against the observed
    loss and gradient; ``as_checked``: with the native scales the value and gradient checks
    use at the input precision (``Tolerance._pick``), so a batch a check failed on is never
    judged a match."""
    expected, scale, g_ref, g_scale = ref.loss, ref.value_scale, ref.grad, ref.grad_scale
    v_native = ref.value_scale_native if as_checked else None
    g_native = ref.grad_scale_native if as_checked else None
    if divisor is not None:
        if shifted is None:
            return math.inf, math.inf
        terms, rho = shifted
        if not bool(torch.isfinite(rho).all()):
            return math.inf, math.inf
        # the loss is sum_b rho_b c_b; its gradient and that gradient's scale scale by
        # rho_b row by row; max(rho) bounds the value scale (diagnose/divisor.py)
        expected, scale = float((rho * terms).sum()), scale * float(rho.max())
        g_ref, g_scale = g_ref * rho, g_scale * rho
        v_native = None if v_native is None else v_native * float(rho.max())
        g_native = None if g_native is None else g_native * rho
    value = tolerance.value(loss, expected, scale, ref.n_tokens, native_scale=v_native).error
    g = tolerance.tensor(grad, g_ref, g_scale, ref.clear, native_scale=g_native)[0].error
    return value, g


def _shifted(
    terms: torch.Tensor | None, mask: torch.Tensor, divisor: Divisor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(c_b, rho_b)``, both ``[B, 1]``: a config's per-row loss contributions
    (:func:`row_terms`) and the factors of ``divisor`` for its aggregated ``mask``; None
    where the shift does not apply."""
    rho = divisor.factors(mask)
    return None if terms is None or rho is None else (terms, rho)


# ----------------------------------------------------------------------- explanation


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The diagnosis of one function: the sentence for the report, the short form for the
    summary table, and the best full match (``None`` when nothing matches)."""

    text: str
    summary: str
    best: Match | None


_TOP_LEVEL_KNOBS = {"budget": "budget", "aggregation": "aggregation", "kl.coef": "kl"}
"""Unstated top-level knobs and the marker keyword that declares each (a KL coefficient is
declared with the whole ``kl=KLConfig(...)``)."""


def _declarable(knob: str) -> bool:
    return knob in _TOP_LEVEL_KNOBS or knob.startswith(("clip.", "params."))


def _differences(found: PolicyLossConfig, target: PolicyLossConfig) -> dict[str, Any]:
    """Dotted knob -> the function's value, for every field where ``found`` differs."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(found):
        a, b = getattr(found, f.name), getattr(target, f.name)
        if a == b:
            continue
        if dataclasses.is_dataclass(a) and type(a) is type(b):
            for g in dataclasses.fields(a):
                if getattr(a, g.name) != getattr(b, g.name):
                    out[f"{f.name}.{g.name}"] = getattr(a, g.name)
        else:
            out[f.name] = a
    return out


_SECTION_FIELDS = {"clip": ("eps_low", "eps_high")}
"""The fields a registry note on a whole section leaves open: every ``clip`` note is about
the clip range (e.g. grpo's "the paper does not state eps"), never the dual clip or the
kind of bounds, which such a note does not excuse."""


def _note_for(knob: str, notes: Mapping[str, Unstated]) -> Unstated | None:
    """The registry note that leaves ``knob`` open: its own, or its section's when the
    section's note covers that field (:data:`_SECTION_FIELDS`); None otherwise."""
    if knob in notes:
        return notes[knob]
    section, _, field = knob.partition(".")
    return notes.get(section) if field in _SECTION_FIELDS.get(section, ()) else None


def _keyword_value(knob: str, found: PolicyLossConfig) -> tuple[str, str]:
    """The marker keyword declaring ``knob`` and the function's value as Python source:
    ``clip.eps_high`` -> ``eps_high=0.2``, ``params.tau_neg`` -> ``tau_neg=1.0`` (routed by
    ``AlgorithmSpec.derive``), ``kl.coef`` -> ``kl=KLConfig(...)``."""
    if knob in _TOP_LEVEL_KNOBS:
        key = _TOP_LEVEL_KNOBS[knob]
        return key, config_source(getattr(found, key))
    owner, _, field = knob.partition(".")
    return field, config_source(getattr(getattr(found, owner), field))


def unstated_hint(match: Match, target: PolicyLossConfig, reference: object) -> str:
    """When ``match`` differs from the registry entry ``reference`` only in knobs its
    source leaves unstated: say so, name the function's values and print the marker line
    that declares them. Empty otherwise."""
    if not isinstance(reference, str) or reference not in ALGORITHMS:
        return ""
    if match.padded_width_budget or match.divisor is not None:
        return ""
    notes = {u.knob: u for u in ALGORITHMS[reference].unstated}
    diff = _differences(match.config, target)
    found = {k: _note_for(k, notes) for k in diff}
    if not diff or not all(u is not None and _declarable(k) for k, u in found.items()):
        return ""
    said = [f"{k} (registry value {u.value!r}: {u.note})" for k, u in found.items() if u]
    pairs = dict(_keyword_value(k, match.config) for k in diff)
    line = ", ".join(f"{k}={v}" for k, v in pairs.items())
    return (
        f" The only difference lies in constant(s) the source of {reference!r} does not "
        f"publish: {'; '.join(said)}. This function uses {line}, not the registry's "
        "value: if that is a mistake, it is the bug; if it is your setting, declare it "
        f'with @pytest.mark.polgrad_conforms("{reference}", {line}).'
    )


def explain(
    fut: FunctionUnderTest,
    target: PolicyLossConfig,
    tolerance: Tolerance,
    *,
    reference: object,
    reference_id: str,
) -> Explanation:
    """The diagnosis sentence: 'this function matches X — name; the reference is Y', or
    'the value matches X but the gradient does not', or the closest candidate."""
    wanted = f"the reference {reference_id!r} is {describe_config(target)}"
    try:
        ranking, scorer = _ranking(fut, target, tolerance)
    except Verdict as exc:
        return Explanation(f"not diagnosed ({exc}); {wanted}", "not diagnosed", None)

    def order(m: Match) -> tuple[int, int, float]:  # of bounds read off, the shortest matching
        return _distance(m, target), scorer.read_off.get(m.config, ({}, 0))[1], m.error

    full = sorted((m for m in ranking if m.matches), key=order)
    misplaced = scorer.misplaced_bounds(target)
    half = tolerance.input_dtype in (torch.float16, torch.bfloat16)
    if misplaced and half and full and _distance(full[0], target) == 0:
        return _clips_elsewhere(misplaced, target, wanted, half)
    if full and _distance(full[0], target) == 0:
        # the corpus cannot explain the failure (e.g. at bfloat16 precision every nearby
        # candidate is within tolerance): name the reference, not the lowest-error one
        m, others = full[0], len(full) - 1
        also = f"; at this precision {others} other candidate(s) do too" if others else ""
        hint = ""
        if others and tolerance.precisions[-1] in (torch.bfloat16, torch.float16):
            name = str(tolerance.precisions[-1]).removeprefix("torch.")
            hint = (
                f" At {name} tolerance the corpus cannot tell these semantics apart: a "
                "function that computes in float32 is judged, and diagnosed, at float32 "
                "with strict=True."
            )
        return Explanation(
            f"on the canonical corpus this function matches {m.describe()}, the reference "
            f"itself (within tolerance{also}): the deviation shows on other batches only; "
            f"{wanted}.{hint}",
            f"is {m.describe()}",
            m,
        )
    # two writings of one read-off bound print alike: name each description once
    first: dict[str, Match] = {}
    for m in full:
        first.setdefault(m.describe(), m)
    full = list(first.values())[:3]
    if full:
        found = "; or ".join(m.describe() for m in full)
        hint = unstated_hint(full[0], target, reference)
        if full[0].config in scorer.read_off:
            hint += _read_off_clause(full[0], scorer, target, reference, bool(hint))
        return Explanation(
            f"on the canonical corpus this function matches {found} (within tolerance); "
            f"{wanted}.{hint}",
            f"is {found}",
            full[0],
        )
    if misplaced and not full and not any(m.value_matches for m in ranking):
        return _clips_elsewhere(misplaced, target, wanted, half)
    value_only = [m for m in ranking if m.value_matches]
    if value_only:
        m = value_only[0]
        return Explanation(
            f"on the canonical corpus the loss VALUE matches {m.describe()} (within "
            f"{m.value_error:.2g}x the tolerance) but its gradient does not (off by "
            f"{m.grad_error:.3g}x): a stop-gradient is missing or misplaced, or part of the "
            f"loss is computed from detached tensors; {wanted}",
            f"value is {m.describe()}, gradient is not (a stop-gradient?)",
            None,
        )
    flipped = _negated_kl(target, scorer)
    if flipped is not None:
        assert target.kl is not None
        return Explanation(
            f"no registered semantics matches: on every canonical corpus batch the loss fits "
            f"the reference's policy term minus {-flipped:.3g} x its KL term, so the KL term "
            f"enters with the opposite sign (the reference adds {target.kl.coef:g} x KL); "
            f"{wanted}",
            f"no match (KL term with the opposite sign, coefficient {flipped:.3g})",
            None,
        )
    m, own = closest(ranking, target)
    if own:
        agg = _aggregation_text(m)
        return Explanation(
            f"no registered semantics matches; the numerically closest aggregation is {agg} "
            f"(with the reference's other choices: {m.describe()}, off by {m.error:.3g}x the "
            f"tolerance; no candidate with other semantics comes {_NEAR:g}x closer); {wanted}",
            f"no match (closest aggregation: {agg}, {m.error:.2g}x tol)",
            None,
        )
    return Explanation(
        f"no registered semantics matches; the closest is {m.describe()} "
        f"(off by {m.error:.3g}x the tolerance); {wanted}",
        f"no match (closest: {m.describe()}, {m.error:.2g}x tol)",
        None,
    )


def _read_off_clause(
    m: Match, scorer: _Scorer, target: PolicyLossConfig, reference: object, hinted: bool
) -> str:
    """How a clip range no candidate had was read off the function, with the evidence's
    range; at half precision, that the losses cannot tell the values in it apart (so the
    named one is a representative); otherwise the marker line declaring it when the
    source's own hint has not printed one."""
    clip = m.config.clip
    half = scorer.tolerance.input_dtype in (torch.float16, torch.bfloat16)
    parts = []
    for knob, (lo, hi) in scorer.read_off[m.config][0].items():
        value = getattr(clip, knob)
        if m.config.surrogate is SurrogateKind.CISPO:
            parts.append(
                f"{knob} {value:g} (a weight capped at {1.0 + value:g}), which the losses "
                f"put between the corpus's ratios {1.0 + lo:.4g} and {1.0 + hi:.4g}"
            )
        else:
            solved = "" if half else f", the losses at {value:g}"
            parts.append(
                f"{knob} {value:g}: the gradient's exact zeros put it between {lo:.3g} and "
                f"{hi:.3g}" + solved
            )
    said = "; ".join(parts)
    if half:
        dtype = str(scorer.tolerance.input_dtype).removeprefix("torch.")
        return (
            f" The clip range was read off the function: {said}; fed {dtype}, the losses "
            "cannot tell the values in that range apart, so the one named is only a "
            "representative."
        )
    text = f" The clip range was read off the function: {said}."
    if not hinted and isinstance(reference, str):
        line = ", ".join(
            "=".join(_keyword_value(k, m.config)) for k in _differences(m.config, target)
        )
        text += (
            f" If that is intended, declare it: @pytest.mark.polgrad_conforms"
            f'("{reference}", {line}).'
        )
    return text


def _clips_elsewhere(
    misplaced: list[tuple[str, float, float]], target: PolicyLossConfig, wanted: str, half: bool
) -> Explanation:
    """The diagnosis when the gradient's exact zeros put a clip bound elsewhere than the
    reference's and no candidate matches otherwise (or only the reference itself, within
    a half-precision tolerance too loose to tell)."""
    brackets = [f"{knob} between {lo:.3g} and {hi:.3g}" for knob, lo, hi in misplaced]
    said = "; ".join(
        f"{b} (not the reference's {getattr(target.clip, knob):g})"
        for b, (knob, _, _) in zip(brackets, misplaced, strict=True)
    )
    return Explanation(
        "no registered semantics matches, but on the canonical corpus the function's "
        "gradient is exactly zero at the tokens a PPO-clip loss with the reference's other "
        f"choices clips for {said}: the function clips elsewhere"
        + (" (its losses do not pin the bound down at this precision)" if half else "")
        + f"; {wanted}",
        f"no match (clip range: {', '.join(brackets)})",
        None,
    )


def _distance(m: Match, target: PolicyLossConfig) -> int:
    """How many choices ``m`` makes differently from ``target``: among candidates that all
    match, the one nearest the declared reference is named first."""
    shifted = int(m.divisor is not None) + int(m.padded_width_budget)
    return len(_differences(m.config, target)) + shifted


_NEAR = 100.0
"""How much closer than the reference's own semantics (under its best aggregation) another
candidate must come to be named when nothing matches: with five corpus losses and hundreds
of candidates, an unrelated one fits a deviation several times better by chance (GSPO's
clip range, swapped, fit a GRPO loss dividing each row by its length + 1/2 8.3x better than
GRPO's own semantics, tests/kinds/policy_loss/diagnose/test_divisors.py)."""


def closest(ranking: list[Match], target: PolicyLossConfig) -> tuple[Match, bool]:
    """The candidate to name when none matches, and whether it is the reference's own
    semantics under some aggregation (or budget): that one, unless another candidate's
    error is :data:`_NEAR` times smaller."""
    # only a candidate whose gradient was scored too can be named (see _ranking)
    pool = [m for m in ranking if math.isfinite(m.grad_error)] or ranking
    own = [m for m in pool if _is_own(m, target)]
    best = pool[0]
    if own and best.error * _NEAR > own[0].error:
        return own[0], True
    return best, False


def _aggregation_text(m: Match) -> str:
    cfg = m.config
    if m.padded_width_budget:
        return "token-sum-norm dividing by the padded width T"
    return cfg.aggregation.value + (f" (budget {cfg.budget})" if cfg.budget else "")
