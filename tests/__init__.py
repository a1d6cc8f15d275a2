from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository's root, for tests that read its files (charts, CRDs, examples, data)."""
