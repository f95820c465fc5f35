// Package pods keeps the node's pods as the kubelet does: the kubelet's own pod manager (pkg/kubelet/pod) is the
// source of truth for the pods bound here, and a small status table plays the status manager and pod workers:
// a pod rejected at admission is Failed, a pod that ended is known terminated; both leave the active pods, so the
// device manager frees their devices.
package pods

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubepod "k8s.io/kubernetes/pkg/kubelet/pod"
)

// Table is the node's pods and what the kubelet knows of each.
type Table struct {
	pm         kubepod.Manager
	mu         sync.Mutex
	phase      map[types.UID]v1.PodPhase
	terminated map[types.UID]bool
	envs       map[types.UID]map[string]map[string]string
	cdi        map[types.UID]map[string]any
}

// NewTable returns an empty table over a fresh pod manager.
func NewTable() *Table {
	return &Table{
		pm:         kubepod.NewBasicPodManager(),
		phase:      map[types.UID]v1.PodPhase{},
		terminated: map[types.UID]bool{},
		envs:       map[types.UID]map[string]map[string]string{},
		cdi:        map[types.UID]map[string]any{},
	}
}

// Add puts a pod in the pod manager (the kubelet does this before admitting it), Pending.
func (t *Table) Add(pod *v1.Pod) {
	t.pm.AddPod(pod)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.phase[pod.UID]; !ok {
		t.phase[pod.UID] = v1.PodPending
	}
}

// Known says whether the pod manager holds this UID.
func (t *Table) Known(uid types.UID) bool {
	_, ok := t.pm.GetPodByUID(uid)
	return ok
}

// Get returns the pod of this UID.
func (t *Table) Get(uid types.UID) (*v1.Pod, bool) { return t.pm.GetPodByUID(uid) }

// SetPhase records the phase the kubelet gave the pod (Running once admitted, Failed when rejected).
func (t *Table) SetPhase(uid types.UID, phase v1.PodPhase) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.phase[uid] = phase
}

// Phase is the phase recorded for the pod.
func (t *Table) Phase(uid types.UID) v1.PodPhase {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.phase[uid]
}

// SetEnvs records the envs the device manager gives a container when it starts.
func (t *Table) SetEnvs(uid types.UID, container string, envs map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.envs[uid] == nil {
		t.envs[uid] = map[string]map[string]string{}
	}
	t.envs[uid][container] = envs
}

// Envs is what SetEnvs recorded.
func (t *Table) Envs(uid types.UID, container string) map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.envs[uid][container]
}

// SetCDI records what the runtime gave a container from its CDI devices (the DRA manager's CDI device IDs and
// what their specs injected), for the books.
func (t *Table) SetCDI(uid types.UID, container string, cdi any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cdi[uid] == nil {
		t.cdi[uid] = map[string]any{}
	}
	t.cdi[uid][container] = cdi
}

// CDI is what SetCDI recorded (nil: none).
func (t *Table) CDI(uid types.UID, container string) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cdi[uid][container]
}

// End marks the pod known terminated (its containers are gone): it leaves the active pods, so the device manager
// frees its devices at its next UpdateAllocatedDevices. The pod stays in the pod manager until Remove.
func (t *Table) End(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.terminated[uid] = true
	if p := t.phase[uid]; p != v1.PodFailed {
		t.phase[uid] = v1.PodSucceeded
	}
}

// Ended says whether End was called for the pod (its devices are freed).
func (t *Table) Ended(uid types.UID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.terminated[uid]
}

// Remove drops the pod from the pod manager (deleted from the apiserver).
func (t *Table) Remove(uid types.UID) {
	if pod, ok := t.pm.GetPodByUID(uid); ok {
		t.pm.RemovePod(pod)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.phase, uid)
	delete(t.terminated, uid)
	delete(t.envs, uid)
	delete(t.cdi, uid)
}

// inactive is the kubelet's isPodInactive: known terminated, or terminal (Failed / Succeeded).
func (t *Table) inactive(pod *v1.Pod) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.terminated[pod.UID] {
		return true
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return true
	}
	p := t.phase[pod.UID]
	return p == v1.PodSucceeded || p == v1.PodFailed
}

// GetActivePods is the kubelet's GetActivePods: the pod manager's pods less the inactive ones.
func (t *Table) GetActivePods() []*v1.Pod {
	all := t.pm.GetPods()
	out := make([]*v1.Pod, 0, len(all))
	for _, p := range all {
		if !t.inactive(p) {
			out = append(out, p)
		}
	}
	return out
}

// GetPods is every pod of the pod manager (the PodResources provider's GetPods).
func (t *Table) GetPods() []*v1.Pod { return t.pm.GetPods() }

// GetPodByName is the kubelet's PodResources provider: the pod manager's pod unless it is inactive.
func (t *Table) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	pod, ok := t.pm.GetPodByName(namespace, name)
	if !ok || t.inactive(pod) {
		return nil, false
	}
	return pod, true
}
