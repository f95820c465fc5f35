"""Tests of the node daemon as a program (devplugin/app/): settings, `devplugin serve`, metrics, its HTTP
listeners."""
