"""The policy loss's reproduction snippet: standalone Python that rebuilds the batch, calls
the function exactly as the check did (layout, parameter names, device, the re-garbaged /
widened / micro-batched batch) and the float64 reference, and prints what the check
compared. How the snippet gets the function, and its opening line saying how to run it,
are every kind's (:mod:`pytest_polgrad.core.snippets`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polgrad_reference import Aggregation, RatioKind, SurrogateKind
from pytest_polgrad.core.snippets import (
    Importable,
    config_import,
    config_source,
    how_to_run,
    import_lines,
    importable,
)

if TYPE_CHECKING:
    from pytest_polgrad.kinds.policy_loss.checks import Check, Context

__all__ = [
    "deterministic_lines",
    "extreme_finite_lines",
    "inputs_unchanged_lines",
    "micro_batch_lines",
    "on_policy_lines",
    "padding_columns_lines",
    "padding_values_lines",
    "reference_compare",
    "snippet",
]


def _header(cfg: Any, where: Importable) -> list[str]:
    return [*import_lines(where), config_import(cfg)]


def _runner(ctx: Context, where: Importable) -> list[str]:
    """``run(batch)``: the check's call of the function on a canonical batch."""
    layout = ctx.options.layout
    device = str(getattr(ctx.options, "device", "cpu"))
    params = dict(ctx.fut.parameters)
    lp = params["logprobs"]
    token_adv = ctx.options.advantages == "token"
    lines = [
        "",
        f"PARAMS = {params!r}  # input -> the function's parameter",
        "",
        "",
        "def run(batch):",
        '    """Call the function as the check did; returns (loss, right-padded grad, inputs'
        ' as passed, copies taken before the call)."""',
        "    kw = {}",
    ]
    if layout != "right":
        lines.append("    extents = row_extents(batch['response_mask'])")
    lines += [
        "    for name, param in PARAMS.items():",
    ]
    if layout == "packed":
        lines += [
            "        if name == 'cu_seqlens':",
            "            kw[param] = pack(batch['response_mask'], extents)[1]",
            "            continue",
        ]
    lines += [
        "        if name not in batch:",
        "            continue",
        "        t = batch[name].detach().clone()",
    ]
    if layout != "right":
        convert = "right_to_left(t, extents)" if layout == "left" else "pack(t, extents)[0]"
        moves = "t.dim() == 2" if token_adv else "t.dim() == 2 and name != 'advantages'"
        lines.append(f"        t = {convert} if {moves} else t")
    lines.append(
        f"        kw[param] = t.to({device!r})" if device != "cpu" else "        kw[param] = t"
    )
    lines += [
        f"    kw[{lp!r}].requires_grad_(True)",
        "    before = {k: v.detach().clone() for k, v in kw.items()}",
        f"    out = {where.call}(**kw)",
        _pick_line(ctx),
        f"    (grad,) = torch.autograd.grad(loss, kw[{lp!r}])",
        "    grad = grad.cpu()",
    ]
    if layout == "left":
        lines.append("    grad = left_to_right(grad, extents)")
    elif layout == "packed":
        lines.append(
            "    grad = unpack(grad, pack(batch['response_mask'], extents)[1], "
            "width=batch['response_mask'].shape[1])"
        )
    lines.append("    return loss.detach().cpu(), grad, kw, before")
    return lines


def _pick_line(ctx: Context) -> str:
    key = ctx.options.loss
    if key is not None:
        return f"    loss = out[{key!r}]"
    return (
        "    loss = out[0] if isinstance(out, (tuple, list)) else "
        "out['loss'] if isinstance(out, dict) else out"
    )


def _reference_lines(ctx: Context) -> list[str]:
    needs = ctx.oracle.needs
    lines = [
        "",
        "",
        "def reference(batch):",
        '    """The float64 reference loss and d loss / d logprobs on the same tensors."""',
        "    lp = batch['logprobs'].detach().double().requires_grad_(True)",
        "    ref_inputs = dict(logprobs=lp, old_logprobs=batch['old_logprobs'].double(),",
        "                      advantages=batch['advantages'].double(),",
        "                      response_mask=batch['response_mask'])",
        *[f"    ref_inputs[{n!r}] = batch[{n!r}].double()" for n in needs],
        "    expected = policy_loss(config, **ref_inputs).loss",
        "    return expected.item(), torch.autograd.grad(expected, lp)[0]",
    ]
    return lines


_COMPARE = [
    "print('function:', loss.item(), ' reference:', expected)",
    "mask = inputs['response_mask']",
    "diff = (grad.double() - expected_grad).abs().masked_fill(~mask, 0.0)",
    "print('largest gradient difference at a response position:', diff.max().item(),",
    "      'at (b, t) =', divmod(int(diff.argmax()), diff.shape[1]))",
    "print('largest |gradient| at padding (must be 0):',",
    "      grad.masked_fill(mask, 0.0).abs().max().item())",
]


def _self_compare(label: str) -> list[str]:
    return [
        f"print('loss:', loss.item(), ' {label}:', loss2.item())",
        "width = inputs['response_mask'].shape[1]",
        "mask = inputs['response_mask']",
        "gdiff = (grad.double() - grad2[:, :width].double()).abs().masked_fill(~mask, 0.0)",
        f"print('largest gradient difference at a response position, {label}:',",
        "      gdiff.max().item())",
    ]


def reference_compare(ctx: Context) -> list[str]:
    """The lines of a check that compares the function's loss and gradient with the
    reference's (value, gradient, masked positions; the default of a :class:`Check`)."""
    return ["expected, expected_grad = reference(inputs)", *_COMPARE]


def padding_values_lines(ctx: Context) -> list[str]:
    """padding-values: the same batch with other values (NaN with ``padding_nan``) at
    padding, seed 1234, against the original."""
    fill = "torch.full_like(t, float('nan'))" if ctx.options.padding_nan else "noise"
    return [
        "# the check: the same batch with other values at padding (seed 1234)",
        "g = torch.Generator().manual_seed(1234)",
        "other = dict(inputs)",
        "for name, t in inputs.items():",
        "    if t.is_floating_point() and t.dim() == 2:",
        "        noise = torch.rand(t.shape, generator=g, dtype=torch.float64) * -20",
        "        noise = noise.to(t.dtype)",
        f"        other[name] = torch.where(inputs['response_mask'], t, {fill})",
        "loss2, grad2, _, _ = run(other)",
        *_self_compare("other padding values"),
    ]


def padding_columns_lines(ctx: Context) -> list[str]:
    """padding-columns: the same batch with ``T + 3`` padding columns appended."""
    return [
        "# the check: the same batch with T + 3 padding columns appended",
        "extra = inputs['response_mask'].shape[1] + 3",
        "wide = {}",
        "for name, t in inputs.items():",
        "    if t.dim() != 2:",
        "        wide[name] = t",
        "    else:",
        "        fill = False if t.dtype == torch.bool else -7.0",
        "        pad = torch.full((t.shape[0], extra), fill, dtype=t.dtype)",
        "        wide[name] = torch.cat([t, pad], dim=1)",
        "loss2, grad2, _, _ = run(wide)",
        *_self_compare("with padding columns"),
    ]


def micro_batch_lines(ctx: Context) -> list[str]:
    """micro-batch: one-row micro-batches, losses accumulated in float64 with the
    aggregation's scaling (sum for token-sum, else mean)."""
    total = "sum" if ctx.config.aggregation is Aggregation.TOKEN_SUM else "mean"
    scale = "1.0" if total == "sum" else "1.0 / rows"
    return [
        f"# the check: one-row micro-batches, losses accumulated in float64 ({total})",
        "rows = inputs['response_mask'].shape[0]",
        f"scale = {scale}",
        "total, parts = 0.0, []",
        "for b in range(rows):",
        "    part_loss, part_grad, _, _ = run({k: v[b : b + 1] for k, v in inputs.items()})",
        "    total += part_loss.item() * scale",
        "    parts.append(part_grad.double() * scale)",
        "loss2, grad2 = torch.tensor(total, dtype=torch.float64), torch.cat(parts)",
        *_self_compare("accumulated micro-batches"),
    ]


def deterministic_lines(ctx: Context) -> list[str]:
    """deterministic: a second call on the same batch, compared bitwise."""
    return [
        "loss2, grad2, _, _ = run(inputs)",
        "print('same loss twice:', torch.equal(loss, loss2),",
        "      ' same gradient twice:', torch.equal(grad.nan_to_num(), grad2.nan_to_num()))",
    ]


def inputs_unchanged_lines(ctx: Context) -> list[str]:
    """inputs-unchanged: the inputs as passed against the copies taken before the call."""
    return [
        "changed = [k for k, v in before.items()",
        "           if not torch.equal(v.nan_to_num(), passed[k].detach().nan_to_num())]",
        "print('inputs modified in place:', changed)",
        *reference_compare(ctx),
    ]


def extreme_finite_lines(ctx: Context) -> list[str]:
    """extreme-finite: whether the loss and every gradient entry are finite."""
    return [
        "print('loss finite:', bool(torch.isfinite(loss)),",
        "      ' non-finite gradient entries:', int((~torch.isfinite(grad)).sum()))",
        *reference_compare(ctx),
    ]


def on_policy_lines(ctx: Context) -> list[str]:
    """on-policy: only the gradients are compared (the snippet's reference is REINFORCE,
    whose loss is not the function's)."""
    return [
        "expected, expected_grad = reference(inputs)",
        "print('loss (not compared: the check compares gradients only):', loss.item())",
        *_COMPARE[1:],
    ]


def snippet(ctx: Context, batch: Any, check: Check) -> str:
    """Standalone Python reproducing what ``check`` did on ``batch`` (see the module
    docstring): its call, then its own lines (:attr:`Check.lines
    <pytest_polgrad.kinds.policy_loss.checks.Check.lines>`); opening, as every kind's
    snippet does, with a comment saying how to run it (:func:`how_to_run`). An on-policy
    check's reference is REINFORCE's config."""
    where = importable(ctx.fut.fn, getattr(ctx, "name", ""))
    cfg = ctx.config
    if check.on_policy:
        cfg = cfg.replace(surrogate=SurrogateKind.REINFORCE, ratio=RatioKind.TOKEN)
    lines = [f"# pytest-polgrad reproduction: {how_to_run(where)}", *_header(cfg, where)]
    if ctx.options.layout != "right":
        lines.append(
            "from pytest_polgrad.strategies import left_to_right, pack, right_to_left, "
            "row_extents, unpack"
        )
    comment = "  # on-policy: the expected gradient is REINFORCE's" if check.on_policy else ""
    lines += ["", f"config = {config_source(cfg)}{comment}"]
    built = [ln for ln in batch.to_snippet().rstrip().splitlines() if ln != "import torch"]
    lines += ["", *built]
    lines += _runner(ctx, where)
    lines += _reference_lines(ctx)
    lines += ["", "loss, grad, passed, before = run(inputs)", *check.lines(ctx)]
    return "\n".join(lines) + "\n"
