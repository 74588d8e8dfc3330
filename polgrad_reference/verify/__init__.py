"""Verification as public API: the harness ``polgrad_reference`` itself is tested with.

- :func:`gradcheck_policy_loss` — float64 autograd vs central finite differences of any
  loss config, stop-gradients frozen at the base point (:class:`FrozenStopGradients`), over
  :func:`ragged_batch` batches that reach every clip region.
- :func:`check_gradient_formula` — a user's closed-form gradient vs finite differences
  and autograd: fails on a wrong derivation and on wrong code.
- :class:`SoftmaxBandit` — closed-form policy gradient and KL; :func:`kl_loss_gradient`
  (Monte Carlo expected gradient of a KL estimator used as a loss) and :func:`train`
  (a registry algorithm optimising the bandit).
- :data:`GOLDEN_CASES` / :func:`check_golden` — hand-derived cases
  (``docs/derivations/goldens.md``).

Stop-gradients must be written as ``Tensor.detach`` (not ``torch.no_grad()`` regions),
so that the frozen formulation sees them.
"""

from __future__ import annotations

from ._frozen import FrozenStopGradients
from .bandit import GradientEstimate, SoftmaxBandit, TrainingRun, kl_loss_gradient, train
from .finite_differences import FormulaCheck, check_gradient_formula
from .goldens import GOLDEN_CASES, GoldenCase, check_golden, goldens_markdown
from .gradcheck import GradcheckResult, VerificationError, gradcheck_policy_loss, ragged_batch

__all__ = [
    "GOLDEN_CASES",
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
