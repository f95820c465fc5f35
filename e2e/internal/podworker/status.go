package podworker

import (
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1qos "k8s.io/kubernetes/pkg/apis/core/v1/helper/qos"
)

// containerStatus is the kubelet's status of one container.
func (w *worker) containerStatus(c *ctr) v1.ContainerStatus {
	image := c.image
	if image == "" {
		image = c.spec.Image
	}
	cs := v1.ContainerStatus{Name: c.spec.Name, Image: image, ImageID: c.imageID, RestartCount: c.restarts}
	f := false
	cs.Started = &f
	if c.last != nil {
		cs.LastTerminationState = v1.ContainerState{Terminated: c.last}
	}
	switch {
	case c.wait != nil:
		cs.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: c.wait.Reason, Message: c.wait.Message}}
		if c.cur != nil && c.cur.ended() && c.last == nil {
			cs.LastTerminationState = v1.ContainerState{Terminated: c.cur.terminated(w.terminationMessage(c, c.cur))}
		}
	case c.cur.running():
		t := true
		cs.Started, cs.Ready = &t, true
		cs.ContainerID = "runc://" + c.cur.ID
		cs.State = v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(c.cur.Status.StartedAt)}}
	case c.cur != nil && c.cur.ended():
		cs.ContainerID = "runc://" + c.cur.ID
		cs.State = v1.ContainerState{Terminated: c.cur.terminated(w.terminationMessage(c, c.cur))}
	default:
		reason := reasonCreating
		msg := ""
		if !c.init && !w.initsDone() {
			reason = reasonPodInit
		}
		if w.sandboxErr != nil {
			reason, msg = reasonCreating, w.sandboxErr.Error()
		}
		cs.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
	if w.terminal != "" && cs.State.Running != nil {
		cs.Ready = false
	}
	return cs
}

func (w *worker) initsDone() bool {
	for _, c := range w.ctrs {
		if c.init && !c.sidecar && !c.done {
			return false
		}
		if c.sidecar && !c.cur.running() && (c.cur == nil || !c.cur.ended()) {
			return false
		}
	}
	return true
}

// phase is the kubelet's getPhase over the app containers' statuses.
func (w *worker) phase() v1.PodPhase {
	if w.terminal != "" {
		return w.terminal
	}
	if w.failedInit {
		return v1.PodFailed
	}
	if !w.initsDone() {
		return v1.PodPending
	}
	var running, waiting, stopped, succeeded int
	for _, c := range w.ctrs {
		if c.init {
			continue
		}
		cs := w.containerStatus(c)
		switch {
		case cs.State.Running != nil:
			running++
		case cs.State.Terminated != nil:
			stopped++
			if cs.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case cs.State.Waiting != nil:
			if cs.LastTerminationState.Terminated != nil {
				stopped++
			} else {
				waiting++
			}
		}
	}
	switch {
	case waiting > 0:
		return v1.PodPending
	case running > 0:
		return v1.PodRunning
	case stopped > 0:
		if w.pod.Spec.RestartPolicy == v1.RestartPolicyAlways {
			return v1.PodRunning
		}
		if stopped == succeeded {
			// every app container ended well; with restartPolicy OnFailure none of them will restart
			if w.allDone() {
				return v1.PodSucceeded
			}
			return v1.PodRunning
		}
		if w.pod.Spec.RestartPolicy == v1.RestartPolicyNever {
			return v1.PodFailed
		}
		return v1.PodRunning
	}
	return v1.PodPending
}

func (w *worker) allDone() bool {
	for _, c := range w.ctrs {
		if !c.init && !(c.cur != nil && c.cur.ended()) {
			return false
		}
	}
	return true
}

// status is the pod's status as the kubelet's generateAPIPodStatus writes it.
func (w *worker) status() v1.PodStatus {
	pod := w.pod
	phase := w.phase()
	st := v1.PodStatus{Phase: phase, QOSClass: v1qos.GetPodQOS(pod), HostIP: w.rt.cfg.HostIP,
		HostIPs: []v1.HostIP{{IP: w.rt.cfg.HostIP}}, StartTime: &metav1.Time{Time: w.startTime}}
	if w.sandbox.IP != "" && (w.sandboxReady || w.terminal != "") {
		st.PodIP = w.sandbox.IP
		st.PodIPs = []v1.PodIP{{IP: w.sandbox.IP}}
	}
	var notReady, notInit []string
	for _, c := range w.ctrs {
		cs := w.containerStatus(c)
		if c.init {
			st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
			if !c.sidecar && !c.done {
				notInit = append(notInit, c.spec.Name)
			}
			if c.sidecar && !cs.Ready {
				notReady = append(notReady, c.spec.Name)
			}
			continue
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !cs.Ready {
			notReady = append(notReady, c.spec.Name)
		}
	}
	cond := func(t v1.PodConditionType, ok bool, reason, msg string) v1.PodCondition {
		s := v1.ConditionFalse
		if ok {
			s = v1.ConditionTrue
			reason, msg = "", ""
		}
		return v1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: w.transition(t, s)}
	}
	terminalReason := ""
	if phase == v1.PodSucceeded || phase == v1.PodFailed {
		terminalReason = "PodCompleted"
	}
	initialized := len(notInit) == 0
	initReason, initMsg := "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: %v", notInit)
	if terminalReason != "" && !initialized {
		initReason = terminalReason
	}
	readyReason, readyMsg := "ContainersNotReady", fmt.Sprintf("containers with unready status: %v", notReady)
	if terminalReason != "" {
		readyReason = terminalReason
		notReady = append(notReady, "") // a finished pod is not ready
	}
	ready := len(notReady) == 0
	st.Conditions = []v1.PodCondition{
		cond(v1.PodReadyToStartContainers, w.sandboxReady, "", ""),
		cond(v1.PodInitialized, initialized, initReason, initMsg),
		cond(v1.PodReady, ready, readyReason, readyMsg),
		cond(v1.ContainersReady, ready, readyReason, readyMsg),
	}
	sort.SliceStable(st.Conditions, func(i, j int) bool { return st.Conditions[i].Type < st.Conditions[j].Type })
	return st
}

// transition is the last time condition t changed to s (kept, so that an unchanged status compares equal).
func (w *worker) transition(t v1.PodConditionType, s v1.ConditionStatus) metav1.Time {
	if w.conds == nil {
		w.conds = map[v1.PodConditionType]condState{}
	}
	c, ok := w.conds[t]
	if !ok || c.status != s {
		c = condState{status: s, at: metav1.NewTime(time.Now().Truncate(time.Second))}
		w.conds[t] = c
	}
	return c.at
}

type condState struct {
	status v1.ConditionStatus
	at     metav1.Time
}

// Describe is a one-line summary of the pod's containers for logs.
func (w *worker) describe() string {
	var parts []string
	for _, c := range w.ctrs {
		cs := w.containerStatus(c)
		switch {
		case cs.State.Running != nil:
			parts = append(parts, c.spec.Name+"=running")
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s=exited(%d)", c.spec.Name, cs.State.Terminated.ExitCode))
		case cs.State.Waiting != nil:
			parts = append(parts, c.spec.Name+"="+cs.State.Waiting.Reason)
		}
	}
	return strings.Join(parts, " ")
}
