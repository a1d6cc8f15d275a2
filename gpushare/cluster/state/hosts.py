"""Each node's free host CPU and memory, as the view counts them: its ``status.allocatable``
minus the requests of every live pod bound there, gpushare's or not, and of the pods this process
holds or binds there (their reservation's demand). The gpushare policy charges GPU share stranded
by CPU or memory (docs/packing.md, "Stranding"); ``host_resources`` reads the quantities.
"""

from collections.abc import Callable, Mapping

from gpushare.cluster.state.reservations import Reservation
from gpushare.packing.model import NodeState


class HostUsage:
    """What each pod takes of its node's CPU and memory, summed per node into the free CPU and
    memory of the node's :class:`NodeState` (whose version ``bump`` moves when they change)."""

    def __init__(
        self,
        *,
        nodes: Mapping[str, NodeState],
        bump: Callable[[str], None],
        reservations: Mapping[str, Reservation],
    ) -> None:
        self._nodes = nodes
        self._bump = bump
        self._reservations = reservations
        self._allocatable: dict[str, tuple[int, int]] = {}
        self.bound: dict[str, tuple[str, int, int]] = {}
        """Pod key -> (node, milli-CPU, memory bytes) of every live pod bound to a node."""
        self.of: dict[str, tuple[str, int, int]] = {}
        """Pod key -> what it takes of its node's host resources: bound, else held by a
        reservation of this process."""
        self._used: dict[str, tuple[int, int]] = {}
        self.free_room: dict[str, tuple[int, int]] = {}
        """Node -> (milli-CPU, memory bytes) left for pods, kept as the counts change (what
        :meth:`free` says; the DRA allocator reads it for every node of every claim)."""

    def set_allocatable(self, name: str, allocatable: tuple[int, int] | None) -> None:
        """(milli-CPU, memory bytes) node ``name`` offers pods; None when its status does not
        say."""
        if allocatable is None:
            self._allocatable.pop(name, None)
        else:
            self._allocatable[name] = allocatable
        self._count_free(name)

    @property
    def allocatable(self) -> Mapping[str, tuple[int, int]]:
        """Node -> (milli-CPU, memory bytes) it offers pods, where its status says (read-only)."""
        return self._allocatable

    def free(self, name: str) -> tuple[int, int] | None:
        """(milli-CPU, memory bytes) node ``name`` has left for pods, whether or not it has a
        GPU inventory (DRA-mode nodes have none); None when its status does not say."""
        return self.free_room.get(name)

    def _count_free(self, name: str) -> None:
        allocatable = self._allocatable.get(name)
        if allocatable is None:
            self.free_room.pop(name, None)
            return
        used = self._used.get(name, (0, 0))
        self.free_room[name] = (allocatable[0] - used[0], allocatable[1] - used[1])

    def bind(self, key: str, node: str | None, cpu: int, memory: int) -> None:
        """Pod ``key`` is bound to ``node`` requesting ``cpu`` and ``memory`` (``node`` None:
        not bound, or finished). Counted at the next :meth:`refresh` of the pod."""
        if node is not None:
            self.bound[key] = (node, cpu, memory)
        else:
            self.bound.pop(key, None)

    def unbind(self, key: str) -> None:
        """Pod ``key`` is gone. Counted at the next :meth:`refresh` of the pod."""
        self.bound.pop(key, None)

    def refresh(self, key: str) -> None:
        """Recount what pod ``key`` takes of its node's CPU and memory: its requests once bound,
        its reservation's demand while this process holds or binds it."""
        new = self.bound.get(key)
        if new is None:
            res = self._reservations.get(key)
            if res is not None and (res.demand.cpu_milli or res.demand.host_memory_bytes):
                new = (res.node, res.demand.cpu_milli, res.demand.host_memory_bytes)
        old = self.of.get(key)
        if new == old:
            return
        for entry, sign in ((old, -1), (new, 1)):
            if entry is None:
                continue
            node, cpu, memory = entry
            used_cpu, used_memory = self._used.get(node, (0, 0))
            used = (used_cpu + sign * cpu, used_memory + sign * memory)
            if used == (0, 0):
                self._used.pop(node, None)
            else:
                self._used[node] = used
            self._count_free(node)
        if new is None:
            self.of.pop(key, None)
        else:
            self.of[key] = new
        for node in {e[0] for e in (old, new) if e is not None}:
            self.sync(node)

    def sync(self, name: str) -> None:
        """Set the node's free CPU and memory from its allocatable and the pods there (None:
        the node's status did not say what it offers)."""
        node = self._nodes.get(name)
        if node is None:
            return
        allocatable = self._allocatable.get(name)
        if allocatable is None:
            free: tuple[int | None, int | None] = (None, None)
        else:
            used = self._used.get(name, (0, 0))
            free = (allocatable[0] - used[0], allocatable[1] - used[1])
        if (node.cpu_milli_free, node.memory_free_bytes) != free:
            node.cpu_milli_free, node.memory_free_bytes = free
            self._bump(name)
