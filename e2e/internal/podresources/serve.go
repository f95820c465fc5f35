// Package podresources serves the kubelet's own PodResources v1 server (pkg/kubelet/apis/podresources) on
// <root>/pod-resources/kubelet.sock, with providers behaving like the kubelet's: pods from the pod manager (List
// gives the active pods, as KubeletPodResourcesListUseActivePods does by default in 1.36), devices from the
// device manager, no exclusive CPUs, memory or dynamic resources.
package podresources

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	kubeletpr "k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"github.com/gpushare/devplugin/e2e/internal/pods"
)

// SocketPath is <root>/pod-resources/kubelet.sock.
func SocketPath(root string) string {
	return filepath.Join(root, "pod-resources", "kubelet.sock")
}

// Serve starts the server as the kubelet's ListenAndServePodResources does (same rate limiter, v1 and v1alpha1)
// and returns it; Stop it to close the socket.
func Serve(ctx context.Context, root string, dm *devicemanager.ManagerImpl, table *pods.Table) (*grpc.Server, error) {
	path := SocketPath(root)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("pod-resources directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("stale pod-resources socket %s: %w", path, err)
	}
	providers := kubeletpr.PodResourcesProviders{
		Pods:             table,
		Devices:          devicesProvider{dm},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: noDynamic{},
	}
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", kubeletpr.DefaultQPS, kubeletpr.DefaultBurstTokens))
	podresourcesv1alpha1.RegisterPodResourcesListerServer(server, kubeletpr.NewV1alpha1PodResourcesServer(providers))
	podresourcesv1.RegisterPodResourcesListerServer(server, kubeletpr.NewV1PodResourcesServer(ctx, providers))
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	go func() { _ = server.Serve(l) }()
	return server, nil
}
