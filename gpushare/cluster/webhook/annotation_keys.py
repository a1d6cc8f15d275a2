"""The ``gpushare.io/`` keys of a new pod, refused for what they really are: a key gpushare does
not know (with the closest one it does: ``gpu-fracton`` -> did you mean
``gpushare.io/gpu-fraction``), and a key that only means something beside a request, on a pod
that asks for no GPU (``gpu-memory`` or ``class`` alone). Without these, such a pod was refused
for its ``spec.schedulerName``, a field its author never wrote (docs/scheduling.md, "Admission
webhook").
"""

import difflib
from collections.abc import Mapping
from typing import Final

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
    ANN_PROFILING_WINDOW,
)
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_EVICT,
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_REQUEUED_AT,
    ANN_SHARE,
    GROUP,
)
from gpushare.cluster.webhook.checks import PLACEMENT_ANNOTATIONS

USER_KEYS: Final = (
    ANN_FRACTION,
    ANN_SHARE,
    ANN_MEMORY,
    ANN_CLASS,
    ANN_LIMIT,
    ANN_CONTAINER,
    ANN_OPPORTUNISTIC,
    ANN_AVOID_GPUS,
)
"""What a user writes on a pod (docs/scheduling.md): the keys a misspelt one is matched to."""
ASKING_KEYS: Final = (ANN_FRACTION, ANN_SHARE)
"""The keys that ask for a GPU; the other user keys only qualify such a request."""
WRITTEN_KEYS: Final = (
    *PLACEMENT_ANNOTATIONS,
    ANN_EXCLUSIVE,
    ANN_EVICT,
    ANN_REQUEUED_AT,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_PACKING_POLICY,
    ANN_MAX_PODS_PER_GPU,
    ANN_PROFILING,
    ANN_PROFILING_WINDOW,
    ANN_PROFILE,
)
"""Pod keys gpushare writes itself (placement, operator, controller, node agent): known, and
refused at creation by their own checks where a user must not set them."""
KNOWN_KEYS: Final = frozenset(USER_KEYS + WRITTEN_KEYS)
PREFIX: Final = f"{GROUP}/"


def unknown_key_errors(annotations: Mapping[str, str]) -> list[InvalidInputError]:
    """A refusal for each ``gpushare.io/`` key gpushare does not know, naming the closest
    user key when one is close."""
    errors = []
    for key in sorted(annotations):
        if not key.startswith(PREFIX) or key in KNOWN_KEYS:
            continue
        shown = key if len(key) <= 80 else key[:77] + "..."
        names = {k.removeprefix(PREFIX): k for k in USER_KEYS}
        close = difflib.get_close_matches(key.removeprefix(PREFIX), names, n=1, cutoff=0.75)
        fix = (
            f"did you mean {names[close[0]]}? Rename the annotation"
            if close
            else f"remove it; gpushare reads {', '.join(USER_KEYS)}"
        )
        errors.append(InvalidInputError(shown, "is not a gpushare annotation", fix))
    return errors


def no_request_errors(annotations: Mapping[str, str]) -> list[InvalidInputError]:
    """For a pod that asks for no GPU (no fraction, no share, no GPU resource): a refusal for
    each user key that only qualifies a request, saying what it lacks."""
    if any(k in annotations for k in ASKING_KEYS):
        return []
    return [
        InvalidInputError(
            key,
            f"is set, but the pod asks for no GPU: it has neither {ANN_FRACTION} nor {ANN_SHARE}",
            f'add {ANN_FRACTION} (e.g. "0.25") or {ANN_SHARE}: <GpuShare>, or remove {key}',
        )
        for key in USER_KEYS
        if key in annotations and key != ANN_LIMIT  # parse_request names gpu-limit itself
    ]
