"""Live readings for ``kubectl gpushare top``: from node exporters' /metrics or from Prometheus."""

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.cli.exposition import samples
from gpushare.cli.view import LIVE_METRICS, Live


def _check_url(url: str, *, flag: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InvalidInputError(
            flag, f"{url!r} is not an http(s) URL", f"write it like http://HOST:PORT{_HINT[flag]}"
        )
    return url.rstrip("/")


_HINT = {"--prometheus": "", "--metrics-url": "/metrics"}


TOKEN_FLAG = "--bearer-token-file"
MAX_TOKEN_BYTES = 64 * 1024


def read_token(path: str | None) -> str | None:
    """The bearer token in ``path`` (``--bearer-token-file``), read afresh on each call: a
    projected service account token is rotated in place. None without a path."""
    if path is None:
        return None
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(
            TOKEN_FLAG, f"cannot read {path} ({exc.strerror or exc})", "give a readable file"
        ) from None
    token = raw.decode("utf-8", "replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or any(c.isspace() for c in token):
        raise InvalidInputError(
            TOKEN_FLAG,
            f"{path} does not hold one token",
            "give a file with a service account token, e.g. from kubectl create token NAME",
        )
    return token


def _get(url: str, *, flag: str, timeout_s: float, token: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout_s
        ) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as exc:
        fix = "check the URL and that the server is up"
        if exc.code in (401, 403):
            fix = (
                f"give {TOKEN_FLAG} with a token allowed to get /metrics "
                "(the chart's monitoring.metricsReaders binds one; docs/cli.md)"
                if token is None or flag == "--metrics-url"
                else f"give {TOKEN_FLAG} with a token this server accepts"
            )
        said = _first_line(exc)
        problem = f"{url} answered HTTP {exc.code}" + (f" ({said})" if said else "")
        raise InvalidInputError(flag, problem, fix) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InvalidInputError(
            flag, f"cannot reach {url} ({reason})", "check the URL and that the server is up"
        ) from None


ANSWER_SHOWN_CHARS = 600
"""How much of a server's error line is shown: a node agent's 401 names the caller, the URL to
grant and the fix in about 300 characters, which must come through whole."""


def _first_line(exc: urllib.error.HTTPError) -> str:
    """The first line of an error answer, printable and bounded; a longer one is cut at a word
    boundary and says so, never in the middle of a word (a node agent names the caller and the
    fix there)."""
    try:
        raw = exc.read(4 * ANSWER_SHOWN_CHARS)
    except OSError:
        return ""
    line = raw.decode("utf-8", "replace").strip().splitlines()[:1]
    text = "".join(c for c in (line[0] if line else "") if c.isprintable())
    if len(text) <= ANSWER_SHOWN_CHARS:
        return text
    cut = text[: ANSWER_SHOWN_CHARS - 4].rsplit(" ", 1)[0]
    return f"{cut} ..."


def from_exporters(urls: list[str], *, timeout_s: float = 5.0, token: str | None = None) -> Live:
    """Scrape node exporters directly (``--metrics-url``, repeatable); with ``token`` as the
    bearer (a node agent's /metrics answers only callers allowed to get it)."""
    live = Live(source=", ".join(urls))
    for raw in urls:
        url = _check_url(raw, flag="--metrics-url")
        text = _get(url, flag="--metrics-url", timeout_s=timeout_s, token=token).decode()
        try:
            found = samples(text)
        except ValueError as exc:
            raise InvalidInputError(
                "--metrics-url",
                f"{url} did not answer in the Prometheus text format ({exc})",
                "point it at a gpushare node agent's /metrics",
            ) from None
        for name, labels, value in found:
            if name in LIVE_METRICS:
                live.add(name, labels, value)
    return live


def from_prometheus(base: str, *, timeout_s: float = 5.0, token: str | None = None) -> Live:
    """Instant queries against a Prometheus server (``--prometheus``), with ``token`` as the
    bearer where one is given (a Prometheus behind an authenticating proxy)."""
    url = _check_url(base, flag="--prometheus")
    live = Live(source=url)
    for name in LIVE_METRICS:
        query = urllib.parse.urlencode({"query": name})
        body = _get(
            f"{url}/api/v1/query?{query}", flag="--prometheus", timeout_s=timeout_s, token=token
        )
        try:
            data: Any = json.loads(body)
        except json.JSONDecodeError:
            raise InvalidInputError(
                "--prometheus", f"{url} did not answer with JSON", "give the Prometheus base URL"
            ) from None
        if data.get("status") != "success":
            raise InvalidInputError(
                "--prometheus",
                f"query {name} failed: {data.get('error', 'unknown error')}",
                "give the Prometheus base URL",
            )
        for item in data.get("data", {}).get("result", []):
            value = float(item["value"][1])
            live.add(name, item.get("metric", {}), value)
    return live
