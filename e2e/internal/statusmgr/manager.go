// Package statusmgr writes the node's pod statuses to the apiserver as the kubelet's status manager does: the
// latest status of each pod, written until it lands (a conflict is retried at once with the pod read again; any
// other failure, an apiserver outage included, after a back-off of 0.2 s growing to 5 s), merged with what others
// own in the status (the scheduler's PodScheduled condition, nominatedNodeName, the resource claim statuses).
package statusmgr

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// kubeletConditions are the pod conditions the kubelet owns; every other condition is kept as the pod has it.
var kubeletConditions = map[v1.PodConditionType]bool{
	v1.PodReadyToStartContainers: true, v1.PodInitialized: true, v1.PodReady: true, v1.ContainersReady: true,
}

type entry struct {
	pod     *v1.Pod
	status  v1.PodStatus
	version uint64
	next    time.Time
	backoff time.Duration
}

// Manager holds the statuses still to write.
type Manager struct {
	client  kubernetes.Interface
	mu      sync.Mutex
	pending map[types.UID]*entry
	busy    map[types.UID]bool
	seq     uint64
	kick    chan struct{}
}

// New returns a manager; Run writes.
func New(client kubernetes.Interface) *Manager {
	return &Manager{client: client, pending: map[types.UID]*entry{}, busy: map[types.UID]bool{}, kick: make(chan struct{}, 1)}
}

// Set records the pod's newest status; it replaces one not yet written.
func (m *Manager) Set(pod *v1.Pod, st v1.PodStatus) {
	m.mu.Lock()
	m.seq++
	m.pending[pod.UID] = &entry{pod: pod, status: *st.DeepCopy(), version: m.seq}
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Forget drops the pod's unwritten status (the pod is gone from the apiserver).
func (m *Manager) Forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, uid)
}

// Pending is how many statuses wait to be written.
func (m *Manager) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}

// Run writes statuses with `workers` writers until ctx ends.
func (m *Manager) Run(ctx context.Context, workers int) {
	for i := 0; i < workers; i++ {
		go m.writer(ctx)
	}
}

func (m *Manager) take() (types.UID, *entry, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	wait := time.Second
	for uid, e := range m.pending {
		if m.busy[uid] {
			continue
		}
		if d := e.next.Sub(now); d > 0 {
			if d < wait {
				wait = d
			}
			continue
		}
		m.busy[uid] = true
		return uid, e, 0
	}
	return "", nil, wait
}

func (m *Manager) writer(ctx context.Context) {
	for {
		uid, e, wait := m.take()
		if e == nil {
			select {
			case <-ctx.Done():
				return
			case <-m.kick:
			case <-time.After(wait):
			}
			continue
		}
		err := m.write(ctx, e)
		m.mu.Lock()
		delete(m.busy, uid)
		cur := m.pending[uid]
		switch {
		case cur != e: // a newer status came meanwhile (or the pod was forgotten): write that one
		case err == nil || apierrors.IsNotFound(err) || errGone(err):
			delete(m.pending, uid)
		default:
			if e.backoff == 0 {
				e.backoff = 200 * time.Millisecond
			} else if e.backoff *= 2; e.backoff > 5*time.Second {
				e.backoff = 5 * time.Second
			}
			e.next = time.Now().Add(e.backoff)
			klog.InfoS("pod status not written yet, retrying", "pod", klog.KObj(e.pod), "podUID", e.pod.UID,
				"phase", e.status.Phase, "retryIn", e.backoff, "err", err)
		}
		m.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

type goneError struct{}

func (goneError) Error() string { return "the pod was deleted and created again under another UID" }

func errGone(err error) bool { _, ok := err.(goneError); return ok }

// write reads the pod, merges the status and writes it, retrying conflicts at once.
func (m *Manager) write(ctx context.Context, e *entry) error {
	for i := 0; ; i++ {
		cur, err := m.client.CoreV1().Pods(e.pod.Namespace).Get(ctx, e.pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != e.pod.UID {
			return goneError{}
		}
		if terminal(cur.Status.Phase) && !terminal(e.status.Phase) {
			return nil // a pod that ended never runs again
		}
		cur.Status = Merge(cur.Status, e.status)
		_, err = m.client.CoreV1().Pods(e.pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || i > 20 {
			return err
		}
	}
}

func terminal(p v1.PodPhase) bool { return p == v1.PodSucceeded || p == v1.PodFailed }

// Merge is the kubelet's status with what others own kept from the current one.
func Merge(cur, kubelet v1.PodStatus) v1.PodStatus {
	out := *kubelet.DeepCopy()
	out.NominatedNodeName = cur.NominatedNodeName
	out.ResourceClaimStatuses = cur.ResourceClaimStatuses
	out.ExtendedResourceClaimStatus = cur.ExtendedResourceClaimStatus
	have := map[v1.PodConditionType]bool{}
	for _, c := range out.Conditions {
		have[c.Type] = true
	}
	for _, c := range cur.Conditions {
		if !kubeletConditions[c.Type] && !have[c.Type] {
			out.Conditions = append(out.Conditions, c)
		}
	}
	return out
}
