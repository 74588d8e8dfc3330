"""The distributed runner: a real gloo process group, DDP and FSDP2, world sizes 2 and 4.

A correct token-mean step gives the full-batch reference gradient (DAPO arXiv:2503.14476
Eq. 8, the step's global token count) after the framework's own reduction; each known bug
gives it times the factor its scaling implies; a rank that raises, hangs or dies is named;
no process or directory outlives a pass, a failure, a timeout or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from polgrad_reference import policy_loss
from polgrad_reference.errors import ConfigError, InputError, InputTypeError
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.training_step import distributed as D
from pytest_polgrad.kinds.training_step.kind import accumulate
from pytest_polgrad.strategies import Split
from tests.kinds.training_step import distributed_steps as S

REPO = Path(__file__).resolve().parents[3]

SPLITS = {w: S.split_of(w) for w in (2, 4)}
WRAPS = ("ddp", "fsdp")


@pytest.fixture(scope="module", autouse=True)
def _stop_pools() -> Iterator[None]:
    """One pool per world size for the whole module; stopped (and checked gone) after it
    (the zygote stays for the next module's pools)."""
    yield
    states = D.pools()
    D.shutdown(zygote=False)
    for state in states:
        _assert_gone(state)


def _rank_processes() -> set[int]:
    """Rank processes this test process started with the runner, living: its children
    with ``_rank_entry`` on their command line, and the children of its zygote (its
    child with ``_zygote_entry`` on its command line)."""
    me, procs = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        procs.append((int(entry.name), int(ppid), state, cmd))
    zygotes = {pid for pid, ppid, _s, cmd in procs if ppid == me and b"_zygote_entry" in cmd}
    return {
        pid
        for pid, ppid, state, cmd in procs
        if state != "Z"
        and ((ppid == me and b"_rank_entry" in cmd) or (ppid in zygotes and pid not in zygotes))
    }


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _assert_gone(state: D.PoolState) -> None:
    assert state.pids and state.directory
    assert not [p for p in state.pids if _alive(p)], f"rank processes left: {state.pids}"
    assert not os.path.exists(state.directory), f"directory left: {state.directory}"


_SEEN_DIRS: set[str] = set()


def _assert_only_live_pools() -> None:
    """Every rank process this process started belongs to a live pool, and no directory
    of a pool seen before and gone is left."""
    live = D.pools()
    assert _rank_processes() == {p for s in live for p in s.pids}
    dirs = {s.directory for s in live}
    _SEEN_DIRS.update(dirs)
    assert not [d for d in _SEEN_DIRS - dirs if os.path.exists(d)]


def _pool_state(world: int) -> D.PoolState:
    """The live pool of ``world`` ranks (started by a passing call if needed)."""
    for state in D.pools():
        if state.world_size == world:
            _SEEN_DIRS.add(state.directory)
            return state
    batch = S.step_batch()
    D.run_step(S.token_mean_global, batch, SPLITS[world], wrap="ddp")
    return _pool_state(world)


# ------------------------------------------------------------------------ reference


def _reference(batch: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    """DAPO's full-batch loss (token-mean over every token of the step) and its gradient
    in ``logprobs``, float64."""
    x = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in batch.items()}
    lp = x["logprobs"].clone().requires_grad_(True)
    out = policy_loss(S.DAPO, **{**x, "logprobs": lp})
    (grad,) = torch.autograd.grad(out.loss, lp)
    return float(out.loss.detach()), torch.where(x["response_mask"], grad, 0.0)


def _row_factor(split: Split, mask: torch.Tensor, bug: str) -> torch.Tensor:
    """The bug's gradient over the reference's, per row: the bug's row weight times ``N``."""
    n = float(mask.sum())
    out = torch.zeros(mask.shape[0], dtype=torch.float64)
    for rank in split.infos(mask):
        for info in rank:
            w, k = info.world_size, info.gradient_accumulation_steps
            weight = {
                "rank_tokens": 1.0 / (w * info.rank_tokens),
                "mean_of_means": 1.0 / (w * k * info.micro_batch_tokens),
                "accumulation_twice": 1.0 / (n * k),
                "no_world_size": 1.0 / (n * w),
            }[bug]
            out[list(info.rows)] = weight * n
    return out


def _close(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor, rtol: float) -> bool:
    scale = float(expected[mask].abs().max())
    return bool(((actual - expected)[mask].abs() <= rtol * scale).all()) and bool(
        (actual[~mask] == 0).all()
    )


# ------------------------------------------------------------------ correct steps


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize(
    "fn", [S.token_mean_global, S.token_mean_all_reduced], ids=["global", "all-reduced"]
)
def test_correct_token_mean_step_gives_the_full_batch_gradient(
    fn: Callable[..., Any], wrap: str, world: int
) -> None:
    """DDP (no_sync on the first micro-batch) and FSDP2 (gradient sync off on it), after
    their all-reduce / reduce-scatter mean: the gradient of the step's token-mean."""
    batch = S.step_batch()
    out = D.run_step(fn, batch, SPLITS[world], wrap=wrap)
    loss, grad = _reference(batch)
    mask = batch["response_mask"]
    assert (out.wrap, out.world_size, out.backend) == (wrap, world, "gloo")
    assert out.grad.dtype == torch.float64 and out.grad.shape == mask.shape
    assert _close(out.grad, grad, mask, 1e-12)
    assert out.loss == pytest.approx(loss, rel=1e-12)
    _assert_only_live_pools()


@pytest.mark.parametrize("wrap", WRAPS)
def test_a_step_that_calls_backward_itself_is_accumulated_by_the_wrapper(wrap: str) -> None:
    """The trainer's own ``loss.backward()`` inside ``no_sync`` / sync-off: the same
    gradient, and a NaN loss (nothing was returned)."""
    batch = S.step_batch()
    out = D.run_step(S.token_mean_backward_itself, batch, SPLITS[2], wrap=wrap)
    _loss, grad = _reference(batch)
    assert _close(out.grad, grad, batch["response_mask"], 1e-12)
    assert out.loss != out.loss


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize(
    ("dtype", "fn", "rtol"),
    [
        (torch.float64, S.token_mean_global, 1e-12),
        (torch.float32, S.token_mean_global, 1e-5),
        (torch.bfloat16, S.token_mean_float32_inside, 1e-2),
        (torch.bfloat16, S.token_mean_global, 5e-2),
    ],
    ids=["float64", "float32", "bf16-inputs-float32-inside", "bf16"],
)
def test_every_dtype_agrees_with_the_simulated_accumulation(
    dtype: torch.dtype, fn: Callable[..., Any], rtol: float, wrap: str
) -> None:
    """The function sees the simulated check's tensors (its dtype, its micro-batch
    slices): the real reduction and the kit's simulated one agree to float64 rounding,
    and both are the reference within the dtype's precision."""
    name = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}
    opts = ConformanceOptions("dapo", kind="training_step", dtype=name[dtype])
    ctx = build_context(fn, opts)
    batch = S.step_batch(dtype)
    inputs = {**batch, "split": SPLITS[2]}
    simulated = accumulate(ctx, inputs)
    real = D.accumulate_distributed(ctx, inputs, wrap=wrap)
    mask = batch["response_mask"]
    assert torch.allclose(real.grad, simulated.grad, rtol=1e-12, atol=1e-15)
    assert real.loss == pytest.approx(simulated.loss, rel=1e-12)
    loss, grad = _reference(batch)
    assert _close(real.grad, grad, mask, rtol)
    assert real.loss == pytest.approx(loss, rel=rtol, abs=rtol)


def test_inputs_written_in_place_are_named_per_rank_and_micro_batch() -> None:
    batch = S.step_batch()
    out = D.run_step(S.modifies_advantages, batch, SPLITS[2], wrap="ddp", snapshot=True)
    assert out.changed == tuple(
        f"rank {r} micro-batch {k}: advantages" for r in range(2) for k in range(2)
    )
    clean = D.run_step(S.token_mean_global, batch, SPLITS[2], wrap="ddp", snapshot=True)
    assert clean.changed == ()


# ---------------------------------------------------------------------- known bugs

BUGS: dict[str, Callable[..., torch.Tensor]] = {
    "rank_tokens": S.bug_rank_tokens,
    "mean_of_means": S.bug_mean_of_means,
    "accumulation_twice": S.bug_accumulation_twice,
    "no_world_size": S.bug_no_world_size,
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("bug", list(BUGS))
def test_a_known_bug_changes_the_gradient_by_its_factor(bug: str, wrap: str, world: int) -> None:
    """Per-rank token count without all-reduce (prime-rl #2562), mean of micro-batch means
    (SkyRL #1296), 1/gas twice (ms-swift #10116), missing x world_size (verl #4510): the
    real reduction gives the reference times the row factor the bug implies, not 1."""
    batch = S.step_batch()
    split = SPLITS[world]
    mask = batch["response_mask"]
    out = D.run_step(BUGS[bug], batch, split, wrap=wrap)
    _loss, grad = _reference(batch)
    factor = _row_factor(split, mask, bug)
    assert bool((factor - 1.0).abs().max() > 0.1)
    assert _close(out.grad, grad * factor[:, None], mask, 1e-12)
    assert not _close(out.grad, grad, mask, 1e-3)


# --------------------------------------------------------------------- bad input


def test_bad_arguments_are_refused_before_any_rank_starts() -> None:
    batch, split = S.step_batch(), SPLITS[2]
    before = _rank_processes()
    with pytest.raises(ConfigError, match="wrap must be one of"):
        D.run_step(S.token_mean_global, batch, split, wrap="deepspeed")
    with pytest.raises(ConfigError, match="timeout must be a positive"):
        D.run_step(S.token_mean_global, batch, split, timeout=0)
    with pytest.raises(ConfigError, match="device must be 'cpu' or 'cuda'"):
        D.run_step(S.token_mean_global, batch, split, device="tpu")
    if torch.cuda.device_count() < 2:
        with pytest.raises(ConfigError, match="world_size=2 needs 2 GPUs"):
            D.run_step(S.token_mean_global, batch, split, device="cuda")
    with pytest.raises(InputError, match=r"split covers 2 rows but batch\['response_mask'\] has 8"):
        D.run_step(S.token_mean_global, batch, Split((((0,),), ((1,),))))

    def local_step(logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        return torch.where(response_mask, logprobs, 0.0).sum()

    with pytest.raises(InputTypeError, match="module-level function importable by name"):
        D.run_step(local_step, batch, split)
    assert _rank_processes() == before


# ---------------------------------------------------------------------- failures


def test_an_exception_in_rank_1_is_named_and_every_rank_is_killed() -> None:
    """The function's exception, as one line naming the rank, micro-batch and rows; the
    pool is gone and the next call starts a fresh one, forked by the same zygote."""
    state = _pool_state(2)
    zygotes = {_parent(p) for p in state.pids}
    assert len(zygotes) == 1 and os.getpid() not in zygotes, zygotes
    batch = S.step_batch()
    with pytest.raises(D.RankFailed) as info:
        D.run_step(S.raises_on_rank_1, batch, SPLITS[2])
    text = str(info.value)
    assert info.value.rank == 1
    assert text.startswith("the function raised on rank 1 micro-batch 0 (rows [4, 5])")
    assert "ValueError: boom on rank 1" in text and "distributed_steps.py" in text
    assert "Traceback" not in text
    _assert_gone(state)
    _assert_only_live_pools()
    out = D.run_step(S.token_mean_global, batch, SPLITS[2])  # a fresh pool for the next call
    assert _close(out.grad, _reference(batch)[1], batch["response_mask"], 1e-12)
    fresh = _pool_state(2).pids
    assert not set(fresh) & set(state.pids)
    assert {_parent(p) for p in fresh} == zygotes


def test_a_hanging_rank_is_killed_after_the_timeout_and_named() -> None:
    """Rank 1 sleeps in the function, rank 0 waits for it in DDP's all-reduce: the verdict
    (from the ranks' stacks) names rank 1 and where it was; every rank is killed."""
    state = _pool_state(2)
    batch = S.step_batch()
    with pytest.raises(D.RankTimeout) as info:
        D.run_step(S.hangs_on_rank_1, batch, SPLITS[2], timeout=2)  # short: it only waits
    text = str(info.value)
    assert info.value.rank == 1
    assert text.startswith("rank 1 hung:") and "within 2 s" in text
    assert "rank 1 was in the function on micro-batch 0 at" in text
    assert "distributed_steps.py" in text and "in hangs_on_rank_1" in text
    assert "rank 0 waited in the backward pass's gradient reduction on micro-batch 1" in text
    _assert_gone(state)
    _assert_only_live_pools()


def test_a_rank_that_ends_its_process_is_named() -> None:
    """``os._exit`` on rank 1: named as the cause, not rank 0 whose all-reduce then broke."""
    state = _pool_state(2)
    with pytest.raises(D.RankDied) as info:
        D.run_step(S.exits_on_rank_1, S.step_batch(), SPLITS[2])
    assert info.value.rank == 1
    assert "rank 1 ended (exit code 7) during micro-batch 0" in str(info.value)
    _assert_gone(state)
    _assert_only_live_pools()


# ------------------------------------------------------------ a whole interpreter

_SCRIPT = """
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored in a shell's `(cmd &)`
sys.path[:0] = [{repo!r}]
import torch
from pytest_polgrad.kinds.training_step import distributed as D
from tests.kinds.training_step import distributed_steps as S


def own_step(logprobs, response_mask, global_tokens, world_size):
    # defined in the script: the ranks run it as __mp_main__ (the block below does not run)
    return torch.where(response_mask, logprobs, 0.0).sum() / global_tokens * world_size


if __name__ == "__main__":
    D._FORK = sys.argv[1] != "pass"  # "pass": ranks as interpreters of their own, no zygote
    D.run_step(S.token_mean_global, S.step_batch(), S.split_of(2), wrap="fsdp")
    (state,) = D.pools()
    own = D.run_step(own_step, S.step_batch(), S.split_of(2), wrap="ddp")
    mask = S.step_batch()["response_mask"]
    expected = torch.where(mask, 1.0 / mask.sum(), 0.0).to(torch.float64)
    zygote = D._ZYGOTE.proc.pid if D._ZYGOTE is not None and D._ZYGOTE.proc else None
    parents = [open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1] for p in state.pids]
    print(json.dumps({{"pids": state.pids, "directory": state.directory, "zygote": zygote,
                       "forked": [int(p) == zygote for p in parents],
                       "own": bool(torch.allclose(own.grad, expected, rtol=1e-15))}}), flush=True)
    if sys.argv[1] == "hang":
        try:
            D.run_step(S.hangs_on_rank_1, S.step_batch(), S.split_of(2), timeout=600)
        except KeyboardInterrupt:  # what is left at this moment, before atexit runs
            alive = [p for p in state.pids if os.path.exists(f"/proc/{{p}}")]
            D.shutdown(zygote=False)
            kept = os.path.exists(f"/proc/{{zygote}}")
            D.shutdown()
            left = {{"pools": len(D.pools()), "alive": alive,
                     "directory": os.path.exists(state.directory),
                     "zygote": [kept, os.path.exists(f"/proc/{{zygote}}")]}}
            print(json.dumps(left), flush=True)
            raise
"""


def _script(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], D.PoolState, dict[str, Any]]:
    path = tmp_path / "run.py"
    path.write_text(textwrap.dedent(_SCRIPT.format(repo=str(REPO))))
    env = {**os.environ, S.HANG_MARK: str(tmp_path / "hanging")}
    proc = subprocess.Popen(
        [sys.executable, str(path), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"the script printed nothing: {proc.communicate()[1]}")
    data = json.loads(line)
    assert data["own"], "the script's own __main__ step gave a wrong gradient"
    return proc, D.PoolState(2, "gloo", "cpu", tuple(data["pids"]), data["directory"]), data


def _wait_gone(state: D.PoolState, zygote: int | None = None) -> None:
    """Orphans are reaped by init asynchronously: give them up to 30 s, then check (the
    ranks, the directory, the zygote)."""
    pids = [*state.pids, *([] if zygote is None else [zygote])]
    end = time.monotonic() + 30
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    _assert_gone(state)
    assert zygote is None or not _alive(zygote), f"zygote {zygote} left"


def test_an_interpreter_that_exits_after_a_pass_leaves_nothing(tmp_path: Path) -> None:
    """The pool stays up between calls (a step from the script's own ``__main__`` runs on
    it too); at exit (atexit) its ranks and directory go. The ranks here are interpreters
    of their own (no zygote: the path taken when none can fork)."""
    proc, state, data = _script(tmp_path, "pass")
    assert data["zygote"] is None and data["forked"] == [False, False], data
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    _wait_gone(state)


def test_ctrl_c_in_the_parent_kills_every_rank_and_removes_the_directory(
    tmp_path: Path,
) -> None:
    """SIGINT to the parent's process group (what a terminal's Ctrl-C sends) while rank 1
    hangs: KeyboardInterrupt in the parent, every rank killed, the directory removed; the
    zygote that forked the ranks (and ran the script's ``__main__`` step) is kept by
    ``shutdown(zygote=False)`` and stopped by ``shutdown()``."""
    proc, state, data = _script(tmp_path, "hang")
    assert data["zygote"] and data["forked"] == [True, True], data
    mark = tmp_path / "hanging"
    end = time.monotonic() + 120
    while not mark.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate()[1]
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    left = json.loads(out.strip().splitlines()[-1])
    # shutdown(zygote=False) kept the zygote, shutdown() stopped it
    assert left == {"pools": 0, "alive": [], "directory": False, "zygote": [True, False]}, left
    _wait_gone(state, data["zygote"])
