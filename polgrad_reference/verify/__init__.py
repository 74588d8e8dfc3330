"""Verification as public API: the harness ``polgrad_reference`` itself is tested with.

- :func:`gradcheck_policy_loss` — float64 autograd vs central finite differences of a
  loss config, a registry name or the user's own loss function (the policy-loss calling
  convention), stop-gradients frozen at the base point (:class:`FrozenStopGradients`),
  over :func:`ragged_batch` batches that reach every clip region.
- :func:`check_gradient_formula` — a user's closed-form gradient vs finite differences
  and autograd: fails on a wrong derivation and on wrong code, and says which (a missing
  or extra stop-gradient is named as such).
- :class:`SoftmaxBandit` — closed-form policy gradient and KL; :func:`kl_loss_gradient`
  (Monte Carlo expected gradient of a KL estimator used as a loss) and :func:`train`
  (a registry algorithm, a config or the user's own loss optimising the bandit).
- :data:`GOLDEN_CASES` / :func:`check_golden` — hand-derived cases
  (``docs/derivations/goldens.md``).

A stop-gradient is any operation whose inputs carry a gradient and whose result does not
(``detach`` in any spelling, ``.data``, ``detach_``, ``torch.no_grad()`` regions,
``.item()``), so the frozen formulation sees it however it is written.
"""

from __future__ import annotations

from ._frozen import CodePathChanged, FrozenStopGradients
from .bandit import GradientEstimate, SoftmaxBandit, TrainingRun, kl_loss_gradient, train
from .finite_differences import FormulaCheck, check_gradient_formula
from .goldens import GOLDEN_CASES, GoldenCase, check_golden, goldens_markdown
from .gradcheck import GradcheckResult, VerificationError, gradcheck_policy_loss, ragged_batch

__all__ = [
    "GOLDEN_CASES",
    "CodePathChanged",
    "FormulaCheck",
    "FrozenStopGradients",
    "GoldenCase",
    "GradcheckResult",
    "GradientEstimate",
    "SoftmaxBandit",
    "TrainingRun",
    "VerificationError",
    "check_golden",
    "check_gradient_formula",
    "goldens_markdown",
    "gradcheck_policy_loss",
    "kl_loss_gradient",
    "ragged_batch",
    "train",
]
