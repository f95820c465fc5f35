"""`devplugin inspect` / `kubectl inspect gpushare`: per node and per GPU, who holds what, from the apiserver."""
