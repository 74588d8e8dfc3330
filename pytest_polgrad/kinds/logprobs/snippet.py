"""The logprobs kind's standalone reproduction: the function called as the check called it
(padded, or packed with ``cu_seqlens`` / ``position_ids``), the float64 reference
``token_logprobs`` and its gradient, and what the check compared."""

from __future__ import annotations

from typing import Any

from pytest_polgrad.core.kinds import KindCheck
from pytest_polgrad.core.snippets import check_lines, importable, kind_snippet, pick_line

from .calls import LogprobsContext

__all__ = ["logprobs_snippet"]


def _run_lines(ctx: LogprobsContext, call: str, grad: bool) -> list[str]:
    takes = [n for n in ("logits", ctx.ids_name, "response_mask", "temperature",
                         "cu_seqlens", "position_ids") if n in ctx.takes]  # fmt: skip
    packed = ctx.layout == "packed"
    lines = [
        "",
        "",
        f"def run(inputs, grad={grad}):",
        '    """Call the function as the check did; the result and the gradient w.r.t. logits',
        '    of its sum over the selected positions, both back in the padded [B, T] layout."""',
        "    mask, lengths = inputs['response_mask'], inputs['lengths']",
        "    keep = torch.arange(mask.shape[1])[None, :] < lengths[:, None]",
    ]
    if packed:
        lines += [
            "    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)",
            "    cu[1:] = torch.cumsum(lengths, 0)",
            "    pos = torch.arange(mask.shape[1]).expand(mask.shape)[keep]",
            "    every = {'logits': inputs['logits'][keep], "
            f"{ctx.ids_name!r}: inputs['input_ids'][keep],",
            "             'response_mask': mask[keep], 'cu_seqlens': cu, 'position_ids': pos,",
            "             'temperature': inputs['temperature']}",
            "    sel = mask[keep]",
        ]
    else:
        lines += [
            "    every = {'logits': inputs['logits'], "
            f"{ctx.ids_name!r}: inputs['input_ids'], 'response_mask': mask,",
            "             'temperature': inputs['temperature']}",
            "    sel = mask",
        ]
    lines += [
        "    kw = {n: (v.detach().clone() if torch.is_tensor(v) else v)",
        f"          for n, v in every.items() if n in {takes!r}}}",
        "    if grad:",
        "        kw['logits'].requires_grad_(True)",
        "    before = {k: v.detach().clone() for k, v in kw.items() if torch.is_tensor(v)}",
        f"    out = {call}(**kw)",
        pick_line(ctx.options.loss, "logprobs"),
        "    g = None",
        "    if grad:",
        "        total = torch.where(sel, out, torch.zeros((), dtype=out.dtype)).sum()",
        "        (g,) = torch.autograd.grad(total, kw['logits'])",
    ]
    if packed:
        lines += [
            "    def unpack(x):",
            "        full = torch.zeros((*keep.shape, *x.shape[1:]), dtype=x.dtype)",
            "        full[keep] = x.detach()",
            "        return full",
            "    out = unpack(out)",
            "    g = None if g is None else unpack(g)",
        ]
    lines.append("    return out.detach(), g, kw, before")
    return lines


def logprobs_snippet(ctx: LogprobsContext, inputs: Any, check: KindCheck) -> str:
    """Standalone Python reproducing what ``check`` compared on ``inputs``."""
    ref = ctx.reference
    where = importable(ctx.fn, ctx.name)
    grad = check.name in ("gradient", "masked-vocab", "inputs-unchanged", "deterministic")
    tau = "inputs['temperature']" if ctx.takes_temperature else repr(ref.temperature)
    definitions = [
        *_run_lines(ctx, where.call, grad),
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 reference: {ref.describe()}."""',
        "    z = inputs['logits'].double().clone().requires_grad_(True)",
        f"    lp = token_logprobs(logits=z, input_ids=inputs['input_ids'], shift={ref.shift!r},",
        f"                        align={ref.align!r}, temperature={tau},",
        "                        response_mask=inputs['response_mask'])",
        "    return lp.detach(), torch.autograd.grad(lp.sum(), z)[0]",
    ]
    mask = "inputs['response_mask']"
    rows = (
        f"rows = {mask}.clone()"
        if ref.shift == "none" or ref.align == "logits"
        else f"rows = torch.zeros_like({mask}); rows[:, :-1] = {mask}[:, 1:]  # rows read"
    )
    if check.name == "packed-boundary":
        lines = [
            "",
            "out, grad, passed, before = run(inputs)",
            "# the check: change every other sequence's logits and tokens, one sequence at a time",
            "lengths = inputs['lengths']",
            "keep_cols = torch.arange(out.shape[1])[None, :] < lengths[:, None]",
            "g = torch.Generator().manual_seed(0)",
            "for k in range(len(lengths)):",
            "    mine = torch.zeros_like(keep_cols); mine[k] = keep_cols[k]",
            "    z = inputs['logits']",
            "    junk = (torch.randn(z.shape, generator=g, dtype=torch.float64) * 3).to(z.dtype)",
            "    other = {**inputs, 'logits': torch.where(mine[:, :, None], z, junk)}",
            "    ids = torch.randint(0, z.shape[2], mine.shape, generator=g)",
            "    other['input_ids'] = torch.where(mine, inputs['input_ids'], ids)",
            "    out2, _, _, _ = run(other, grad=False)",
            "    diff = (out2[k] - out[k]).abs()[keep_cols[k]].nan_to_num(float('inf'))",
            "    moved = 0.0 if same(out2[k], out[k]) else diff.max().item()",
            "    print(f'sequence {k}: its outputs move by', moved,",
            "          'when only the other sequences change')",
        ]
    elif check.name in ("gradient", "masked-vocab"):
        lines = [
            "",
            "out, grad, passed, before = run(inputs)",
            "expected, expected_grad = reference(inputs, out)",
            rows,
            "show('function gradient', grad, 'reference gradient', expected_grad, rows)",
            "print('largest |gradient| at rows nobody reads (must be 0):', at_padding(grad, rows))",
        ]
    elif check.name == "padding-values":
        other = [
            "g = torch.Generator().manual_seed(5)",
            "z = inputs['logits']",
            "junk = ((torch.rand(z.shape, generator=g, dtype=torch.float64) * 2 - 1) * 3e3)",
            rows,
            "other = {**inputs, 'logits': torch.where(rows[:, :, None], z, junk.to(z.dtype))}",
        ]
        lines = check_lines(
            "same", other=other, grads=False, what="other logits where nobody reads"
        )
        lines.append("print('largest logprob anywhere (must be <= 0):', out.max().item())")
    elif check.name == "padding-columns":
        other = [
            "pad = torch.nn.functional.pad",
            "other = {**inputs, 'logits': pad(inputs['logits'], (0, 0, 0, 3), value=4.0),",
            "         'input_ids': pad(inputs['input_ids'], (0, 3)),",
            "         'response_mask': pad(inputs['response_mask'], (0, 3), value=False)}",
        ]
        lines = check_lines("same", other=other, grads=False, what="3 more padding columns")
    elif check.name in ("inputs-unchanged", "deterministic"):
        lines = check_lines(check.name)
    else:
        lines = check_lines("value")
    return kind_snippet(
        where,
        imports=["from polgrad_reference.logprobs import token_logprobs"],
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )
