"""Live readings for ``kubectl gpushare top``: from node exporters' /metrics or from Prometheus."""

import json
import urllib.error
import urllib.parse
import urllib.request
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


def _get(url: str, *, flag: str, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as exc:
        raise InvalidInputError(
            flag, f"{url} answered HTTP {exc.code}", "check the URL and that the server is up"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InvalidInputError(
            flag, f"cannot reach {url} ({reason})", "check the URL and that the server is up"
        ) from None


def from_exporters(urls: list[str], *, timeout_s: float = 5.0) -> Live:
    """Scrape node exporters directly (``--metrics-url``, repeatable)."""
    live = Live(source=", ".join(urls))
    for raw in urls:
        url = _check_url(raw, flag="--metrics-url")
        text = _get(url, flag="--metrics-url", timeout_s=timeout_s).decode()
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


def from_prometheus(base: str, *, timeout_s: float = 5.0) -> Live:
    """Instant queries against a Prometheus server (``--prometheus``)."""
    url = _check_url(base, flag="--prometheus")
    live = Live(source=url)
    for name in LIVE_METRICS:
        query = urllib.parse.urlencode({"query": name})
        body = _get(f"{url}/api/v1/query?{query}", flag="--prometheus", timeout_s=timeout_s)
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
