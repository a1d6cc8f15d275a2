"""--test-order reorders the tests of order-independent modules, and only those."""

import pytest

MODULE = """
from pathlib import Path

import pytest

pytestmark = pytest.mark.order_independent
SEEN = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    Path(__file__).with_suffix(".order").write_text(",".join(SEEN))


@pytest.mark.parametrize("n", range(6))
def test_step(n):
    SEEN.append(str(n))
"""


def order(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_marked=MODULE, test_plain=MODULE.replace("pytestmark", "_unused"))
    result = pytester.runpytest("-p", "tests.fixtures.ordering", *args)
    result.assert_outcomes(passed=12)
    return [(pytester.path / f"test_{m}.order").read_text() for m in ("marked", "plain")]


def test_marked_modules_run_reversed_or_shuffled_and_others_as_written(
    pytester: pytest.Pytester,
) -> None:
    written = ",".join(str(n) for n in range(6))
    assert order(pytester) == [written, written]
    marked, plain = order(pytester, "--test-order=reverse")
    assert marked == ",".join(str(n) for n in reversed(range(6))) and plain == written
    first, plain = order(pytester, "--test-order=shuffle:3")
    assert sorted(first.split(",")) == sorted(written.split(",")) and plain == written
    again, _ = order(pytester, "--test-order=shuffle:3")
    assert again == first  # a seed replays its order
    others = {order(pytester, f"--test-order=shuffle:{seed}")[0] for seed in range(4, 8)}
    assert len(others | {first}) > 1


def test_a_malformed_order_is_refused_naming_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest("-p", "tests.fixtures.ordering", "--test-order=sideways")
    assert "--test-order='sideways'" in "\n".join(result.errlines)


def test_modules_that_take_the_whole_node_run_first(pytester: pytest.Pytester) -> None:
    """A host node agent started by an earlier module holds the node until the session ends,
    so modules marked whole_node go before every other module, in their own order."""
    log = pytester.path / "ran.txt"

    def module(name: str, *, whole: bool) -> str:
        mark = "pytestmark = pytest.mark.whole_node" if whole else ""
        return (
            f"import pytest\n{mark}\n"
            f"def test_it():\n    open({str(log)!r}, 'a').write('{name}\\n')\n"
        )

    pytester.makepyfile(
        test_a=module("a", whole=False),
        test_b=module("b", whole=True),
        test_c=module("c", whole=False),
        test_d=module("d", whole=True),
    )
    result = pytester.runpytest("-p", "tests.fixtures.ordering")
    result.assert_outcomes(passed=4)
    assert log.read_text().split() == ["b", "d", "a", "c"]
