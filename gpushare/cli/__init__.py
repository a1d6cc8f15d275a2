"""Command-line tools: the `kubectl gpushare` plugin and `gpushare top`."""
