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
