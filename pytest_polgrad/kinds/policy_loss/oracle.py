"""The float64 oracle: the reference loss, its gradient, and what the tolerance needs.

Inputs are upcast to float64 (exactly, from any float dtype), so the oracle's answer is
the reference semantics of the very tensors the function under test received.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import torch

from polgrad_reference import (
    CovarianceSelection,
    DivergenceMask,
    GammaWeight,
    ISLevel,
    ISMode,
    PolicyLossConfig,
    PolicyLossOutput,
    QuadraticPenalty,
    RatioKind,
    SoftGate,
    SurrogateKind,
    covariance_selection,
    kink_ratios,
    policy_loss,
)

__all__ = ["Oracle", "OracleResult"]

F64 = torch.float64
_CORE = ("logprobs", "old_logprobs", "advantages", "response_mask")


@dataclasses.dataclass(frozen=True)
class OracleResult:
    """Reference loss and gradient of one batch, plus per-token conditioning data."""

    loss: float
    grad: torch.Tensor
    """d loss / d logprobs, ``[B, T]`` float64, zero at padding."""
    value_scale: float
    """``sum_t |w_t| (|l_t| + |A_t| r_t cond_t)``: the magnitude the loss's rounding error is
    proportional to; it does not collapse when positive and negative terms cancel."""
    grad_scale: torch.Tensor
    """Per-element magnitude for gradient tolerances, ``[B, T]``."""
    ambiguous: torch.Tensor
    """Tokens within rounding distance of a clip kink, ``[B, T]`` bool: their gradient
    legitimately jumps between branches, so only finiteness is required there."""
    n_tokens: int
    clear: torch.Tensor
    """``response_mask & ~ambiguous``: the response tokens whose gradient is compared."""
    value_scale_native: float = 0.0
    """``value_scale`` for arithmetic in the input dtype itself (inputs exact, only the
    log-ratio rounds): ``cond`` becomes ``1 + max_t |lr_t|``."""
    grad_scale_native: torch.Tensor | None = None
    """``grad_scale`` with the native condition number (see ``value_scale_native``)."""
    cond: torch.Tensor | None = None
    """``[B, 1]``: ``1 + max_t (|logprobs| + |old_logprobs|)``, the rows' condition numbers
    when the inputs are rounded to a coarser precision."""
    cond_native: torch.Tensor | None = None
    """``[B, 1]``: ``1 + max_t |logprobs - old_logprobs|`` (inputs exact)."""
    undecided: bool = False
    """A rollout-IS keep/drop decision (mask or zero mode) lies within rounding distance
    of its band: the loss jumps there, so the batch cannot be judged at this precision."""
    kinked: bool = True
    """Whether any token is ``ambiguous`` (False: finiteness there needs no separate test)."""

    @functools.cached_property
    def clear_mass(self) -> float:
        """``sum |grad|`` over ``clear``, once per result (every function's padding and
        micro-batch checks on the batch read it)."""
        return float(torch.where(self.clear, self.grad.abs(), 0.0).sum())


@dataclasses.dataclass(frozen=True)
class Oracle:
    """Callable reference for one loss config; ``include_kl`` adds the as-loss KL term."""

    config: PolicyLossConfig

    @property
    def needs(self) -> tuple[str, ...]:
        """Optional tensors the config needs besides the four core ones."""
        out = []
        if self.config.kl_in_loss:
            out.append("ref_logprobs")
        if self.config.is_correction is not None:
            out.append("rollout_logprobs")
        return tuple(out)

    def __call__(
        self,
        batch: Mapping[str, torch.Tensor],
        *,
        kink_eps: float,
        grad: bool = True,
        native_kinks: bool = False,
        native: bool = True,
    ) -> OracleResult:
        """Evaluate on ``batch`` (canonical ``[B, T]`` right-padded tensors, any float dtype);
        ``kink_eps`` is the relative rounding error (per unit of condition number) that
        makes a clip kink ambiguous: the band is ``kink_eps * (1 + |lr|)`` with
        ``native_kinks`` (inputs exact in the function's precision) and ``kink_eps * (1 +
        |logprobs| + |old_logprobs|)`` otherwise (:attr:`Tolerance.kink_band` gives both).
        With ``grad=False`` the backward pass is skipped and the gradient fields
        (``grad``, ``grad_scale``, ``ambiguous``) are zeros. With ``native=False`` the
        native-precision fields (``value_scale_native``, ``grad_scale_native``,
        ``cond_native``) are left at their defaults (0.0, None, None): a caller that
        judges with the conservative scales only (the training step) skips their work;
        every other field is bitwise as with ``native=True``."""
        x = self._inputs(batch)
        lp = x["logprobs"].clone().requires_grad_(grad)
        out = policy_loss(self.config, **{**x, "logprobs": lp})
        g = torch.autograd.grad(out.loss, lp)[0] if grad else torch.zeros_like(lp)
        mask = out.response_mask
        adv = self._token_advantages(x, lp)
        lp0 = torch.where(mask, x["logprobs"], 0.0)
        old0 = torch.where(mask, x["old_logprobs"], 0.0)
        token_cond = 1.0 + lp0.abs() + old0.abs()
        token_native = 1.0 + (lp0 - old0).abs() if native or native_kinks else token_cond
        cond = token_cond.amax(dim=1, keepdim=True)
        row_native = token_native.amax(dim=1, keepdim=True) if native else None
        ratio = out.ratio.detach()

        parts = self._value_terms(out, x, adv)

        def scale_of(c: torch.Tensor, kl_c: torch.Tensor | None) -> float:
            return self._scale_from(out, parts, c, kl_c)

        kl_cond = kl_native = None
        if out.kl is not None:
            ref0 = torch.where(mask, x["ref_logprobs"], 0.0)
            kl_cond = 1.0 + ref0.abs() + lp0.abs()
            if native:
                kl_native = 1.0 + (ref0 - lp0).abs().amax(dim=1, keepdim=True)
        grad_native: torch.Tensor | None = None
        if grad:
            g_abs = g.abs()
            base = g_abs + g_abs.amax(dim=1, keepdim=True)
            coupling = self._row_coupling(x, mask, adv) * self._curvature(ratio, adv)
            gate = self._gate_rounding(out, ratio, adv)
            grad_scale = base * cond * coupling + gate
            if row_native is not None:
                grad_native = base * row_native * coupling + gate
            if out.kl is not None:
                assert kl_cond is not None
                grad_scale = grad_scale + self._kl_grad_scale(out, x, kl_cond)
                if grad_native is not None:
                    assert kl_native is not None
                    grad_native = grad_native + self._kl_grad_scale(out, x, kl_native)
            band = kink_eps * (token_native if native_kinks else token_cond)
            ambiguous = self._kinks(ratio, mask, band) | self._gate_kinks(x, mask, band)
        else:  # a value-only comparison needs neither
            grad_scale, ambiguous = g, torch.zeros_like(mask)
        return OracleResult(
            loss=out.loss.item(),
            grad=g.detach(),
            value_scale=scale_of(cond, cond),
            grad_scale=grad_scale,
            ambiguous=ambiguous,
            n_tokens=int(mask.sum()),
            value_scale_native=0.0 if row_native is None else scale_of(row_native, kl_native),
            grad_scale_native=grad_native,
            cond=cond,
            cond_native=row_native,
            clear=x["response_mask"] & ~ambiguous,
            kinked=bool(ambiguous.any()),
            undecided=self._is_undecided(x, x["response_mask"], kink_eps, native_kinks)
            or self._selection_undecided(
                x, mask, adv, ratio, kink_eps, token_native if native_kinks else token_cond
            ),
        )

    def value(self, batch: Mapping[str, torch.Tensor]) -> tuple[float, float, int]:
        """``(loss, value_scale, n_tokens)`` as :meth:`__call__` gives them, without the
        backward pass, the gradient scales or the kink data: what ranking many candidate
        configs on the corpus needs (the diagnosis)."""
        x = self._inputs(batch)
        with torch.no_grad():
            out = policy_loss(self.config, **x)
            mask = out.response_mask
            lp0, old0 = (torch.where(mask, x[k], 0.0) for k in ("logprobs", "old_logprobs"))
            cond = (1.0 + lp0.abs() + old0.abs()).amax(dim=1, keepdim=True)
            adv = self._token_advantages(x, x["logprobs"])
            return out.loss.item(), self._value_scale(out, x, adv, cond, cond), int(mask.sum())

    def reference(self, batch: Mapping[str, torch.Tensor]) -> PolicyLossOutput:
        """The reference's output on ``batch`` upcast to float64, without autograd."""
        with torch.no_grad():
            return policy_loss(self.config, **self._inputs(batch))

    def _inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors the config reads, floats upcast to float64 (exactly)."""
        return {
            k: (batch[k].detach().to(F64) if batch[k].is_floating_point() else batch[k])
            for k in (*_CORE, *self.needs)
        }

    @staticmethod
    def _token_advantages(x: Mapping[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        adv = x["advantages"]
        return adv[:, None].expand_as(like) if adv.dim() == 1 else adv

    def _value_scale(
        self,
        out: PolicyLossOutput,
        x: Mapping[str, torch.Tensor],
        adv: torch.Tensor,
        cond: torch.Tensor,
        kl_cond: torch.Tensor | None,
    ) -> float:
        """``sum_t |w_t| (|l_t| + (|A_t| r_t + p_t) cond_t [+ coef (|k_t| + kl_cond_t)])``:
        a rounding of the inputs by ``cond`` moves the token loss by its slope in the
        log-ratio, ``|A| r`` for every surrogate plus a penalty's slope ``p`` that does not
        vanish with the advantage (:meth:`_penalty_slope`)."""
        return self._scale_from(out, self._value_terms(out, x, adv), cond, kl_cond)

    def _value_terms(
        self, out: PolicyLossOutput, x: Mapping[str, torch.Tensor], adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """What :meth:`_value_scale` reads besides the condition numbers, made once per
        batch for both of them: ``(|l_t|, slope, |k_t| or None, |w_t|)``."""
        weight = self._applied_weight(out.ratio.detach())
        slope = adv.abs() * weight + self._penalty_slope(x, out.response_mask)
        kl_abs = None if out.kl is None else out.kl.detach().abs()
        return out.token_loss.detach().abs(), slope, kl_abs, out.weights.abs()

    def _scale_from(
        self,
        out: PolicyLossOutput,
        parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor],
        cond: torch.Tensor,
        kl_cond: torch.Tensor | None,
    ) -> float:
        token_abs, slope, kl_abs, weights_abs = parts
        terms = token_abs + slope * cond
        if kl_abs is not None:
            assert self.config.kl is not None and kl_cond is not None
            terms = terms + self.config.kl.coef * (kl_abs + kl_cond)
        return float((torch.where(out.response_mask, terms, 0.0) * weights_abs).sum())

    def _applied_weight(self, ratio: torch.Tensor) -> torch.Tensor:
        """The importance weight the token loss applies: the ratio, except for CISPO's
        stop-gradient weight ``clamp(r, low, high)`` (arXiv:2506.13585 Eq. 4), whose value
        moves with ``r`` only inside its bounds. A sequence-product ratio may overflow to
        inf over a long row (``polgrad_reference.ratios``); the truncated weight does not,
        and ``|A| * inf`` would make the scale inf (any value accepted) or NaN at A = 0."""
        clip = self.config.clip
        if self.config.surrogate is not SurrogateKind.CISPO:
            return ratio
        if clip.low is None and clip.high is None:
            return ratio
        return ratio.clamp(min=clip.low, max=clip.high)

    def _penalty_slope(self, x: Mapping[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """``|d penalty_t / d lr_t|``: DRO's ``beta/2 lr^2`` has ``beta |lr|``; KL-Cov's
        ``kl_coef |lr|`` on the tokens it selects has ``kl_coef`` there (0 elsewhere, and for
        every other surrogate)."""
        params, kind = self.config.params, self.config.surrogate
        if kind is SurrogateKind.DRO and isinstance(params, QuadraticPenalty):
            return params.beta * torch.where(mask, x["logprobs"] - x["old_logprobs"], 0.0).abs()
        if kind is SurrogateKind.KL_COV and isinstance(params, CovarianceSelection):
            chosen = covariance_selection(
                self.config,
                logprobs=x["logprobs"],
                old_logprobs=x["old_logprobs"],
                advantages=x["advantages"],
                response_mask=x["response_mask"],
            )
            return params.kl_coef * chosen.to(F64)
        return torch.zeros_like(mask, dtype=F64)

    def _kl_grad_scale(
        self, out: PolicyLossOutput, x: Mapping[str, torch.Tensor], cond: torch.Tensor
    ) -> torch.Tensor:
        """Rounding scale of the KL term's gradient: ``d k / d logprobs`` involves
        ``exp(lr) - 1`` (k3) or ``lr`` (k2) with ``lr = ref - logprobs``, which cancels;
        ``cond`` is ``1 + |ref| + |logprobs|`` (rounded inputs) or ``1 + |lr|`` (exact)."""
        assert self.config.kl is not None
        mask = out.response_mask
        ref = torch.where(mask, x["ref_logprobs"], 0.0)
        lp = torch.where(mask, x["logprobs"], 0.0)
        lr = ref - lp
        weights = out.weights if out.kl_weights is None else out.kl_weights
        return self.config.kl.coef * weights * (torch.exp(lr) + 1.0 + lr.abs()) * cond

    def _row_coupling(
        self, x: Mapping[str, torch.Tensor], mask: torch.Tensor, adv: torch.Tensor
    ) -> torch.Tensor:
        """``[B, 1]`` amplification of rounding by a weight computed from the whole row:
        VESPO's ``phi(w) = exp(lam + k log w - lam w)`` with ``log w = sum_t lr_t`` has
        ``d log phi / d log w = k - lam w``, and ``log w`` sums ``n`` roundings, so its
        gradient's relative error grows by ``1 + n |k - lam w|`` (1 for the others)."""
        params = self.config.params
        if self.config.surrogate is not SurrogateKind.VESPO or not isinstance(params, GammaWeight):
            return torch.ones((mask.shape[0], 1), dtype=F64)
        lr = torch.where(mask, x["logprobs"] - x["old_logprobs"], 0.0)
        log_w = lr.sum(dim=1, keepdim=True)
        pos = adv[:, :1] >= 0
        k = torch.where(pos, params.k_pos, params.k_neg)
        lam = torch.where(pos, params.lambda_pos, params.lambda_neg)
        slope = (k - lam * torch.exp(log_w.clamp(max=50.0))).abs()
        return 1.0 + mask.sum(dim=1, keepdim=True).to(F64) * slope

    def _sapo_gate(
        self, ratio: torch.Tensor, adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(tau, s)`` with ``s = sigmoid(tau (r - 1))``, ``tau = tau_pos`` where ``A > 0``
        else ``tau_neg`` (as ``polgrad_reference.surrogates``); None unless SAPO."""
        params = self.config.params
        if self.config.surrogate is not SurrogateKind.SAPO or not isinstance(params, SoftGate):
            return None
        tau = torch.where(adv > 0, params.tau_pos, params.tau_neg)
        return tau, torch.sigmoid(tau * (ratio - 1.0))

    def _curvature(self, ratio: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        """Per-token amplification of rounding in the gradient by the surrogate's
        curvature: SAPO's gradient ``g ~ s (1 - s) r`` with ``s = sigmoid(tau (r - 1))``
        has ``d log g / d lr = 1 + tau r (1 - 2 s)``, up to ``1 + tau r`` past the gate
        (1 for the others: their gradient is proportional to ``r``)."""
        sapo = self._sapo_gate(ratio, adv)
        if sapo is None:
            return torch.ones_like(ratio)
        tau, gate = sapo
        return 1.0 + tau * ratio * (1.0 - 2.0 * gate).abs()

    def _gate_rounding(
        self, out: PolicyLossOutput, ratio: torch.Tensor, adv: torch.Tensor
    ) -> torch.Tensor | float:
        """SAPO's gradient ``4 s (1 - s) r |A| w`` loses ``1 - s`` to the rounding of ``s``
        itself near ``s = 1`` (``sigmoid(21)`` is 1 in float32, so a correct float32
        gradient is 0 there): an absolute error of ``4 s r |A| |w|`` units of the
        precision, whatever the inputs' condition (0 for the other surrogates)."""
        sapo = self._sapo_gate(ratio, adv)
        if sapo is None:
            return 0.0
        return 4.0 * sapo[1] * ratio * adv.abs() * out.weights.abs()

    def _selection_undecided(
        self,
        x: Mapping[str, torch.Tensor],
        mask: torch.Tensor,
        adv: torch.Tensor,
        ratio: torch.Tensor,
        eps: float,
        kink_cond: torch.Tensor,
    ) -> bool:
        """Whether rounding at this precision can change which tokens Clip-Cov / KL-Cov
        select by ``cov = (A - mean A)(lp - mean lp)`` (arXiv:2505.22617 Sec. 4): KL-Cov's
        ``k``-th and ``(k+1)``-th largest ``cov`` within their rounding of each other, or a
        Clip-Cov candidate's ``cov`` within rounding of ``low``/``high`` or its ratio within
        the kink band of a clip bound. The loss jumps by a whole token there, so the batch
        is not judged (as a rollout-IS decision). The rounding of ``cov`` is that of its
        two centred factors, each ``eps (|x| + (1 + log2 N) mean |x|)`` (the mean's
        summation error, Higham Sec. 4.2), plus the product's own."""
        params = self.config.params
        kind = self.config.surrogate
        if kind not in (SurrogateKind.CLIP_COV, SurrogateKind.KL_COV):
            return False
        if not isinstance(params, CovarianceSelection):
            return False
        n = int(mask.sum())
        if n == 0:
            return False
        a = torch.where(mask, adv, 0.0)
        lp = torch.where(mask, x["logprobs"], 0.0)
        da, dl = a - a[mask].mean(), lp - lp[mask].mean()
        cov = da * dl
        grow = 1.0 + math.log2(n)
        err_a = eps * (a.abs() + grow * a[mask].abs().mean())
        err_l = eps * (lp.abs() + grow * lp[mask].abs().mean())
        band = err_a * dl.abs() + err_l * da.abs() + eps * cov.abs()
        if kind is SurrogateKind.KL_COV:
            k = max(int(params.fraction * n), 1)
            if k >= n:
                return False
            flat, b = cov[mask], band[mask]
            order = torch.sort(flat, descending=True, stable=True).indices
            top, rest = order[:k], order[k:]
            return bool((flat[top] - b[top]).min() <= (flat[rest] + b[rest]).max())
        near = ((cov - params.low).abs() <= band) | ((cov - params.high).abs() <= band)
        inside = (cov > params.low - band) & (cov < params.high + band)
        rel = eps * kink_cond
        at_kink = torch.zeros_like(mask)
        for bound in kink_ratios(self.config):
            at_kink |= (ratio - bound).abs() <= rel * bound
        return bool(((near | (inside & at_kink)) & mask).any())

    def _gate_kinks(
        self, x: Mapping[str, torch.Tensor], mask: torch.Tensor, band: torch.Tensor
    ) -> torch.Tensor:
        """DPPO's trust-region gates switch a token on or off where ``p - p_old`` (TV) or
        the binary KL reaches ``delta``: tokens within the rounding band of it are
        ambiguous, like a clip kink (their gradient jumps between 0 and the IS term)."""
        params = self.config.params
        kind = self.config.surrogate
        if kind not in (SurrogateKind.DPPO_TV, SurrogateKind.DPPO_KL) or not isinstance(
            params, DivergenceMask
        ):
            return torch.zeros_like(mask)
        lp = torch.where(mask, x["logprobs"], 0.0)
        old = torch.where(mask, x["old_logprobs"], 0.0)
        p, p_old = torch.exp(lp), torch.exp(old)
        if kind is SurrogateKind.DPPO_TV:
            stat, scale = p - p_old, p + p_old
            targets = (params.delta_high, -params.delta_low)
        else:
            log1m, log1m_old = torch.log(-torch.expm1(lp)), torch.log(-torch.expm1(old))
            stat = p_old * (old - lp) + (1.0 - p_old) * (log1m_old - log1m)
            scale = 1.0 + stat.abs() + p_old * (old - lp).abs()
            targets = (params.delta_high, params.delta_low)
        near = torch.zeros_like(mask)
        for t in targets:
            near |= (stat - t).abs() <= band * scale
        return near & mask

    def _is_undecided(
        self, x: Mapping[str, torch.Tensor], mask: torch.Tensor, eps: float, native: bool
    ) -> bool:
        """Whether a rollout-IS statistic (``log rho`` of a token, its row sum or row mean)
        lies within rounding of a mask/zero-mode bound: each token's ``log rho`` rounds by
        ``eps`` per unit of condition number, a row's sum adds ``1 + log2 n`` roundings of
        ``sum |log rho|`` (Higham Sec. 4.2), and the comparison itself adds the rounding of
        the statistic, of ``rho = exp(stat)`` and of the bound in the function's precision
        (``eps (2 + |stat|)``: 0.999 is 1.0 in bfloat16). Truncation is continuous and never
        undecided; a token (a row) with ``old == rollout`` bitwise (everywhere) has
        ``rho = 1`` in any precision."""
        corr = self.config.is_correction
        if corr is None or corr.mode is ISMode.TRUNCATE:
            return False
        old = torch.where(mask, x["old_logprobs"], 0.0)
        roll = torch.where(mask, x["rollout_logprobs"], 0.0)
        log_rho = old - roll
        cond = (1.0 + log_rho.abs()) if native else (1.0 + old.abs() + roll.abs())
        differs = old != roll
        err = torch.where(differs, eps * cond, 0.0)
        if corr.level is ISLevel.TOKEN:
            stat, band, keep = log_rho, err, mask
        else:
            n = mask.sum(dim=1).clamp(min=1).to(old.dtype)
            summation = eps * (1.0 + torch.log2(n)) * log_rho.abs().sum(dim=1)
            stat, band = log_rho.sum(dim=1), err.sum(dim=1) + summation
            if corr.level is ISLevel.GEOMETRIC:
                stat, band = stat / n, band / n
            keep, differs = mask.any(dim=1), differs.any(dim=1)
        band = band + torch.where(differs, eps * (2.0 + stat.abs()), 0.0)
        logs = [math.log(b) for b in (corr.low, corr.high) if b is not None and b > 0]
        return any(bool((((stat - lb).abs() <= band) & keep).any()) for lb in logs)

    def _kinks(self, ratio: torch.Tensor, mask: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        """Tokens whose ratio lies within ``rel * bound`` of a clip bound. A sequence
        ratio ``exp(mean_t lr_t)`` also carries the mean's summation error (``log2 n``
        roundings, Higham Sec. 4.2), and its whole row is ambiguous."""
        bounds = kink_ratios(self.config)  # where the surrogate changes branch
        if not bounds:
            return torch.zeros_like(mask)
        if self.config.ratio is not RatioKind.TOKEN:
            n = mask.sum(dim=1, keepdim=True).clamp(min=1).to(rel.dtype)
            rel = torch.where(mask, rel, 0.0).amax(dim=1, keepdim=True) * (1.0 + torch.log2(n))
        near = torch.zeros_like(mask)
        for bound in bounds:
            near |= (ratio - bound).abs() <= rel * bound
        if self.config.ratio is not RatioKind.TOKEN:
            near = (near & mask).any(dim=1, keepdim=True).expand_as(mask)
        return near & mask
