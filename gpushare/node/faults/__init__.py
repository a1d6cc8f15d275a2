"""Fatal GPU faults of MPS clients: detect them, say who was involved, recover, and find the
workload that keeps faulting.

Why: a fatal fault in one MPS client (an illegal memory access, a device-side assert) is
reported to every client of that GPU's MPS server, so the pods sharing the GPU fail with it
(the server survives and takes new clients about a second later; measured in
docs/node-agent.md, "Fatal GPU faults"). Users see only "illegal memory access" in every pod.

Who faulted cannot be read off one fault: the server's ``Client {PID: X, Context: 1}
encountered a fatal GPU error`` line and the kernel's Xid 31 line name the same process, but
that process was the real faulter in only about half of the faults measured (the other half it
was the victim, whichever client started first; docs/node-agent.md). So an incident
keeps the named client as evidence ("named by the MPS server") and treats every client torn
down with it as *involved*; Events say exactly that. Guilt is concluded across incidents: a
workload involved in ``exclusive_after`` faults whose other involved workloads have nothing in
common is the common factor (a victim shares its faults only with the faulter).

How: each GPU's MPS daemon writes ``control.log`` and ``server.log`` into its log directory
(``<mps-root>/<uuid>/log``). The monitor follows both files, tracks which client PIDs are
connected to which server, and turns fault lines into a :class:`~.incidents.FaultIncident`:
the client(s) the server names, and every other client torn down with it or connected at the
time. Client PIDs are resolved to pods while the clients live (``/proc/<pid>/cgroup``, or the
PID namespace mapping when the server logs a container-side PID). Then it

- records a Warning Event on the named pod (``GpuShareFault``: the server named it, which is
  not proof) and on each other involved pod (``GpuShareFaultVictim``), and counts them;
- health-checks the GPU's MPS daemon (the manager restarts a daemon that does not answer);
- follows the recovery: the server takes no new client (CUDA error 807, "Server teardown in
  progress") until every affected client has exited. A pod that keeps its broken context gets an
  Event after ``linger_after_s`` and is marked for eviction (``gpushare.io/evict``) after
  ``evict_lingering_after_s``, because it blocks the GPU for every new pod. (``terminate_client``
  through the control daemon is no remedy: on driver 580 it only asks the client to exit and
  blocks the control daemon, health checks included, until it does.)
- marks the culprit (:class:`~.verdicts.RepeatOffenders`: involved in ``exclusive_after``
  faults within ``window_s`` whose other involved workloads have no workload in common) for an
  exclusive GPU: listed in the node annotation ``gpushare.io/exclusive-workloads`` (the
  admission webhook gives the workload's new pods a whole GPU, which runs without MPS) and its
  pod annotated ``gpushare.io/evict``: the gpushare controller evicts it (the node agent has no
  eviction right), so its own controller recreates it on a GPU of its own.
- separates workloads that keep faulting together (their faults always involve the same
  others, so nothing can be concluded): one pod of them, chosen by
  :func:`~.verdicts.pick_to_separate`, is marked ``gpushare.io/evict`` but not exclusive, so it
  is recreated and the next fault, beside other neighbours, tells which one faults.

The parsing and classification are pure functions; the monitor does its I/O through the
callables it is given, so it is tested without a GPU or a cluster.

Modules, one job each:

- :mod:`.parsing`: MPS log lines, and which clients the lines of one fault name;
- :mod:`.incidents`: one GPU's lines to incidents, each followed to its recovery;
- :mod:`.tailing`: following a log file with bounded memory;
- :mod:`.procfs`: client PID to pod, through ``/proc``;
- :mod:`.verdicts`: workloads, and guilt concluded across incidents (pure);
- :mod:`.actions`: what is done in Kubernetes: Events, exclusive GPUs, separations;
- :mod:`.metrics`: the counters and the ``gpushare_mps_fault_*`` series;
- :mod:`.monitor`: :class:`~.monitor.FaultMonitor`, the loop that ties them together.
"""
