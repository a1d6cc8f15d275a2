"""The controller's flags as rendered, made parseable here: the extender's TLS files are
written by the controller itself (default: from the Secrets it keeps, so the parser does not
ask for them) or mounted from cert-manager's Secret (issued in the cluster: left out here)
before the controller's own parser checks them."""

import base64
import tempfile
from pathlib import Path

from tests.fixtures.helm_chart import Obj, Rendered

TLS_FLAGS = ("--extender-tls-cert=", "--extender-tls-key=", "--extender-client-ca=")


def parseable(args: list[str], rendered: Rendered | None = None) -> list[str]:
    secrets = [] if rendered is None else rendered.all("Secret")
    secret: Obj | None = next(
        (s for s in secrets if s["metadata"]["name"].endswith("-extender-tls")), None
    )
    if "--no-issue-certificates" not in args and any(
        a.startswith("--certificate-secrets=") for a in args
    ):
        return list(args)
    out = []
    for arg in args:
        flag = next((f for f in TLS_FLAGS if arg.startswith(f)), None)
        if flag is None:
            out.append(arg)
        elif secret is not None:
            path = Path(tempfile.mkdtemp(prefix="gs-chart-")) / Path(arg[len(flag) :]).name
            path.write_bytes(base64.b64decode(secret["data"][path.name]))
            out.append(flag + str(path))
    return out
