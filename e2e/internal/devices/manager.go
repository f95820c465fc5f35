// Package devices runs the kubelet's own device manager (pkg/kubelet/cm/devicemanager) under a root directory of
// our choosing, and reads its books.
package devices

import (
	"fmt"
	"path/filepath"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
)

// newManagerImpl is the device manager's own constructor. The exported NewManagerImpl hard-codes the socket
// /var/lib/kubelet/device-plugins/kubelet.sock; several nodes on one machine need one directory each, so the
// constructor it wraps is called with our socket path. Nothing else differs from the kubelet's. The declaration
// must match the pinned release's (go.mod): check it against pkg/kubelet/cm/devicemanager/manager.go when
// moving to another Kubernetes release.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// SocketPath is the registration socket of a node rooted at root: <root>/device-plugins/kubelet.sock.
func SocketPath(root string) string {
	return filepath.Join(root, "device-plugins", "kubelet.sock")
}

// New creates the device manager serving <root>/device-plugins/kubelet.sock, with its checkpoint in the same
// directory (as the kubelet keeps it), and the topology manager's affinity store as the kubelet wires it.
func New(root string, store topologymanager.Store) (*devicemanager.ManagerImpl, error) {
	m, err := newManagerImpl(klog.Background(), SocketPath(root), nil, store)
	if err != nil {
		return nil, fmt.Errorf("device manager under %s: %w", root, err)
	}
	return m, nil
}

// Start reads the checkpoint and starts the registration server, as the container manager does at kubelet start.
// activePods lists the pods whose devices stay allocated; sourcesReady gates freeing the devices of pods that are
// not active (the kubelet frees nothing until its pod sources have been read).
func Start(m *devicemanager.ManagerImpl, activePods func() []*v1.Pod, sourcesReady config.SourcesReady) error {
	return m.Start(klog.Background(), activePods, sourcesReady, containermap.NewContainerMap(), sets.New[string]())
}
