"""Where a process finds the API server: one rule for the controller, the operator and the
node agent."""

import os
from pathlib import Path

from lightkube.config.kubeconfig import KubeConfig


def load_config(kubeconfig: Path | None = None) -> KubeConfig:
    """``kubeconfig`` when given, else ``$KUBECONFIG`` when set, else the in-cluster service
    account, else ``~/.kube/config`` (lightkube's ``from_env``)."""
    if kubeconfig is not None:
        return KubeConfig.from_file(kubeconfig)
    path = os.environ.get("KUBECONFIG")
    return KubeConfig.from_file(path) if path else KubeConfig.from_env()
