"""Tests of the test doubles: the fake NVIDIA driver (fakes/), the fake apiserver and the kubelet emulator
(devplugin_sim/)."""
