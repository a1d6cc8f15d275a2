"""Certificates the controller makes and renews itself, kept in Secrets the chart does not
render (so two renders of the chart are byte-identical: docs/chart.md, "Certificates").

Secrets, in the controller's namespace, all ``kubernetes.io/tls``:

- ``<prefix>-ca``: the CA (``tls.key`` included), valid ten years;
- ``<prefix>-webhook-tls``: the webhook's serving certificate (every replica serves it);
- ``<prefix>-extender-tls``: the extender's serving certificate; its ``ca.crt`` is what
  gpushare-scheduler trusts and what the extender checks client certificates against;
- ``<prefix>-extender-client``: gpushare-scheduler's client certificate.

Any replica creates a missing Secret (a create either wins or finds the winner's); only the
leader renews, when a third of a certificate's life is left, when it is signed by another CA or
names other hosts, or when someone annotates its Secret ``gpushare.io/renew``. Renewed
certificates keep the CA, so the webhook and gpushare-scheduler trust them at once. Each
replica copies the Secrets into the files it serves from; its reload loop (main._reload_certs)
picks them up.

kube-scheduler reads its extender CA and client certificate only at start, so the leader
restarts gpushare-scheduler's Deployment (a pod-template annotation, as ``kubectl rollout
restart`` does) whenever what it reads changed: the ``ca.crt`` of ``<prefix>-extender-tls``
and ``<prefix>-extender-client``. At install its first pod waits for the Secrets to mount, so
it starts with them and is not restarted. That also covers certificates cert-manager renews
(``--no-issue-certificates``: the keeper only reads).
"""

import asyncio
import datetime as dt
import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.api.errors import InvalidInputError
from gpushare.api.flags import option
from gpushare.cluster.issuing import (
    CA_DAYS,
    CLIENT_NAME,
    Leaf,
    ca_problem,
    issue,
    leaf_problem,
    make_ca,
)
from gpushare.kube.certificates import Owner, SecretStore, StoredSecret
from gpushare.kube.errors import KubeError

log = logging.getLogger("gpushare.cluster.certificates")

CREDENTIALS_ANNOTATION = "gpushare.io/extender-credentials"
"""On gpushare-scheduler's Deployment: a digest of the extender CA and client certificate its
pods run with. When the Secrets' digest differs, the leader writes the new one here and
restarts the pods (:data:`RESTARTED_AT` on the pod template); when it is missing (pods that
started after the Secrets were made, e.g. at install), it is only written here."""
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
"""What ``kubectl rollout restart`` writes on a pod template. Not a ``gpushare.io/`` key: the
admission webhook takes a pod carrying one for a gpushare pod (and refused the scheduler's)."""
LABELS = {
    "app.kubernetes.io/part-of": "gpushare",
    "app.kubernetes.io/managed-by": "gpushare-controller",
}


@dataclass(frozen=True)
class CertificateSettings:
    """Certificates kept in Secrets by the controller (``--certificate-secrets`` ...)."""

    secrets: str = option(
        "", flags=("--certificate-secrets",), flat="certificate_secrets", metavar="NAMESPACE/PREFIX"
    )
    """``NAMESPACE/PREFIX``: keep the certificates in the Secrets named in the module
    docstring; empty: only files (``--webhook-cert-dir``, ``--extender-tls-*``)."""
    issue: bool = option(
        True,
        flags=("--no-issue-certificates",),
        flat="certificate_issue",
        action="store_false",
        help="only read the Secrets (cert-manager makes them)",
    )
    """Make and renew the certificates; off (cert-manager makes them), only read them, to
    restart gpushare-scheduler when they change."""
    extender_hosts: tuple[str, ...] = option(
        (),
        flags=("--extender-tls-host",),
        flat="certificate_extender_hosts",
        action="append",
        convert=tuple,
        metavar="HOST",
        help_suffix="Repeatable.",
    )
    """DNS names and IP addresses the extender's certificate names."""
    days: int = option(365, flags=("--certificate-days",), flat="certificate_days")
    """Validity of the serving and client certificates (renewed with a third left)."""
    restart_deployment: str = option(
        "",
        flags=("--restart-on-certificate-change",),
        flat="restart_on_certificate_change",
        metavar="DEPLOYMENT",
    )
    """gpushare-scheduler's Deployment (in NAMESPACE), restarted when its extender CA or client
    certificate changes; empty: none."""

    @property
    def namespace(self) -> str:
        return self.secrets.partition("/")[0]

    @property
    def prefix(self) -> str:
        return self.secrets.partition("/")[2]

    @property
    def writes_files(self) -> bool:
        """The controller writes the certificate files itself from its Secrets (they need not
        exist before it starts)."""
        return bool(self.secrets and self.issue)

    def validate(self) -> "CertificateSettings":
        if self.secrets and not (self.namespace and self.prefix and "/" not in self.prefix):
            raise InvalidInputError(
                "--certificate-secrets",
                f"{self.secrets!r} is not NAMESPACE/PREFIX",
                "write e.g. gpushare-system/gpushare-controller",
            )
        if not 2 <= self.days <= CA_DAYS // 2:
            raise InvalidInputError(
                "--certificate-days", f"{self.days} is out of range", f"use 2..{CA_DAYS // 2}"
            )
        if self.restart_deployment and not self.secrets:
            raise InvalidInputError(
                "--restart-on-certificate-change",
                "needs --certificate-secrets (the Secrets whose change restarts it)",
                "give --certificate-secrets NAMESPACE/PREFIX too",
            )
        return self


def credentials_digest(extender: StoredSecret | None, client: StoredSecret | None) -> str:
    """What gpushare-scheduler reads at start: the extender's CA and its client certificate."""
    digest = hashlib.sha256()
    digest.update((extender.data.get("ca.crt", b"") if extender else b"") + b"\0")
    digest.update(client.data.get("tls.crt", b"") if client else b"")
    return digest.hexdigest()[:20]


def _write(path: Path, data: bytes, *, private: bool) -> bool:
    """Write ``data`` unless the file holds it already (atomically: a temporary, renamed)."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)
    return True


# ---- keeping (I/O) --------------------------------------------------------------------------


class CertificateKeeper:
    """Makes, renews and serves from the Secrets of one controller (the module docstring)."""

    def __init__(
        self,
        store: SecretStore,
        settings: CertificateSettings,
        leaves: Sequence[Leaf],
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.store = store
        self.settings = settings
        self.leaves = list(leaves)
        self.clock = clock
        self.owner: Owner | None = None
        self.renewed = 0
        self.restarts = 0

    def secret(self, suffix: str) -> str:
        return f"{self.settings.prefix}-{suffix}"

    async def _owner(self) -> Owner | None:
        """The controller's Deployment (named PREFIX): its deletion takes the Secrets along."""
        if self.owner is None:
            found = await self.store.deployment(self.settings.prefix)
            self.owner = found[0] if found is not None and found[0].uid else None
        return self.owner

    async def _create(self, name: str, data: Mapping[str, bytes]) -> StoredSecret:
        """Create ``name``; another replica's, when it won the race."""
        if await self.store.create(name, data, labels=LABELS, owner=await self._owner()):
            log.info("certificate Secret created", extra={"secret": name})
        stored = await self.store.get(name)
        if stored is None:
            raise KubeError(f"Secret {self.store.namespace}/{name} vanished after its create")
        return stored

    async def _ca(self) -> StoredSecret:
        name = self.secret("ca")
        stored = await self.store.get(name)
        if stored is None:
            stored = await self._create(name, make_ca(now=self.clock()))
        return stored

    async def start(self) -> None:
        """Before serving: every Secret exists and this replica's files hold them."""
        if self.settings.issue:
            ca = await self._ca()
            for leaf in self.leaves:
                if await self.store.get(leaf.secret) is None:
                    data = issue(ca.data, leaf, now=self.clock(), days=self.settings.days)
                    await self._create(leaf.secret, data)
        await self.sync()

    async def sync(self) -> bool:
        """Copy the Secrets into this replica's files; True when a file changed. Written CA
        first and certificate last: the reload loop registers a new webhook CA before it
        serves a certificate signed by it, and loads a key and certificate only as a pair."""
        changed = False
        if not self.settings.issue:
            return changed  # the kubelet mounts cert-manager's Secrets itself
        for leaf in self.leaves:
            if leaf.cert_file is None:
                continue
            stored = await self.store.get(leaf.secret)
            if stored is None or not {"tls.crt", "tls.key"} <= stored.data.keys():
                continue
            for path, key, private in (
                (leaf.ca_file, "ca.crt", False),
                (leaf.key_file, "tls.key", True),
                (leaf.cert_file, "tls.crt", False),
            ):
                if path is not None and key in stored.data:
                    changed |= _write(path, stored.data[key], private=private)
        return changed

    async def lead(self) -> None:
        """The leader's turn: renew what is due, then restart gpushare-scheduler if what it
        reads at start changed."""
        if self.settings.issue:
            await self._renew()
        if self.settings.restart_deployment:
            await self._restart_scheduler()

    async def _renew(self) -> None:
        now = self.clock()
        ca = await self._ca()
        why = ca_problem(ca, now=now)
        if why is not None:
            fresh = make_ca(now=now)
            if await self.store.replace(ca, fresh, labels=LABELS, owner=await self._owner()):
                log.warning(
                    "new CA: gpushare-scheduler calls fail until it restarts with it",
                    extra={"secret": ca.name, "why": why},
                )
            ca = await self._ca()
        for leaf in self.leaves:
            stored = await self.store.get(leaf.secret)
            why = leaf_problem(stored, leaf, ca.data, now=now)
            if why is None:
                continue
            data = issue(ca.data, leaf, now=now, days=self.settings.days)
            if stored is None:
                await self._create(leaf.secret, data)
            elif not await self.store.replace(
                stored, data, labels=LABELS, owner=await self._owner()
            ):
                continue  # changed meanwhile: judged again next time
            self.renewed += 1
            log.info("certificate renewed", extra={"secret": leaf.secret, "why": why})

    async def _restart_scheduler(self) -> None:
        name = self.settings.restart_deployment
        digest = credentials_digest(
            await self.store.get(self.secret("extender-tls")),
            await self.store.get(self.secret("extender-client")),
        )
        found = await self.store.deployment(name)
        if found is None or found[1].get(CREDENTIALS_ANNOTATION) == digest:
            return
        annotation = {CREDENTIALS_ANNOTATION: digest}
        if CREDENTIALS_ANNOTATION not in found[1]:
            # Its pods could not start before the Secrets existed: they hold these.
            await self.store.annotate_deployment(name, annotation)
            return
        restarted = {RESTARTED_AT: self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")}
        await self.store.annotate_deployment(name, annotation, pod_template=restarted)
        self.restarts += 1
        log.info(
            "restarting gpushare-scheduler: kube-scheduler reads its extender CA and client "
            "certificate only at start",
            extra={"deployment": name, "credentials": digest},
        )

    async def run(self, *, leading: Callable[[], bool], period_s: float) -> None:
        """Forever: sync the files; while leading, renew and restart. Errors are logged and
        tried again next period (the certificates served meanwhile stay valid)."""
        while True:
            await asyncio.sleep(period_s)
            try:
                if leading():
                    await self.lead()
                await self.sync()
            except (KubeError, OSError) as exc:
                log.warning("certificate upkeep failed; retrying", extra={"error": str(exc)})


def leaves_for(
    settings: CertificateSettings,
    *,
    webhook_hosts: Sequence[str],
    webhook_dir: Path | None,
    extender_cert: Path | None,
    extender_key: Path | None,
    extender_client_ca: Path | None,
) -> list[Leaf]:
    """The certificates a controller with these settings serves and hands out."""
    prefix = settings.prefix
    leaves = [
        Leaf(
            secret=f"{prefix}-webhook-tls",
            common_name=webhook_hosts[0],
            hosts=tuple(webhook_hosts),
            ca_file=webhook_dir / "ca.crt" if webhook_dir else None,
            cert_file=webhook_dir / "tls.crt" if webhook_dir else None,
            key_file=webhook_dir / "tls.key" if webhook_dir else None,
        )
    ]
    if extender_cert is not None and settings.extender_hosts:
        leaves.append(
            Leaf(
                secret=f"{prefix}-extender-tls",
                common_name=settings.extender_hosts[0],
                hosts=settings.extender_hosts,
                ca_file=extender_client_ca,
                cert_file=extender_cert,
                key_file=extender_key,
            )
        )
        if extender_client_ca is not None:
            leaves.append(Leaf(secret=f"{prefix}-extender-client", common_name=CLIENT_NAME))
    return leaves
