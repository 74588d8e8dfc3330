"""Issue 28, collection bullets: a marked object pytest would silently skip, an ``id=`` that
breaks node ids, a training step with a parameter the kit cannot fill and a wrong-typed
marker value are each a collection error naming the object or the option, never
"no tests ran", a run-time ``TypeError`` or a raw traceback."""

from __future__ import annotations

import pytest

from tests.helpers import inline_run

pytest_plugins = ["pytester"]

SIG = "logprobs, old_logprobs, advantages, response_mask"
BODY = "return (logprobs * advantages[:, None]).sum()"

# (name, module source, the item it generates): collected as a plain function
ITEM_CASES: list[tuple[str, str, str]] = [
    (
        "staticmethod, marker inside",
        f"class TestL:\n    @staticmethod\n    @M\n    def f({SIG}):\n        {BODY}\n",
        "f[dapo-value]",
    ),
    (
        "staticmethod, marker outside",
        f"class TestL:\n    @M\n    @staticmethod\n    def f({SIG}):\n        {BODY}\n",
        "f[dapo-value]",
    ),
    (
        "classmethod, marker inside",
        f"class TestL:\n    @classmethod\n    @M\n    def f(cls, {SIG}):\n        {BODY}\n",
        "f[dapo-value]",
    ),
    (
        "classmethod, marker outside",
        f"class TestL:\n    @M\n    @classmethod\n    def f(cls, {SIG}):\n        {BODY}\n",
        "f[dapo-value]",
    ),
]

# (name, module source, words the collection error must contain)
COLLECTION_CASES: list[tuple[str, str, str]] = [
    (
        "method of a class pytest does not collect",
        f"class Losses:\n    @M\n    def f(self, {SIG}):\n        {BODY}\n",
        "Losses",
    ),
    ("a builtin", "f = M(len)\n", "`f = M(len)` marks a builtin_function_or_method"),
    ("a builtin method", "f = M(str.upper)\n", "`f = M(str.upper)` marks a method_descriptor"),
    ("id int", f"@MK(id=5)\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("id empty", f"@MK(id='')\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("id newline", f"@MK(id='a\\nb')\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("id slash", f"@MK(id='a/b')\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("id double colon", f"@MK(id='a::b')\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("id bracket", f"@MK(id='a]b')\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("id space only", f"@MK(id='  ')\ndef f({SIG}):\n    {BODY}\n", "id must be"),
    ("loss True", f"@MK(loss=True)\ndef f({SIG}):\n    {BODY}\n", "loss must be"),
    ("loss list", f"@MK(loss=[0])\ndef f({SIG}):\n    {BODY}\n", "loss must be"),
    ("loss dict", f"@MK(loss={{'a': 1}})\ndef f({SIG}):\n    {BODY}\n", "loss must be"),
    ("loss empty key", f"@MK(loss='')\ndef f({SIG}):\n    {BODY}\n", "loss must be"),
    ("max_examples float", f"@MK(max_examples=2.5)\ndef f({SIG}):\n    {BODY}\n", "max_examples"),
    ("max_examples bool", f"@MK(max_examples=True)\ndef f({SIG}):\n    {BODY}\n", "max_examples"),
    ("max_length zero", f"@MK(max_length=0)\ndef f({SIG}):\n    {BODY}\n", "max_length"),
    ("max_batch str", f"@MK(max_batch='8')\ndef f({SIG}):\n    {BODY}\n", "max_batch"),
    ("padding_nan str", f"@MK(padding_nan='yes')\ndef f({SIG}):\n    {BODY}\n", "padding_nan"),
    ("strict None", f"@MK(strict=None)\ndef f({SIG}):\n    {BODY}\n", "strict"),
    ("dtype torch", f"@MK(dtype=3)\ndef f({SIG}):\n    {BODY}\n", "dtype"),
    ("layout None", f"@MK(layout=None)\ndef f({SIG}):\n    {BODY}\n", "layout"),
    ("device int", f"@MK(device=0)\ndef f({SIG}):\n    {BODY}\n", "device"),
    ("world_size 3", f"@MK(world_size=3)\ndef f({SIG}):\n    {BODY}\n", "world_size"),
    ("distributed x", f"@MK(distributed='x')\ndef f({SIG}):\n    {BODY}\n", "distributed"),
    ("checks empty tuple", f"@MK(checks=())\ndef f({SIG}):\n    {BODY}\n", "checks"),
    ("expect list", f"@MK(expect=[('value', 'r')])\ndef f({SIG}):\n    {BODY}\n", "expect"),
    (
        "training_step required parameter",
        "@pytest.mark.polgrad_conforms('grpo', kind='training_step')\n"
        f"def f({SIG}, learning_rate):\n    {BODY}\n",
        "learning_rate",
    ),
    (
        "policy loss required parameter",
        f"@MK()\ndef f({SIG}, temperature):\n    {BODY}\n",
        "temperature",
    ),
]

HEADER = (
    "import pytest\n\n"
    "M = pytest.mark.polgrad_conforms('dapo', checks='value')\n\n"
    "def MK(**kw):\n    return pytest.mark.polgrad_conforms('dapo', checks='value', **kw)\n\n"
)


@pytest.mark.parametrize(
    ("source", "words"),
    [pytest.param(s, w, id=n) for n, s, w in COLLECTION_CASES],
)
def test_a_bad_marked_object_is_a_collection_error_naming_it(
    pytester: pytest.Pytester, source: str, words: str
) -> None:
    pytester.makepyfile(test_marked=HEADER + source)
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "--co", "-q")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out  # a collection error
    assert "no tests ran" not in out or "error" in out
    assert "Traceback" not in out, out
    assert words in out, out


@pytest.mark.parametrize(("source", "item"), [pytest.param(s, i, id=n) for n, s, i in ITEM_CASES])
def test_a_static_or_class_method_generates_its_items(
    pytester: pytest.Pytester, source: str, item: str
) -> None:
    """A marked ``@staticmethod`` / ``@classmethod`` of a test class (marker inside or
    outside the decorator) generated nothing, with "no tests ran"."""
    pytester.makepyfile(test_marked=HEADER + source)
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert item in result.stdout.str()


COLLECTION_BAD_INPUTS = len(COLLECTION_CASES) + len(ITEM_CASES)
