"""Scheduling throughput at scale: kube-scheduler + the gpushare extender over KWOK nodes."""
