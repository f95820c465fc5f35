// Package apisync plays the kubelet's pod side against the apiserver: it watches the pods bound to the node,
// admits new ones in the order the watch delivers them, writes their status (Running, or Failed as rejectPod
// writes it), and finishes deletions.
package apisync

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	v1qos "k8s.io/kubernetes/pkg/apis/core/v1/helper/qos"
)

// RunningStatus is the status of a pod whose containers all started: init containers completed (sidecars
// running), app containers running and ready.
func RunningStatus(pod *v1.Pod, now metav1.Time) v1.PodStatus {
	cond := func(t v1.PodConditionType) v1.PodCondition {
		return v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now}
	}
	st := v1.PodStatus{
		Phase:     v1.PodRunning,
		HostIP:    "127.0.0.1",
		HostIPs:   []v1.HostIP{{IP: "127.0.0.1"}},
		StartTime: &now,
		QOSClass:  v1qos.GetPodQOS(pod),
		Conditions: []v1.PodCondition{
			cond(v1.PodReadyToStartContainers), cond(v1.PodInitialized), cond(v1.ContainersReady),
			cond(v1.PodReady), cond(v1.PodScheduled),
		},
	}
	started := true
	for _, c := range pod.Spec.InitContainers {
		cs := containerStatus(pod, c, now)
		if !podutil.IsRestartableInitContainer(&c) {
			cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: cs.ContainerID,
			}}
			cs.Ready = false
			cs.Started = new(bool)
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
	}
	for _, c := range pod.Spec.Containers {
		cs := containerStatus(pod, c, now)
		cs.Started = &started
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	return st
}

func containerStatus(pod *v1.Pod, c v1.Container, now metav1.Time) v1.ContainerStatus {
	started := true
	return v1.ContainerStatus{
		Name:        c.Name,
		Image:       c.Image,
		ImageID:     "fake://" + c.Image,
		ContainerID: "fake://" + string(pod.UID) + "/" + c.Name,
		Ready:       true,
		Started:     &started,
		State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
	}
}

// RejectedStatus is the status the kubelet's rejectPod writes.
func RejectedStatus(pod *v1.Pod, reason, message string) v1.PodStatus {
	return v1.PodStatus{
		QOSClass: v1qos.GetPodQOS(pod),
		Phase:    v1.PodFailed,
		Reason:   reason,
		Message:  "Pod was rejected: " + message,
	}
}

// NotStartedStatus is the status of an admitted pod whose containers could not be created (its dynamic resources
// not prepared, or a CDI device the runtime cannot resolve). The kubelet keeps such a pod Pending and retries,
// with the reason in an event (FailedPrepareDynamicResources) or in the container's waiting state
// (CreateContainerError); the node agent does not retry: it fails the pod with that reason and message, so a
// test sees the outcome at once.
func NotStartedStatus(pod *v1.Pod, reason, message string) v1.PodStatus {
	return v1.PodStatus{
		QOSClass: v1qos.GetPodQOS(pod),
		Phase:    v1.PodFailed,
		Reason:   reason,
		Message:  message,
	}
}
