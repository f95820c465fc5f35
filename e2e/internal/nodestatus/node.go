// Package nodestatus builds the node's Node object (capacity and allocatable = cpu, memory, pods plus the device
// manager's), registers it and keeps its status up to date at the kubelet's node status period, and removes the
// not-ready taint once the node is Ready (the node lifecycle controller's job, absent here).
package nodestatus

import (
	"runtime"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Base is what the node offers besides devices.
type Base struct {
	Name   string
	CPU    resource.Quantity
	Memory resource.Quantity
	Pods   resource.Quantity
}

// Build returns the Node with the base resources plus the devices' capacity and allocatable; resources whose
// plugin went away are published at 0, as the kubelet's node status setter does.
func Build(b Base, devCapacity, devAllocatable v1.ResourceList, removed []string, now metav1.Time) *v1.Node {
	capacity := v1.ResourceList{v1.ResourceCPU: b.CPU, v1.ResourceMemory: b.Memory, v1.ResourcePods: b.Pods}
	allocatable := capacity.DeepCopy()
	for k, v := range devCapacity {
		capacity[k] = v
	}
	for k, v := range devAllocatable {
		allocatable[k] = v
	}
	for _, r := range removed {
		capacity[v1.ResourceName(r)] = *resource.NewQuantity(0, resource.DecimalSI)
		allocatable[v1.ResourceName(r)] = *resource.NewQuantity(0, resource.DecimalSI)
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: b.Name,
			Labels: map[string]string{
				v1.LabelHostname:   b.Name,
				v1.LabelOSStable:   runtime.GOOS,
				v1.LabelArchStable: runtime.GOARCH,
			},
		},
		Status: v1.NodeStatus{
			Capacity:    capacity,
			Allocatable: allocatable,
			Phase:       v1.NodeRunning,
			Conditions:  conditions(now),
			Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: v1.NodeHostName, Address: b.Name},
			},
			NodeInfo: v1.NodeSystemInfo{
				KubeletVersion:          "v1.36.3",
				OperatingSystem:         runtime.GOOS,
				Architecture:            runtime.GOARCH,
				ContainerRuntimeVersion: "fake://1.0",
			},
		},
	}
}

func conditions(now metav1.Time) []v1.NodeCondition {
	cond := func(t v1.NodeConditionType, s v1.ConditionStatus, reason, msg string) v1.NodeCondition {
		return v1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return []v1.NodeCondition{
		cond(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		cond(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		cond(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		cond(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
	}
}
