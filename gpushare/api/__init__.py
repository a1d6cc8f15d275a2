"""The contract shared by every gpushare component: names, units and parsing of user input.

This package imports nothing else of gpushare, so every layer may depend on it.
"""
