"""The socket pair between the controller and its admission process: length-prefixed frames.

The child (which reads what any pod sends) writes msgpack arrays of plain values, which the
controller decodes strictly; the controller writes pickles of its own values (facts, lookup
answers), which only the child reads. Kinds, child to controller: ``listening`` (port),
``failed`` (reason), ``ask`` (id, lookup name, arguments), ``metrics`` (id, Authorization
header), ``done`` (webhook, outcome, seconds); controller to child: ``facts`` (values, lookup
names, readiness), ``answer`` (id, ok, value), ``metrics`` (id, status, body, content type,
headers), ``reload_tls``, ``forget`` (the kept lookup answers: a GpuShare or namespace changed).
"""

import asyncio
import pickle
import struct
from typing import Any

import msgspec

HEADER = struct.Struct(">I")
MAX_FROM_CHILD = 1 << 20
"""Largest frame the controller reads (asks carry a few short strings)."""
MAX_FROM_PARENT = 512 << 20
"""Largest frame the child reads (a /metrics answer at thousands of nodes)."""
MAX_ARGS = 4
MAX_ARG_CHARS = 1024
"""An ask's arguments: at most this many strings or integers of at most this many characters
(names, namespaces and UIDs are shorter)."""

_encode = msgspec.msgpack.Encoder()
_decode = msgspec.msgpack.Decoder()


class LinkError(Exception):
    """A frame the reader refuses (too long, not the format): the link is closed."""


def child_frame(*values: object) -> bytes:
    payload = _encode.encode(list(values))
    return HEADER.pack(len(payload)) + payload


def parent_frame(*values: object) -> bytes:
    payload = pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


async def _payload(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    try:
        (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if length > limit:
            raise LinkError(f"a frame of {length} bytes (at most {limit})")
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        return None


async def read_from_child(reader: asyncio.StreamReader) -> list[Any] | None:
    """The child's next message (None at its end); LinkError for one that is not a list."""
    payload = await _payload(reader, MAX_FROM_CHILD)
    if payload is None:
        return None
    try:
        message = _decode.decode(payload)
    except msgspec.DecodeError as exc:
        raise LinkError(f"not msgpack: {exc}") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise LinkError("a message is a list starting with its kind")
    return message


async def read_from_parent(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The controller's next message (None at its end)."""
    payload = await _payload(reader, MAX_FROM_PARENT)
    if payload is None:
        return None
    message = pickle.loads(payload)  # the controller's own values
    assert isinstance(message, tuple)
    return message


def plain_args(args: object) -> tuple[str | int | None, ...]:
    """An ask's arguments, checked: a short list of short strings, integers or None."""
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise LinkError(f"arguments must be a list of at most {MAX_ARGS}")
    out: list[str | int | None] = []
    for arg in args:
        if isinstance(arg, str) and len(arg) > MAX_ARG_CHARS:
            raise LinkError(f"an argument over {MAX_ARG_CHARS} characters")
        if (arg is not None and not isinstance(arg, str | int)) or isinstance(arg, bool):
            raise LinkError("arguments are strings, integers or null")
        out.append(arg)
    return tuple(out)
