"""Loads pytester and every module in tests/fixtures/ as a pytest plugin, so fixtures shared
across test directories (the local cluster, the node agent, the controller) live in one place
each."""

from pathlib import Path

pytest_plugins = [
    "pytester",
    *sorted(
        f"tests.fixtures.{path.stem}"
        for path in (Path(__file__).parent / "tests" / "fixtures").glob("*.py")
        if path.stem != "__init__"
    ),
]
