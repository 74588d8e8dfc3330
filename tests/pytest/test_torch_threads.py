"""``--polgrad-torch-threads`` (``pytest_polgrad/pytest/threads.py``): under pytest-xdist each
worker gets its share of the CPUs at the first polgrad item; outside xdist, or with
``OMP_NUM_THREADS`` set, torch is left alone; ``N`` and ``keep`` do what they say; a bad
value is one usage error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pytest_polgrad.pytest import threads
from tests.helpers import inline_run

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = torch.get_num_threads()
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("raw", ["auto", "keep", "1", "12", None])
def test_valid_settings(raw: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_cpus", lambda: 12)
    assert threads.parse(raw, "x") == (raw or "auto")


@pytest.mark.parametrize("raw", ["0", "-2", "many", "1.5", "", "13", "100000"])
def test_a_bad_setting_names_the_option_and_the_value(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Including an empty value and more threads than CPUs (torch 2.13 segfaults at
    100000 threads instead of refusing them: new-user trial)."""
    monkeypatch.setattr(threads, "_cpus", lambda: 12)
    with pytest.raises(
        ValueError,
        match=rf"--opt must be 'auto', 'keep' or a number of threads from 1 to 12 \(the "
        rf"CPUs this process may use\), got '{raw}'",
    ):
        threads.parse(raw, "--opt")


def test_the_share_is_the_cpus_over_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_cpus", lambda: 8)
    worker = SimpleNamespace(workerinput={"workercount": 3})
    assert threads.share(worker) == 2
    assert threads.share(SimpleNamespace(workerinput={"workercount": 16})) == 1
    assert threads.share(SimpleNamespace()) is None  # not an xdist worker
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert threads.share(SimpleNamespace()) == 2  # the environment xdist sets
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.share(worker) is None  # the user decided


def test_apply_sets_only_what_it_should(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_cpus", lambda: 8)
    worker = SimpleNamespace(workerinput={"workercount": 4})
    torch.set_num_threads(6)
    threads.apply("keep", worker)
    assert torch.get_num_threads() == 6
    threads.apply("auto", SimpleNamespace())
    assert torch.get_num_threads() == 6  # outside xdist: untouched
    threads.apply("auto", worker)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    threads.apply("auto", worker)
    assert torch.get_num_threads() == 1  # already fewer: never raised
    threads.apply("3", SimpleNamespace())
    assert torch.get_num_threads() == 3


PROJECT = """
import pytest
import torch
from tests.helpers import sample_losses as L


@pytest.mark.polgrad_conforms("dapo", checks=["value"], max_batch=2, max_length=8)
def loss(logprobs, old_logprobs, advantages, response_mask):
    return L.dapo(logprobs, old_logprobs, advantages, response_mask)


def test_zz_threads():
    assert torch.get_num_threads() == {expected}, torch.get_num_threads()
"""


@pytest.mark.parametrize(
    ("args", "workers", "expected"),
    [
        ((), "4", 1),
        (("--polgrad-torch-threads=keep",), "4", 5),
        (("--polgrad-torch-threads=2",), None, 2),
    ],
    ids=["auto-in-a-worker", "keep", "two"],
)
def test_the_plugin_applies_it_at_the_first_item(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    workers: str | None,
    expected: int,
) -> None:
    monkeypatch.setattr(threads, "_cpus", lambda: 4)
    env = {} if workers is None else {"PYTEST_XDIST_WORKER_COUNT": workers}
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    torch.set_num_threads(5)
    pytester.makepyfile(test_threads=PROJECT.format(expected=expected))
    # setting torch's threads is the plugin's job here; _restore_threads puts them back
    result = inline_run.run(
        pytester,
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        *args,
        env=env,
        may_change=["torch threads"],
    )
    result.assert_outcomes(passed=2)


def test_a_bad_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npolgrad_torch_threads = lots\n")
    result = inline_run.run(pytester, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*ini option polgrad_torch_threads must be 'auto', 'keep' or a number of threads from "
            "1 to *, got 'lots'*"
        ]
    )
