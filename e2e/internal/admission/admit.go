// Package admission admits a pod as the kubelet's HandlePodAdditions does: the pod goes into the pod manager
// first, then the allocation manager runs the admit handlers in the kubelet's order (the topology manager's, which
// calls the device manager's Allocate for each init container then each app container, then the predicate admit
// handler: resource fit against the node's allocatable, after the device manager's UpdatePluginResources). One pod
// at a time, as the kubelet's sync loop admits them.
package admission

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/allocation"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/gpushare/devplugin/e2e/internal/dra"
	"github.com/gpushare/devplugin/e2e/internal/pods"
)

// Result is the outcome of one admission: Reason and Message are the rejecting handler's own; Seconds is how
// long the admit handlers took (the device plugins' calls included, the containers' start not). Started says
// whether the admitted pod's containers were then created: false when its dynamic resources could not be
// prepared or a container's CDI devices could not be injected (Reason and Message say which).
type Result struct {
	Admitted bool    `json:"admitted"`
	Started  bool    `json:"started,omitempty"`
	Reason   string  `json:"reason"`
	Message  string  `json:"message"`
	Seconds  float64 `json:"seconds"`
}

// Reasons for an admitted pod whose containers could not be created: the kubelet's event reason when
// PrepareDynamicResources fails, and the container status reason when the runtime refuses to create a container.
const (
	ReasonFailedPrepare = "FailedPrepareDynamicResources"
	ReasonCreateFailed  = "CreateContainerError"
)

// GetNode returns the Node the predicate admit handler checks the pod against (the kubelet's GetCachedNode).
type GetNode = func(ctx context.Context, useCache bool) (*v1.Node, error)

// Admitter admits the node's pods one at a time.
type Admitter struct {
	mu    sync.Mutex
	dm    *devicemanager.ManagerImpl
	table *pods.Table
	alloc allocation.Manager
	dra   *dra.Node
}

// WithDRA makes the admitter prepare each pod's ResourceClaims through the DRA manager before its containers are
// created, hand each container its CDI devices, and unprepare them when the pod ends (the kubelet's
// PrepareDynamicResources / GetResources / UnprepareDynamicResources).
func (a *Admitter) WithDRA(n *dra.Node) *Admitter {
	a.dra = n
	return a
}

// New wires the kubelet's allocation manager (its checkpoint under root) with the topology manager's admit handler
// (tm, with the device manager as its hint provider) and the predicate admit handler.
func New(root string, dm *devicemanager.ManagerImpl, tm topologymanager.Manager, table *pods.Table, sources config.SourcesReady, getNode GetNode) *Admitter {
	alloc := allocation.NewManager(root, nil, nil, table.GetActivePods, table.Get, sources, &record.FakeRecorder{})
	alloc.AddPodAdmitHandlers(lifecycle.PodAdmitHandlers{
		tm,
		lifecycle.NewPredicateAdmitHandler(getNode, lifecycle.NewAdmissionFailureHandlerStub(), dm.UpdatePluginResources),
	})
	return &Admitter{dm: dm, table: table, alloc: alloc}
}

// NewTopologyManager is the kubelet's default topology manager (policy none): its admit handler calls each hint
// provider's Allocate for every init container, then every app container.
func NewTopologyManager() (topologymanager.Manager, error) {
	return topologymanager.NewManager(nil, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
}

// Admit adds the pod to the pod manager and runs the admit handlers. An admitted pod's containers are then
// started (the device manager's GetDeviceRunContainerOptions, which the kubelet calls when it creates each
// container: PreStartContainer where a plugin asks for it, and the envs the plugin gave) and it is Running; a
// rejected pod is Failed, so it leaves the active pods.
func (a *Admitter) Admit(pod *v1.Pod) Result {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.table.Add(pod)
	start := time.Now()
	ok, reason, message := a.alloc.AddPod(a.table.GetActivePods(), pod)
	took := time.Since(start).Seconds()
	if !ok {
		a.table.SetPhase(pod.UID, v1.PodFailed)
		klog.InfoS("pod rejected", "pod", klog.KObj(pod), "podUID", pod.UID, "reason", reason, "message", message)
		return Result{Admitted: false, Reason: reason, Message: message, Seconds: took}
	}
	if reason, message, ok := a.start(pod); !ok {
		a.table.SetPhase(pod.UID, v1.PodFailed)
		a.unprepare(pod)
		klog.InfoS("pod admitted, its containers not created", "pod", klog.KObj(pod), "podUID", pod.UID, "reason", reason, "message", message)
		return Result{Admitted: true, Reason: reason, Message: message, Seconds: took}
	}
	a.table.SetPhase(pod.UID, v1.PodRunning)
	klog.V(2).InfoS("pod admitted", "pod", klog.KObj(pod), "podUID", pod.UID)
	return Result{Admitted: true, Started: true, Seconds: took}
}

// Adopt takes a pod that was already admitted and Running before a restart: it goes into the pod manager as
// active, without a second admission, and keeps the devices its checkpoint holds.
func (a *Admitter) Adopt(pod *v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.table.Add(pod)
	a.table.SetPhase(pod.UID, v1.PodRunning)
	if reason, message, ok := a.start(pod); !ok {
		klog.InfoS("adopted pod's containers not re-created", "pod", klog.KObj(pod), "podUID", pod.UID, "reason", reason, "message", message)
	}
}

// start prepares the pod's dynamic resources (DRA nodes: the kubelet's PrepareDynamicResources before the
// sandbox) and records each container's run options in the order the kubelet starts them: the device manager's
// (PreStartContainer where a plugin asks for it, the plugin's envs), then on DRA nodes the container's CDI
// devices from the DRA manager, resolved and injected as the runtime does (their env over the device plugin's).
// ok is false, with the reason and message the pod then carries, when preparing fails or a CDI device is unknown.
func (a *Admitter) start(pod *v1.Pod) (reason, message string, ok bool) {
	ctx := context.Background()
	if a.dra != nil && len(pod.Spec.ResourceClaims) > 0 {
		if err := a.dra.Prepare(pod); err != nil {
			return ReasonFailedPrepare, "Failed to prepare dynamic resources: " + err.Error(), false
		}
	}
	containers := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range containers {
		c := &containers[i]
		if a.dra != nil && len(pod.Spec.ResourceClaims) > 0 {
			cdi, err := a.dra.Container(pod, c)
			if err != nil {
				return ReasonCreateFailed, "container " + c.Name + ": " + err.Error(), false
			}
			a.table.SetCDI(pod.UID, c.Name, cdi)
			klog.V(2).InfoS("container CDI devices", "pod", klog.KObj(pod), "podUID", pod.UID, "container", c.Name, "cdiDevices", cdi.Devices)
		}
		opts, err := a.dm.GetDeviceRunContainerOptions(ctx, pod, c)
		if err != nil {
			klog.ErrorS(err, "container run options", "pod", klog.KObj(pod), "podUID", pod.UID, "container", c.Name)
			continue
		}
		envs := map[string]string{}
		if opts != nil {
			for _, e := range opts.Envs {
				envs[e.Name] = e.Value
			}
		}
		if cdi, ok := a.table.CDI(pod.UID, c.Name).(dra.ContainerCDI); ok {
			for k, v := range cdi.Injected.Env {
				envs[k] = v
			}
		}
		a.table.SetEnvs(pod.UID, c.Name, envs)
	}
	return "", "", true
}

// unprepare is the kubelet's UnprepareDynamicResources once the pod's containers are gone; a failure is retried
// by the DRA manager's reconcile loop (every 60 s, for pods no longer active).
func (a *Admitter) unprepare(pod *v1.Pod) {
	if a.dra == nil || len(pod.Spec.ResourceClaims) == 0 {
		return
	}
	if err := a.dra.Unprepare(pod); err != nil {
		klog.ErrorS(err, "unprepare the pod's dynamic resources (the DRA manager's reconcile loop retries)", "pod", klog.KObj(pod), "podUID", pod.UID)
	}
}

// End makes the pod inactive (its containers are gone) and lets the device manager free its devices, as the
// kubelet's housekeeping does once the pod worker has terminated the pod.
func (a *Admitter) End(pod *v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.table.End(pod.UID)
	a.alloc.RemovePod(pod.UID)
	a.dm.UpdateAllocatedDevices()
	a.unprepare(pod)
	klog.V(2).InfoS("pod ended", "pod", klog.KObj(pod), "podUID", pod.UID)
}
