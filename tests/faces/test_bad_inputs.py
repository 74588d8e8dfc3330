"""Bad inputs to the plugin, the marker, ``assert_conforms``, the ``which`` CLI and the
snapshot files: each gets a clear error of a named type whose message names the argument
and what was expected (issue 15). Table-driven; ``BAD_INPUT_COUNT`` counts the rows.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_polgrad.__main__ import main
from pytest_polgrad.core.options import MarkerError, parse_marker
from tests.helpers import inline_run

pytest_plugins = ["pytester"]


def dapo(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


# ------------------------------------------------------------------ marker options

MARKER_CASES: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
    (("dapo",), {"tolerance": math.inf}, r"tolerance must be a multiplier in \(0, 1000\]"),
    (("dapo",), {"tolerance": 1e300}, r"tolerance must be a multiplier in \(0, 1000\]"),
    (("dapo",), {"tolerance": 0}, "tolerance must be a multiplier"),
    (("dapo",), {"tolerance": -1.0}, "tolerance must be a multiplier"),
    (("dapo",), {"tolerance": math.nan}, "tolerance must be a multiplier"),
    (("dapo",), {"tolerance": "2"}, "tolerance must be a multiplier"),
    (("dapo",), {"tolerance": True}, "tolerance must be a multiplier"),
    (("dapo",), {"checks": "valu"}, r"unknown check 'valu' \(did you mean 'value'\?\)"),
    (("dapo",), {"checks": ("value", "gradiant")}, r"did you mean 'gradient'\?"),
    (("dapo",), {"checks": 3}, "checks must be a check name or a tuple"),
    (("dapo",), {"expect": {"valu": "x"}}, r"expect names unknown check 'valu' \(did you mean"),
    (("dapo",), {"expect": {"value": ""}}, "must be a non-empty reason string"),
    (("dapo",), {"expect": {"value": 3}}, "must be a non-empty reason string"),
    (("dapo",), {"expect": {"value": ("r", math.inf)}}, r"max_error must be a number"),
    (("dapo",), {"expect": {"value": ("r", -1)}}, r"max_error must be a number"),
    (("dapo",), {"expect": {"value": ("r", 1, 2)}}, r"must be 'reason' or \('reason', max_error\)"),
    (("dapo",), {"expect": ["value"]}, "expect must be a dict"),
    (("dapo",), {"kind": "polcy_loss"}, r"kind must be one of .* \(did you mean 'policy_loss'\?\)"),
    (("dapo",), {"kind": 3}, "kind must be one of"),
    (("dapo",), {"device": "gpu"}, "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    (("dapo",), {"device": "cuda:x"}, "device must be"),
    (("dapo",), {"holes": "yes"}, "holes must be a bool, got 'yes'"),
    (("dapo",), {"strict": 1}, "strict must be a bool"),
    (("dapo",), {"layout": "rigth"}, r"layout must be one of .* \(did you mean 'right'\?\)"),
    (("dapo",), {"dtype": "float33"}, r"dtype must be one of .*did you mean 'float32'"),
    (("dapo",), {"advantages": "tokens"}, r"did you mean 'token'\?"),
    (("dapo",), {"epslow": 0.1}, r"unknown option\(s\) \['epslow'\] \(did you mean 'eps_low'\?\)"),
    (("dapo",), {"overrides": {"eps_hgh": 0.2}}, r"unknown override\(s\) \['eps_hgh'\] \(did you"),
    (("dapo",), {"overrides": [1]}, "overrides must be a dict"),
    (("dapo",), {"max_examples": 0}, "max_examples must be a positive int, got 0"),
    (("dapo",), {"max_batch": 0}, "max_batch must be a positive int"),
    (("dapo",), {"loss": 1.5}, "loss must be a key"),
    ((), {}, "takes exactly one positional argument"),
    (("dapo", "grpo"), {}, "takes exactly one positional argument"),
    ((3,), {}, "reference must be a registry name"),
]


@pytest.mark.parametrize(("args", "kwargs", "words"), MARKER_CASES)
def test_bad_marker_options(args: tuple[Any, ...], kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(MarkerError, match=words):
        parse_marker(args, kwargs)


CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "grpo",
        {"aggregation": "seq-mean"},
        r"\(did you mean 'seq-mean-token-mean' or 'seq-mean-token-sum'\?\)$",
    ),
    ("grpo", {"aggregation": "tokn-mean"}, r"got 'tokn-mean'.*did you mean 'token-mean'\?$"),
    ("grpo", {"eps_low": -0.2}, r"got -0\.2$"),
    ("grpo", {"eps_high": "0.28"}, r"got '0\.28'$"),
    ("gpro", {}, r"unknown algorithm 'gpro' \(did you mean 'grpo'\?\)"),
]


@pytest.mark.parametrize(("reference", "kwargs", "words"), CONFIG_CASES)
def test_a_bad_override_gets_a_hint_about_its_own_value(
    reference: str, kwargs: dict[str, Any], words: str
) -> None:
    """The collection error of a marker whose reference config cannot be built: a value
    outside a list of choices gets the closest choice, a known reference is never offered
    as the fix for another argument's error (it was: "... got -0.2 (did you mean 'grpo'?)")."""
    from pytest_polgrad.core.engine import resolve_config
    from pytest_polgrad.pytest.collect import reference_hint

    options = parse_marker((reference,), kwargs)
    with pytest.raises((ValueError, TypeError)) as info:
        resolve_config(options)
    text = f"{info.value}{reference_hint(options, str(info.value))}"
    assert re.search(words, text), text
    assert reference == "gpro" or "did you mean 'grpo'" not in text


def test_checks_given_as_a_string_is_one_check() -> None:
    assert parse_marker(("dapo",), {"checks": "value"}).checks == ("value",)
    declared = parse_marker(("dapo",), {"expect": {"value": ("clip 0.2", 40)}})
    assert declared.expect == {"value": "clip 0.2"} and declared.expect_bounds == {"value": 40.0}


# ------------------------------------------------------------------ assert_conforms

API_CASES: list[tuple[Callable[..., Any], str, dict[str, Any], type[Exception], str]] = [
    (dapo, "gpro", {}, ValueError, r"unknown algorithm 'gpro'"),
    (dapo, "dapo", {"checks": ["golden"]}, ValueError, "golden runs only under pytest"),
    (dapo, "dapo", {"expect": {"golden": "x"}}, ValueError, "runs only under pytest"),
    (
        dapo,
        "dapo",
        {"expect": {"micro-batch": "n/a"}},
        ValueError,
        r"expect= names \['micro-batch'\]",
    ),
    (dapo, "dapo", {"tolerance": math.inf}, ValueError, "tolerance must be a multiplier"),
    (dapo, "dapo", {"seed": "abc"}, ValueError, "seed must be an int, got str 'abc'"),
    (dapo, "dapo", {"seed": 1.5}, ValueError, "seed must be an int, got float 1.5"),
    (dapo, "dapo", {"seed": True}, ValueError, "seed must be an int"),
    (dapo, "dapo", {"seed": None}, ValueError, "seed must be an int"),
    (dapo, "dapo", {"name": 3}, ValueError, "name must be a non-empty string"),
    (dapo, "dapo", {"name": ""}, ValueError, "name must be a non-empty string"),
    (dapo, "dapo", {"loss": True}, ValueError, r"loss must be a key \(str\) or index"),
    (dapo, "dapo", {"id": 5}, ValueError, "id must be a non-empty printable string"),
    (dapo, "dapo", {"id": "a\nb"}, ValueError, "id must be a non-empty printable string"),
]


@pytest.mark.parametrize(("fn", "reference", "options", "error", "words"), API_CASES)
def test_bad_assert_conforms_calls(
    fn: Callable[..., Any],
    reference: str,
    options: dict[str, Any],
    error: type[Exception],
    words: str,
) -> None:
    from pytest_polgrad import assert_conforms

    with pytest.raises(error, match=words):
        assert_conforms(fn, reference, max_examples=2, **options)


# ------------------------------------------------------------------ fixtures

FIXTURE_CASES: list[tuple[str, str, str]] = [
    ("make_oracle", "gpro", r"unknown algorithm 'gpro' \(did you mean 'grpo'\?\)"),
    ("make_batch", "raged", r"unknown canonical batch 'raged' \(did you mean 'ragged'\?\)"),
]


@pytest.mark.parametrize(("factory", "name", "words"), FIXTURE_CASES)
def test_bad_fixture_names(factory: str, name: str, words: str) -> None:
    from pytest_polgrad.pytest import fixtures

    with pytest.raises(ValueError, match=words):
        getattr(fixtures, factory)(name)


# ------------------------------------------------------------------ the which CLI

WHICH_MODULE = """
import pytest
import torch

def no_logprobs(x, old_logprobs, advantages, response_mask):
    return x.sum()

@pytest.mark.polgrad_conforms("gpro")
def bad_reference(logprobs, old_logprobs, advantages, response_mask):
    return logprobs.sum()

@pytest.mark.polgrad_conforms("grpo", colour="red")
def bad_option(logprobs, old_logprobs, advantages, response_mask):
    return logprobs.sum()

def raises(logprobs, old_logprobs, advantages, response_mask):
    raise RuntimeError("deliberately broken")

not_callable = 3
"""

WHICH_CASES: list[tuple[str, list[str], int, str]] = [
    ("no logprobs", ["{m}::no_logprobs"], 2, "cannot check no_logprobs: "),
    ("bad reference", ["{m}::bad_reference"], 2, "unknown algorithm 'gpro' (did you mean 'grpo'?)"),
    ("bad option", ["{m}::bad_option"], 2, "unknown option(s) ['colour']"),
    ("raises", ["{m}::raises"], 1, "raises cannot be evaluated on the canonical corpus"),
    ("syntax error", ["{d}/broken_syntax.py::f"], 2, "has a syntax error: "),
    ("failing import", ["{d}/broken_import.py::f"], 2, "raised ImportError: on purpose"),
    ("empty module", ["::f"], 2, "expected path/to/file.py::function"),
    ("empty name", ["{m}::"], 2, "expected path/to/file.py::function"),
    ("no separator", ["{m}"], 2, "expected path/to/file.py::function"),
    ("missing file", ["{d}/nope.py::f"], 2, "no such file"),
    ("missing attribute", ["{m}::raisse"], 2, "has no attribute 'raisse' (did you mean 'raises'?)"),
    ("not callable", ["{m}::not_callable"], 2, "is int, not a function"),
    ("top 0", ["{m}::raises", "--top", "0"], 2, "--top: must be a positive integer, got 0"),
    ("top -1", ["{m}::raises", "--top", "-1"], 2, "--top: must be a positive integer, got -1"),
    ("top abc", ["{m}::raises", "--top", "abc"], 2, "must be a positive integer, got 'abc'"),
]


@pytest.mark.parametrize(
    ("case", "argv", "code", "words"), WHICH_CASES, ids=[c[0] for c in WHICH_CASES]
)
def test_which_cli_bad_inputs(
    case: str,
    argv: list[str],
    code: int,
    words: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = tmp_path / f"which_{abs(hash(case))}.py"
    module.write_text(WHICH_MODULE)
    (tmp_path / "broken_syntax.py").write_text("def f(:\n")
    (tmp_path / "broken_import.py").write_text("raise ImportError('on purpose')\n")
    args = ["which", *(a.format(m=module, d=tmp_path) for a in argv)]
    try:
        status = main(args)
    except SystemExit as exc:  # argparse usage errors
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == code, err
    assert words in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ startup usage errors

STARTUP_CASES: list[tuple[str, list[str], str]] = [
    ("", ["--polgrad-max-examples", "0"], "--polgrad-max-examples must be a positive number"),
    ("", ["--polgrad-max-examples", "-3"], "--polgrad-max-examples must be a positive number"),
    ("polgrad_max_examples = abc", [], "ini option polgrad_max_examples must be an integer"),
    ("polgrad_max_examples = 0", [], "polgrad_max_examples must be a positive number"),
    ("polgrad_profile = fast", [], "polgrad_profile must be one of 'quick', 'default', 'thorough'"),
    ("polgrad_profile = quik", [], "(did you mean 'quick'?)"),
    ("polgrad_seed = 1.5", [], "ini option polgrad_seed must be an integer, got '1.5'"),
    ("", ["--polgrad-report", "{d}/missing/r.json"], "does not exist; create it"),
    ("", ["--polgrad-report", "{d}"], "--polgrad-report names a directory"),
    ("", ["--polgrad-report", "/proc/polgrad.json"], "--polgrad-report=/proc/polgrad.json: cannot"),
    ("", ["--polgrad-report", "/sys/polgrad.json"], "--polgrad-report=/sys/polgrad.json: cannot"),
]


@pytest.mark.parametrize(("ini", "args", "words"), STARTUP_CASES)
def test_bad_settings_are_one_usage_error_at_startup(
    pytester: pytest.Pytester, ini: str, args: list[str], words: str
) -> None:
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    # A marked function whose check would run: the error must come before any item.
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.polgrad_conforms('dapo', checks='value')\n"
        "def f(logprobs, old_logprobs, advantages, response_mask):\n    return logprobs.sum()\n"
    )
    argv = [a.format(d=pytester.path) for a in args]
    result = inline_run.run(pytester, "-p", "no:cacheprovider", *argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert words in err
    assert err.count("ERROR") == 1 and "Traceback" not in err
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()


def test_a_report_that_cannot_be_written_at_the_end_fails_the_run(
    pytester: pytest.Pytester,
) -> None:
    """A report path writable at startup but not at the end (here a directory made there
    by a test) is one line naming --polgrad-report and a non-zero exit, not exit 0."""
    path = pytester.path / "r.json"
    pytester.makepyfile(
        "import os, pytest\n\n"
        f"def test_block():\n    os.mkdir({str(path)!r})\n\n"
        "@pytest.mark.polgrad_conforms('dapo', checks='value')\n"
        "def f(logprobs, old_logprobs, advantages, response_mask):\n"
        "    return (logprobs * advantages[:, None]).sum()\n"
    )
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", f"--polgrad-report={path}"
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert out.count("--polgrad-report: JSON report NOT written") == 1
    assert "Traceback" not in out


# ------------------------------------------------------------------ snapshot files


def _read(path: Path) -> Any:
    from pytest_polgrad.core.golden_format import PolgradSnapshotExtension

    return PolgradSnapshotExtension().read_snapshot_data_from_location(
        snapshot_location=str(path), snapshot_name=path.stem, session_id="0"
    )


def _explain(stored: Any) -> str:
    from pytest_polgrad.core.golden_format import PolgradSnapshotExtension, explain

    received = PolgradSnapshotExtension().serialize({"x": torch.tensor([1.0])})
    return "\n".join(explain(received, stored))


SNAPSHOT_CASES: list[tuple[str, bytes, str]] = [
    ("not utf-8", b"format = 1\n\xff\xfe x", "is not UTF-8 text (byte 0xff at offset 11)"),
    ("empty", b"", "the file is empty (0 bytes)"),
    ("bom", "\ufeffformat = 1\nx: float64 [1]\nx[0] = 1\n".encode(), "UTF-8 byte-order mark"),
    ("no header", b"x: float64 [1]\nx[0] = 1\n", "no 'format = N' header line first"),
]


@pytest.mark.parametrize(
    ("case", "content", "words"), SNAPSHOT_CASES, ids=[c[0] for c in SNAPSHOT_CASES]
)
def test_unreadable_snapshot_files_are_named_for_what_they_are(
    case: str, content: bytes, words: str, tmp_path: Path
) -> None:
    path = tmp_path / "s.polgrad"
    path.write_bytes(content)
    text = _explain(_read(path))
    assert words in text
    assert "no snapshot stored yet" not in text


def test_update_replaces_an_unreadable_file(tmp_path: Path) -> None:
    from syrupy.data import Snapshot, SnapshotCollection

    from pytest_polgrad.core.golden_format import PolgradSnapshotExtension, parse

    for content in (b"\xff\xfe\x00garbage", b"", "\ufeffformat = 1\n".encode()):
        path = tmp_path / "s.polgrad"
        path.write_bytes(content)
        received = PolgradSnapshotExtension().serialize({"x": torch.tensor([2.0])})
        collection = SnapshotCollection(location=str(path))
        collection.add(Snapshot(name="s", data=received))
        PolgradSnapshotExtension.write_snapshot_collection(snapshot_collection=collection)
        assert parse(path.read_text(encoding="utf-8")).entries["x"].values == ("2",)


def test_a_failed_write_is_reported_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from syrupy.data import Snapshot, SnapshotCollection

    from pytest_polgrad.core import golden_format as snap

    def refuse(src: Any, dst: Any) -> None:
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.setattr(snap, "_WRITE_ERRORS", {})  # the failed write stays in this test
    path = tmp_path / "ro" / "s.polgrad"
    received = snap.PolgradSnapshotExtension().serialize({"x": torch.tensor([2.0])})
    collection = SnapshotCollection(location=str(path))
    collection.add(Snapshot(name="s", data=received))
    with pytest.raises(snap.SnapshotWriteError, match="PermissionError"):
        snap.PolgradSnapshotExtension.write_snapshot_collection(snapshot_collection=collection)
    text = "\n".join(snap.explain(received, ""))
    assert f"could not write snapshot {path}: PermissionError" in text
    assert "--snapshot-update" not in text  # not the advice to do what was just done
    assert snap.write_error(str(path)) is not None


BAD_INPUT_COUNT = (
    len(MARKER_CASES)
    + len(API_CASES)
    + len(FIXTURE_CASES)
    + len(WHICH_CASES)
    + len(STARTUP_CASES)
    + len(SNAPSHOT_CASES)
    + 5
)
"""Rows above, + the 3 unreadable files replaced on update, the failed write and the
report unwritable at the end."""


def test_the_count_of_bad_inputs() -> None:
    assert BAD_INPUT_COUNT == 86


def _distinct(table: list[Any], key: Callable[[Any], object]) -> int:
    """The number of entries of ``table``, each a distinct input (asserted)."""
    keys = [repr(key(entry)) for entry in table]
    assert len(set(keys)) == len(keys), [k for k in keys if keys.count(k) > 1]
    return len(keys)


def test_the_suite_names_at_least_450_distinct_bad_inputs() -> None:
    """Issue 28's acceptance: every named bad-input table of the suite, summed. Each entry
    is one distinct input with its expected named error (and the argument in the
    message); a table's entries are asserted distinct here, by name or by input."""
    from tests.core.test_golden_no_code import NAMES
    from tests.frameworks.test_cli_errors import CLI_CASES
    from tests.pytest.test_bad_collection import COLLECTION_CASES, ITEM_CASES
    from tests.pytest.test_golden_safety import GOLDEN_SAFETY_BAD_INPUTS
    from tests.reference.test_bad_input_matrix import MATRIX_CASES
    from tests.reference.test_bad_inputs_reference import REFERENCE_BAD_INPUT_COUNT
    from tests.reference.test_bad_inputs_verify import VERIFY_CASES
    from tests.strategies.test_rebuild_arguments import REBUILD_CASES
    from tests.strategies.test_strategies_arguments import BAD as STRATEGY_CASES

    def named(entry: Any) -> object:
        return entry[0]

    def inputs(entry: Any) -> object:
        return entry[:-1]  # everything but the expected message

    counts = {
        "faces (marker, assert_conforms, CLI, startup, snapshot files)": BAD_INPUT_COUNT,
        "reference layouts and domains": REFERENCE_BAD_INPUT_COUNT,
        "golden safety": GOLDEN_SAFETY_BAD_INPUTS,
        "reference matrix": _distinct(MATRIX_CASES, named),
        "verify": _distinct(VERIFY_CASES, named),
        "collection": _distinct(COLLECTION_CASES, named) + _distinct(ITEM_CASES, named),
        "frameworks CLI": _distinct(CLI_CASES, named),
        "strategies": _distinct(STRATEGY_CASES, lambda e: (e[0].__name__, e[1])),
        "Batch.rebuild": _distinct(REBUILD_CASES, named),
        "golden code": _distinct(NAMES, lambda n: n),
    }
    assert _distinct(MARKER_CASES, inputs) == len(MARKER_CASES)  # counted in BAD_INPUT_COUNT
    assert sum(counts.values()) >= 450, counts
    print(f"{sum(counts.values())} named bad inputs: {counts}")
