"""The one layer that talks to the Kubernetes API (import-linter keeps lightkube here).

- ``config``: where a process finds the API server;
- ``informer`` and ``raw``: list + watch into callbacks, decoded straight into dicts;
- ``controller``, ``operator``, ``node``: the calls each process makes (typed facades);
- ``events``: core/v1 Events, as every process records them;
- ``errors``: what a failed call raises, one typed error per answer a caller acts on (not
  found, conflict, gone, forbidden, ...), never a status code to compare;
- ``retry``: the one retry policy (which failures are transient, and the backoff).
"""
