package devices

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// Container is one container's devices, as the device manager records them.
type Container struct {
	Name    string              `json:"name"`
	Init    bool                `json:"init"`
	Devices map[string][]string `json:"devices"`
	Envs    map[string]string   `json:"envs,omitempty"`
	// CDI is what the container got from its ResourceClaims (DRA nodes): the CDI device IDs and what their
	// specs injected (env, mounts).
	CDI any `json:"cdi,omitempty"`
}

// Pod is one pod of the books.
type Pod struct {
	Namespace  string      `json:"namespace"`
	Name       string      `json:"name"`
	UID        string      `json:"uid"`
	Phase      string      `json:"phase"`
	Containers []Container `json:"containers"`
}

// Books is the device manager's own view: what it publishes (capacity, allocatable), the healthy device IDs, and
// which devices each container of each known pod holds.
type Books struct {
	Capacity    map[string]int64    `json:"capacity"`
	Allocatable map[string]int64    `json:"allocatable"`
	Healthy     map[string][]string `json:"healthy"`
	Pods        []Pod               `json:"pods"`
}

// PodView is what the books need to know of a pod besides its devices.
type PodView struct {
	Pod   *v1.Pod
	Phase v1.PodPhase
	Envs  func(container string) map[string]string
	CDI   func(container string) any
}

// Collect reads the books: capacity from c, healthy IDs and each container's devices from the device manager.
func Collect(m *devicemanager.ManagerImpl, c *CapacityReader, pods []PodView) Books {
	capacity, allocatable := c.Read()
	b := Books{Capacity: Counts(capacity), Allocatable: Counts(allocatable), Healthy: HealthyIDs(m), Pods: []Pod{}}
	for _, pv := range pods {
		p := Pod{Namespace: pv.Pod.Namespace, Name: pv.Pod.Name, UID: string(pv.Pod.UID), Phase: string(pv.Phase), Containers: []Container{}}
		add := func(cs []v1.Container, init bool) {
			for _, ctr := range cs {
				p.Containers = append(p.Containers, Container{
					Name: ctr.Name, Init: init,
					Devices: ContainerDevices(m, string(pv.Pod.UID), ctr.Name),
					Envs:    pv.Envs(ctr.Name),
					CDI:     pv.CDI(ctr.Name),
				})
			}
		}
		add(pv.Pod.Spec.InitContainers, true)
		add(pv.Pod.Spec.Containers, false)
		b.Pods = append(b.Pods, p)
	}
	return b
}

// HealthyIDs lists the healthy device IDs per resource (GetAllocatableDevices), sorted.
func HealthyIDs(m *devicemanager.ManagerImpl) map[string][]string {
	out := map[string][]string{}
	for res, devs := range m.GetAllocatableDevices() {
		out[res] = sortedIDs(devs)
	}
	return out
}

// ContainerDevices lists the devices the device manager holds for one container (GetDevices), sorted per resource.
func ContainerDevices(m *devicemanager.ManagerImpl, podUID, container string) map[string][]string {
	out := map[string][]string{}
	for res, devs := range m.GetDevices(podUID, container) {
		out[res] = sortedIDs(devs)
	}
	return out
}

func sortedIDs(devs map[string]*pluginapi.Device) []string {
	ids := make([]string, 0, len(devs))
	for id := range devs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Counts turns a ResourceList into plain integers.
func Counts(l v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for k, v := range l {
		out[string(k)] = v.Value()
	}
	return out
}
