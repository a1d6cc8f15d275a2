"""core/v1 Events as every gpushare process records them (shown by ``kubectl describe``)."""

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from gpushare.api.gpushare_crd import API_VERSION, KIND

MESSAGE_LIMIT = 1024
"""Longest message kept (the API server refuses longer ones)."""


@dataclass(frozen=True)
class ObjectRef:
    """Who an Event or patch is about."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def pod(cls, *, namespace: str, name: str, uid: str = "") -> "ObjectRef":
        return cls("v1", "Pod", namespace, name, uid)

    @classmethod
    def share(cls, *, namespace: str, name: str, uid: str = "") -> "ObjectRef":
        return cls(API_VERSION, KIND, namespace, name, uid)

    @classmethod
    def node(cls, *, name: str, uid: str = "") -> "ObjectRef":
        return cls("v1", "Node", "", name, uid)


@dataclass(frozen=True)
class Reporter:
    """Who reports a program's Events: the source and reporting fields every Event of it
    carries."""

    component: str
    reporting_component: str
    instance: str
    host: str | None = None

    def event(self, about: ObjectRef, *, reason: str, message: str, warning: bool) -> Event:
        return event(
            about,
            reason=reason,
            message=message,
            warning=warning,
            component=self.component,
            reporting_component=self.reporting_component,
            instance=self.instance,
            host=self.host,
        )


def event(
    about: ObjectRef,
    *,
    reason: str,
    message: str,
    warning: bool,
    component: str,
    reporting_component: str,
    instance: str,
    host: str | None = None,
) -> Event:
    """The Event object: involved object, reason, message (cut to MESSAGE_LIMIT), type, and who
    reports it. A node-scoped object's events go to namespace ``default``."""
    now = datetime.now(UTC)
    namespace = about.namespace or "default"
    return Event(
        metadata=ObjectMeta(name=f"{about.name}.{time.time_ns():x}", namespace=namespace),
        involvedObject=ObjectReference(
            apiVersion=about.api_version,
            kind=about.kind,
            name=about.name,
            namespace=about.namespace or None,
            uid=about.uid or None,
        ),
        reason=reason,
        message=message[:MESSAGE_LIMIT],
        type="Warning" if warning else "Normal",
        source=EventSource(component=component, host=host),
        reportingComponent=reporting_component,
        reportingInstance=instance,
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )
