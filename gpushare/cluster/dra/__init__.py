"""DRA mode in the controller: gpushare places claims (docs/dra.md, "Who places a claim")."""
