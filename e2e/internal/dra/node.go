// Package dra is the node's Dynamic Resource Allocation side, wired as the kubelet wires it (Kubernetes 1.36.3,
// pkg/kubelet/kubelet.go and cm/container_manager_linux.go): the kubelet's own DRA manager (pkg/kubelet/cm/dra,
// its checkpoint dra_manager_state in the node's root, as the kubelet keeps it in its root directory), and the
// kubelet's plugin manager (pkg/kubelet/pluginmanager) watching the plugins-registry directory with the DRA
// manager's registration handler (and the device manager's, as GetPluginRegistrationHandlers returns both).
//
// What a container runtime does with the CDI device IDs the DRA manager hands a container (GetResources) is
// played by Resolve: the CDI spec files in the CDI directories are read and their env and mounts applied.
package dra

import (
	"context"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	kubedra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// CheckpointName is the DRA manager's checkpoint file in its state directory.
const CheckpointName = "dra_manager_state"

// prepareTimeout bounds one pod's PrepareResources / UnprepareResources (the plugin calls inside have the DRA
// plugin manager's own per-call timeout).
const prepareTimeout = 2 * time.Minute

// Node is the DRA manager, the directories it and the runtime read, and the plugin manager feeding it.
type Node struct {
	Manager     *kubedra.Manager
	StateDir    string
	RegistryDir string
	CDIDirs     []string
}

// New creates the DRA manager with its checkpoint in stateDir (read back when the node restarts).
func New(client kubernetes.Interface, stateDir, registryDir string, cdiDirs []string) (*Node, error) {
	for _, d := range append([]string{stateDir, registryDir}, cdiDirs...) {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	m, err := kubedra.NewManager(klog.Background(), client, stateDir)
	if err != nil {
		return nil, fmt.Errorf("create the DRA manager: %w", err)
	}
	return &Node{Manager: m, StateDir: stateDir, RegistryDir: registryDir, CDIDirs: cdiDirs}, nil
}

// Start starts the DRA manager (its reconcile loop unprepares the claims of pods no longer active, every 60 s
// once the sources are ready; at startup it deletes the node's ResourceSlices, as the kubelet does, until the
// drivers register again) and the plugin manager watching RegistryDir with the DRA manager's registration
// handler and, where given, the device manager's.
func (n *Node) Start(ctx context.Context, activePods func() []*v1.Pod, getNode func(context.Context) (*v1.Node, error),
	sources config.SourcesReady, devicePlugins cache.PluginHandler) error {
	if err := n.Manager.Start(ctx, kubedra.ActivePodsFunc(activePods), kubedra.GetNodeFunc(getNode), sources); err != nil {
		return fmt.Errorf("start the DRA manager: %w", err)
	}
	pm := pluginmanager.NewPluginManager(n.RegistryDir, &record.FakeRecorder{})
	if devicePlugins != nil {
		pm.AddHandler(pluginwatcherapi.DevicePlugin, devicePlugins)
	}
	pm.AddHandler(pluginwatcherapi.DRAPlugin, n.Manager.GetWatcherHandler())
	go pm.Run(ctx, sources, ctx.Done())
	return nil
}

// PrepareRetries are the pauses between the attempts of Prepare: the kubelet's pod worker retries a failed
// PrepareDynamicResources with its back-off for as long as the pod exists; the node agent retries for about 6 s
// (a claim is often readable by the node a moment after the pod is: the Node authorizer's graph learns the
// pod-to-claim edge from the pod's status) and then gives up.
var PrepareRetries = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
	800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond}

// Prepare is the kubelet's PrepareDynamicResources before a pod's sandbox is created: for each claim of the pod,
// the DRA manager reads the ResourceClaim, checks it is allocated and reserved for the pod, and calls the driver's
// NodePrepareResources for the claims it has not prepared yet (a claim already prepared is not asked again).
// Tried again after each of PrepareRetries while it fails; the error is the DRA manager's last.
func (n *Node) Prepare(pod *v1.Pod) error {
	var err error
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), prepareTimeout)
		err = n.Manager.PrepareResources(ctx, pod)
		cancel()
		if err == nil || attempt == len(PrepareRetries) {
			return err
		}
		klog.V(2).InfoS("prepare dynamic resources failed, retrying", "pod", klog.KObj(pod), "podUID", pod.UID,
			"attempt", attempt+1, "in", PrepareRetries[attempt], "err", err)
		time.Sleep(PrepareRetries[attempt])
	}
}

// Unprepare is the kubelet's UnprepareDynamicResources once a pod's containers have stopped: the drivers'
// NodeUnprepareResources for each claim no other pod of the node still uses.
func (n *Node) Unprepare(pod *v1.Pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), prepareTimeout)
	defer cancel()
	return n.Manager.UnprepareResources(ctx, pod)
}

// Registered says whether a DRA driver of this name is registered with the DRA manager (its registration
// socket found by the plugin watcher, validated, and its DRA service reachable).
func (n *Node) Registered(driver string) bool {
	pm, ok := n.Manager.GetWatcherHandler().(*draplugin.DRAPluginManager)
	if !ok {
		return false
	}
	_, err := pm.GetPlugin(driver)
	return err == nil
}

// ContainerCDI is what the runtime gives one container from its claims: the CDI device IDs the DRA manager
// hands over (GetResources) and what their specs inject.
type ContainerCDI struct {
	Devices  []string `json:"cdiDevices"`
	Injected Injected `json:"injected"`
}

// Container resolves one container's CDI devices as the runtime does when it creates the container. The error
// is the DRA manager's, or an *UnresolvableError.
func (n *Node) Container(pod *v1.Pod, c *v1.Container) (ContainerCDI, error) {
	info, err := n.Manager.GetResources(pod, c)
	if err != nil {
		return ContainerCDI{}, err
	}
	out := ContainerCDI{Devices: []string{}}
	for _, d := range info.CDIDevices {
		out.Devices = append(out.Devices, d.Name)
	}
	out.Injected, err = Resolve(n.CDIDirs, out.Devices)
	return out, err
}
