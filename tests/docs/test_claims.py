"""The claims source (tools/claims.py): every claimed test exists, the generated tables
are current, the seed's identities are all covered, and the whole-suite hook in
tests/conftest.py fails a run in which a claimed test did not pass."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _claims() -> ModuleType:
    spec = importlib.util.spec_from_file_location("polgrad_claims", ROOT / "tools" / "claims.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["polgrad_claims"] = module
    spec.loader.exec_module(module)
    return module


def test_every_claimed_test_exists() -> None:
    assert _claims().missing_tests() == []


def test_generated_blocks_are_current() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import generate_docs
    finally:
        sys.path.pop(0)
    assert generate_docs.stale() == [], "run: python tools/generate_docs.py"


def test_the_seeds_identities_are_all_claimed() -> None:
    seed = [c for c in _claims().CLAIMS if c.seed]
    # SEED.md's table: aggregation weights, micro-batch weights, E[k1] = E[k3], k2 bias,
    # k2-as-loss surrogate, k3-as-loss bias, on-policy equality, GSPO-token value and
    # locality, clip region, RLOO, ESS null and drift, changepoint level, bandit.
    assert len(seed) >= 15
    pages = {c.page for c in seed}
    assert {"aggregation.md", "kl.md", "losses.md", "advantages.md", "diagnostics.md"} <= pages


def test_every_claimed_page_exists() -> None:
    missing = [c.page for c in _claims().CLAIMS if not (ROOT / "docs" / c.page).is_file()]
    assert missing == []


def test_a_claim_of_a_missing_test_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    claims = _claims()
    fake = claims.Claim("x", "index.md", "tests/docs/test_claims.py::test_that_does_not_exist")
    monkeypatch.setattr(claims, "CLAIMS", (*claims.CLAIMS, fake))
    assert claims.missing_tests() == [
        "tests/docs/test_claims.py::test_that_does_not_exist: no function test_that_does_not_exist "
        "in tests/docs/test_claims.py"
    ]


def test_the_whole_suite_hook_fails_a_run_whose_claimed_test_fails(
    pytester: pytest.Pytester,
) -> None:
    (pytester.path / "tools").mkdir()
    (pytester.path / "tools" / "claims.py").write_text(
        (ROOT / "tools" / "claims.py")
        .read_text()
        .replace("CLAIMS: tuple[Claim, ...] = (", "CLAIMS: tuple[Claim, ...] = (\n" + _FAKE, 1)
    )
    (pytester.path / "tests").mkdir()
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    (pytester.path / "tests" / "conftest.py").write_text(conftest)
    (pytester.path / "tests" / "test_a.py").write_text(
        "def test_claimed():\n    pass\n\ndef test_other():\n    pass\n"
    )
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    ok = pytester.runpytest("-p", "no:cacheprovider")
    ok.assert_outcomes(passed=2)
    (pytester.path / "tests" / "test_a.py").write_text(
        "import pytest\n\n@pytest.mark.skip(reason='x')\ndef test_claimed():\n    pass\n\n"
        "def test_other():\n    pass\n"
    )
    bad = pytester.runpytest("-p", "no:cacheprovider")
    assert bad.ret != 0
    bad.stdout.fnmatch_lines(["*claimed test(s) did not pass*test_claimed*"])
    # A partial run (a file or -k) is not a whole-suite run: the hook stays quiet.
    partial = pytester.runpytest("-p", "no:cacheprovider", "tests/test_a.py")
    assert partial.ret == 0


_FAKE = '    Claim("fake", "index.md", "tests/test_a.py::test_claimed"),\n'
