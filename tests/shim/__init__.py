"""Tests of isolation (devplugin/isolation/ and the C shim in shim/): limits, accounting, compute shares, the files
delivered to containers."""
