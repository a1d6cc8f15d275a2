"""The API server as ``kubectl gpushare`` reaches it: the standard library only, so the CLI
installs without a Kubernetes client library, gRPC, protobuf or anything compiled (#46; the
CLI-only distribution, docs/cli.md "Install").

The kubeconfig is read the way kubectl reads it, by kubectl itself: ``kubectl config view
--raw --flatten --minify -o json`` merges every file of a multi-file ``KUBECONFIG`` by kubectl's
rules and picks the context (``--context``), so the plugin and kubectl always talk to the same
cluster as the same user. Credentials: client certificates, bearer tokens (also from a token
file) and exec plugins (``client.authentication.k8s.io``); the legacy ``auth-provider`` is
refused with the fix.

``get`` lists; ``watch`` follows a watch (one JSON event a line) from a resourceVersion.
"""

import atexit
import base64
import binascii
import datetime as dt
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError

KUBECTL_ENV = "KUBECTL"
"""The kubectl to read the kubeconfig with (default: ``kubectl`` on PATH)."""


class ApiStatusError(Exception):
    """The API server answered with an error status (its Status message kept)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class UnreachableError(Exception):
    """No answer from the API server (connection, TLS, timeout)."""


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's service account token, CA and namespace are mounted."""


def in_cluster_config(sa_dir: Path | None = None) -> dict[str, Any] | None:
    """The kubeconfig a pod's service account makes (as client-go's in-cluster config): the
    API server from KUBERNETES_SERVICE_HOST/PORT, the mounted CA and token (read at each
    request, so a rotated token is used); None outside a pod."""
    sa_dir = sa_dir or SERVICE_ACCOUNT_DIR
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = sa_dir / "token", sa_dir / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    namespace_file = sa_dir / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else None
    cluster = {
        "server": f"https://{host}:{port}",
        "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
    }
    return {
        "clusters": [{"name": "in-cluster", "cluster": cluster}],
        "users": [{"name": "in-cluster", "user": {"tokenFile": str(token)}}],
        "contexts": [
            {
                "name": "in-cluster",
                "context": {"cluster": "in-cluster", "user": "in-cluster", "namespace": namespace},
            }
        ],
    }


def kubectl_config(kubeconfig: Path | None, context: str | None) -> dict[str, Any]:
    """The merged, minified kubeconfig of ``context`` (default: the current one), with every
    file reference inlined, as kubectl sees it; in a pod without kubectl (and no kubeconfig or
    context asked for), its service account's (:func:`in_cluster_config`)."""
    kubectl = os.environ.get(KUBECTL_ENV) or shutil.which("kubectl")
    if kubectl is None and kubeconfig is None and not context and "KUBECONFIG" not in os.environ:
        in_cluster = in_cluster_config()
        if in_cluster is not None:
            return in_cluster
    if kubectl is None:
        raise InvalidInputError(
            "KUBECONFIG",
            "kubectl is not on PATH: the plugin reads your kubeconfig through "
            "`kubectl config view`, as kubectl would",
            "install kubectl, or set KUBECTL to its path",
        )
    cmd = [kubectl, "config", "view", "--raw", "--flatten", "--minify", "-o", "json"]
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise InvalidInputError(
                "--kubeconfig", f"{kubeconfig} does not exist", "give a kubeconfig file"
            )
        cmd += ["--kubeconfig", str(kubeconfig)]
    if context:
        cmd += ["--context", context]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InvalidInputError(
            "KUBECONFIG", f"{kubectl} failed ({exc})", "check kubectl"
        ) from None
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip()).removeprefix("error: ")
        flag = "--context" if context and "context" in message else "KUBECONFIG"
        raise InvalidInputError(
            flag, f"no usable kubeconfig ({message})", "set KUBECONFIG or pass --kubeconfig"
        )
    try:
        config: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        raise InvalidInputError(
            "KUBECONFIG", "kubectl config view printed no JSON", "check kubectl"
        ) from None
    if not config.get("contexts") or not config.get("clusters"):
        raise InvalidInputError(
            "KUBECONFIG",
            "no current context (kubectl config current-context is empty)",
            "set KUBECONFIG, pass --kubeconfig or --context",
        )
    return config


def _decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError(
            "KUBECONFIG", f"{what} is not base64", "fix the kubeconfig"
        ) from None


@dataclass
class Access:
    """One cluster as one user: where, how to trust it, how to authenticate."""

    server: str
    namespace: str | None
    context: ssl.SSLContext | None
    token: str | None = None
    token_file: Path | None = None
    basic: tuple[str, str] | None = None
    exec_spec: Mapping[str, Any] | None = None
    cluster: Mapping[str, Any] = field(default_factory=dict)
    _exec_token: str | None = None
    _exec_expiry: dt.datetime | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Access":
        ctx = config["contexts"][0]["context"]
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        users = [u["user"] for u in config.get("users") or [] if u["name"] == ctx.get("user")]
        user: Mapping[str, Any] = users[0] if users else {}
        server = str(cluster.get("server") or "")
        if not server.startswith(("https://", "http://")):
            raise InvalidInputError(
                "KUBECONFIG", f"cluster server {server!r} is not a URL", "fix the kubeconfig"
            )
        if user.get("auth-provider"):
            raise InvalidInputError(
                "KUBECONFIG",
                "the user authenticates with a legacy auth-provider, which the plugin does not run",
                "use the provider's exec credential plugin (e.g. gke-gcloud-auth-plugin, "
                "kubelogin), as kubectl >= 1.26 requires too",
            )
        access = cls(
            server=server.rstrip("/"),
            namespace=ctx.get("namespace"),
            context=None,
            token=user.get("token"),
            token_file=Path(user["tokenFile"]) if user.get("tokenFile") else None,
            basic=(user["username"], user.get("password", "")) if user.get("username") else None,
            exec_spec=user.get("exec"),
            cluster=cluster,
        )
        if server.startswith("https://"):
            access.context = access._tls(cluster, user)
        return access

    def _tls(self, cluster: Mapping[str, Any], user: Mapping[str, Any]) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            ca = _decode(cluster["certificate-authority-data"], "certificate-authority-data")
            ctx.load_verify_locations(cadata=ca.decode())
        cert = user.get("client-certificate-data")
        key = user.get("client-key-data")
        if cert and key:
            self._load_client(
                ctx, _decode(cert, "client-certificate-data"), _decode(key, "client-key-data")
            )
        return ctx

    @staticmethod
    def _load_client(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
        """ssl loads a key pair from files only: a private directory, removed at exit."""
        work = Path(tempfile.mkdtemp(prefix="kubectl-gpushare-"))
        atexit.register(shutil.rmtree, work, True)
        (work / "tls.crt").write_bytes(cert)
        fd = os.open(work / "tls.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
        ctx.load_cert_chain(work / "tls.crt", work / "tls.key")

    def _exec_credential(self) -> str | None:
        """Run the exec plugin (client.authentication.k8s.io), cached until it expires."""
        assert self.exec_spec is not None
        now = dt.datetime.now(dt.UTC)
        if self._exec_token and (self._exec_expiry is None or self._exec_expiry > now):
            return self._exec_token
        spec = self.exec_spec
        env = dict(os.environ)
        for item in spec.get("env") or []:
            env[item["name"]] = item["value"]
        info: dict[str, Any] = {
            "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1"),
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        if spec.get("provideClusterInfo"):
            info["spec"]["cluster"] = {
                "server": self.server,
                "certificate-authority-data": self.cluster.get("certificate-authority-data"),
            }
        env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
        try:
            proc = subprocess.run(
                [spec["command"], *(spec.get("args") or [])],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InvalidInputError(
                "KUBECONFIG", f"exec credential plugin {spec.get('command')!r} failed ({exc})",
                "check the plugin is installed",
            ) from None  # fmt: skip
        if proc.returncode != 0:
            raise InvalidInputError(
                "KUBECONFIG",
                f"exec credential plugin {spec.get('command')!r} failed: {proc.stderr.strip()}",
                "log in again with your provider's tool",
            )
        status = json.loads(proc.stdout or "{}").get("status") or {}
        if status.get("clientCertificateData") and status.get("clientKeyData"):
            assert self.context is not None
            self._load_client(
                self.context,
                status["clientCertificateData"].encode(),
                status["clientKeyData"].encode(),
            )
        self._exec_token = status.get("token")
        expiry = status.get("expirationTimestamp")
        self._exec_expiry = (
            dt.datetime.fromisoformat(expiry.replace("Z", "+00:00")) if expiry else None
        )
        return self._exec_token

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "kubectl-gpushare"}
        token = self.token
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
        if self.exec_spec is not None:
            token = self._exec_credential() or token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self.basic is not None:
            raw = f"{self.basic[0]}:{self.basic[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        return headers

    def _open(self, path: str, params: Mapping[str, str], timeout_s: float) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v})
        url = f"{self.server}{path}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, headers=self.headers())
        try:
            return urllib.request.urlopen(request, timeout=timeout_s, context=self.context)
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                message = str(json.loads(body).get("message") or body[:300].decode())
            except ValueError:
                message = body[:300].decode(errors="replace")
            raise ApiStatusError(exc.code, message) from None
        except (urllib.error.URLError, OSError) as exc:
            raise UnreachableError(str(getattr(exc, "reason", exc))) from None

    def get(self, path: str, params: Mapping[str, str], *, timeout_s: float) -> dict[str, Any]:
        """GET ``path`` (a list or an object) as a dict."""
        with self._open(path, params, timeout_s) as resp:
            try:
                doc: dict[str, Any] = json.loads(resp.read())
            except (ValueError, OSError) as exc:
                raise UnreachableError(f"unreadable answer ({exc})") from None
        return doc

    def watch(
        self,
        path: str,
        params: Mapping[str, str],
        *,
        resource_version: str,
        timeout_s: float,
        window_s: int = 300,
    ) -> Iterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) from ``resource_version`` until the server
        ends the watch (after about ``window_s``) or the connection drops."""
        watch_params = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(window_s),
        }
        with self._open(path, watch_params, window_s + timeout_s) as resp:
            for line in resp:
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise UnreachableError(f"unreadable watch event ({exc})") from None
