package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"github.com/gpushare/devplugin/e2e/internal/admission"
	"github.com/gpushare/devplugin/e2e/internal/dra"
	"github.com/gpushare/devplugin/e2e/internal/driversock"
	"github.com/gpushare/devplugin/e2e/internal/oci"
	"github.com/gpushare/devplugin/e2e/internal/podnet"
	"github.com/gpushare/devplugin/e2e/internal/pods"
	"github.com/gpushare/devplugin/e2e/internal/podworker"
	"github.com/gpushare/devplugin/e2e/internal/servicedns"
	"github.com/gpushare/devplugin/e2e/internal/statusmgr"
	"github.com/gpushare/devplugin/e2e/internal/toolkit"
)

// newRuntime wires the node's container runtime (--runtime runc): runc under <root>/runc, the pod network, the
// NVIDIA container toolkit's rules over the node's (fake) driver, whose socket it serves.
func newRuntime(ctx context.Context, o options, root string, client kubernetes.Interface, dm *devicemanager.ManagerImpl,
	table *pods.Table, adm *admission.Admitter, status *statusmgr.Manager) (*podworker.Runtime, error) {
	shim := o.shimBinary
	if shim == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		shim = filepath.Join(filepath.Dir(self), "containershim")
	}
	if _, err := os.Stat(shim); err != nil {
		return nil, fmt.Errorf("the container shim %s: %w (build it with `make e2e-bin`, or give --shim-binary)", shim, err)
	}
	var err error
	netw := &podnet.Network{BridgeNS: o.bridgeNS, Prefix: o.netnsPrefix, StateDir: filepath.Join(root, "ipam")}
	if o.bridgeNS != "" {
		if _, netw.Cluster, err = net.ParseCIDR(o.clusterCIDR); err != nil {
			return nil, fmt.Errorf("--cluster-cidr %q: %w", o.clusterCIDR, err)
		}
		if _, netw.Node, err = net.ParseCIDR(o.nodeCIDR); err != nil {
			return nil, fmt.Errorf("--pod-cidr %q: %w", o.nodeCIDR, err)
		}
		if netw.Gateway = net.ParseIP(o.gateway); netw.Gateway == nil {
			return nil, fmt.Errorf("--pod-gateway %q is not an address", o.gateway)
		}
		if o.serviceCIDR != "" {
			if _, netw.Services, err = net.ParseCIDR(o.serviceCIDR); err != nil {
				return nil, fmt.Errorf("--service-cidr %q: %w", o.serviceCIDR, err)
			}
		}
	}
	var driver *toolkit.Driver
	if o.nvidiaConfig != "" {
		driver = &toolkit.Driver{ConfigPath: o.nvidiaConfig, SocketDir: filepath.Join(root, "nvidia-fake"),
			LibDir: o.nvidiaLibs, Env: o.nvidiaEnv}
		if err := driversock.Serve(ctx, filepath.Join(driver.SocketDir, toolkit.SocketName)); err != nil {
			return nil, err
		}
	}
	names, err := servicedns.Start(ctx, client)
	if err != nil {
		return nil, err
	}
	tk := toolkit.Config{AcceptEnvvarUnprivileged: o.acceptEnvvar, AcceptVolumeMounts: o.acceptVolumeMount}
	return podworker.New(podworker.Config{
		Root: root, Runc: oci.Runc{Binary: o.runcBinary, Root: filepath.Join(root, "runc")}, Shim: shim,
		Images: o.images, Net: netw, Driver: driver, Toolkit: tk, CDIDirs: o.cdiDirs, Client: client, Names: names,
		NodeName: o.nodeName, HostIP: o.hostIP, DeviceOptions: dm.GetDeviceRunContainerOptions,
		ClaimCDI: func(pod *v1.Pod, name string) *dra.Injected {
			if c, ok := table.CDI(pod.UID, name).(dra.ContainerCDI); ok {
				return &c.Injected
			}
			return nil
		},
		Status: status.Set,
		Terminal: func(pod *v1.Pod, phase v1.PodPhase) {
			table.SetPhase(pod.UID, phase)
			adm.End(pod)
			klog.V(2).InfoS("pod's containers ended: devices freed", "pod", klog.KObj(pod), "podUID", pod.UID, "phase", phase)
		},
		BackoffInitial: o.crashBackoff,
	})
}

func findPod(table *pods.Table, ns, name string) (*v1.Pod, bool) {
	var found *v1.Pod
	for _, p := range table.GetPods() {
		if p.Namespace == ns && p.Name == name {
			found = p // the latest one of this name
		}
	}
	return found, found != nil
}

// cleanupMain is `nodeagent cleanup --root DIR [--netns-prefix P] [--runc PATH]`: stop and remove every container,
// mount and pod network namespace a node agent of this root left (the node's end).
func cleanupMain(args []string) int {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	root := fs.String("root", "", "the node's directory (required)")
	prefix := fs.String("netns-prefix", "", "the pods' network namespace prefix")
	runc := fs.String("runc", "runc", "the runc binary")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *root == "" {
		fmt.Fprintln(os.Stderr, "cleanup: --root is required")
		return 2
	}
	abs, _ := filepath.Abs(*root)
	if err := podworker.Cleanup(context.Background(), abs, oci.Runc{Binary: *runc, Root: filepath.Join(abs, "runc")}, *prefix); err != nil {
		fmt.Fprintf(os.Stderr, "cleanup: %v\n", err)
		return 1
	}
	return 0
}
