"""Tests of the device plugin servers (devplugin/deviceplugin/): registration, ListAndWatch, Allocate answers to the
kubelet."""
