"""The admission webhook's port, served by a process of its own.

Any pod can reach the webhook's port (the API server proves nothing to a webhook), and what it
sends there must not slow the scheduler extender or spend the controller's memory: in one
process, idle connections held by one pod left 1-2 of 60 admissions answered, 64 unfinished
8 MiB bodies took the controller from 61 to 648 MiB, and one review with a 4-million-integer
array moved the extender's filter p50 from 0.8 ms to over a second (issue 67). So the
controller starts a child process (:mod:`.child`) that owns the port: TLS, connections, bodies,
JSON parsing and the review itself, under per-client bounds (:mod:`gpushare.cluster.lean_http`)
and a fair queue, at a lower CPU priority. It asks the controller (:mod:`.host`) only for the
few facts a review needs (the webhook's :class:`~gpushare.cluster.webhook.facts.ClusterFacts`
lookups, one small message each) over a socket pair (:mod:`.link`). docs/security.md, "The
webhook's port".
"""
