"""The product's modules and functions stay small enough to read whole (issue 48's targets:
no module over 500 lines, no function over 60; generated gRPC and protobuf code aside). A change
that grows one past its limit fails here, naming it, instead of being found by the next
engineer."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "gpushare"
MODULE_LINES = 500
FUNCTION_LINES = 60


def _product_modules() -> list[Path]:
    """Every hand-written module (the generated ``*_pb2*.py`` stubs excluded)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "_pb2" not in p.name)


def test_the_package_has_modules_to_check() -> None:
    # Guards the two tests below against passing on an empty or moved package.
    assert len(_product_modules()) > 100


def test_no_product_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _product_modules()
        if (n := p.read_text().count("\n")) > MODULE_LINES
    }
    assert not long, f"split these modules (lines): {long}"


def test_no_product_function_is_over_60_lines() -> None:
    long: dict[str, int] = {}
    for path in _product_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = n
    assert not long, f"split these functions (lines): {long}"
