package apisync

import (
	"context"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/gpushare/devplugin/e2e/internal/admission"
	"github.com/gpushare/devplugin/e2e/internal/pods"
)

// Sync admits and finishes the node's pods from the apiserver.
type Sync struct {
	Client  kubernetes.Interface
	Node    string
	Admit   *admission.Admitter
	Table   *pods.Table
	Sources *pods.SourcesReady

	events chan event
}

type event struct {
	pod     *v1.Pod
	deleted bool
}

// Run lists the node's pods (Running ones were admitted before a restart and stay active; Pending ones are
// admitted, oldest first, as one batch of HandlePodAdditions), marks the sources ready, then follows the watch
// until ctx ends, handling one event at a time in the order the watch delivers them.
func (s *Sync) Run(ctx context.Context) error {
	selector := fields.OneTermEqualSelector("spec.nodeName", s.Node).String()
	list, err := s.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return fmt.Errorf("list the pods of node %s: %w", s.Node, err)
	}
	var pending []*v1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		switch {
		case p.Status.Phase == v1.PodRunning:
			s.Admit.Adopt(p)
		case p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded:
			s.Table.Add(p)
			s.Table.SetPhase(p.UID, p.Status.Phase)
		default:
			pending = append(pending, p)
		}
	}
	s.Sources.MarkReady()
	sort.SliceStable(pending, func(i, j int) bool {
		return pending[i].CreationTimestamp.Before(&pending[j].CreationTimestamp)
	})
	for _, p := range pending {
		s.handle(ctx, event{pod: p})
	}

	s.events = make(chan event, 4096)
	lw := cache.NewListWatchFromClient(s.Client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.OneTermEqualSelector("spec.nodeName", s.Node))
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &v1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.push(ctx, obj, false) },
			UpdateFunc: func(_, obj any) { s.push(ctx, obj, false) },
			DeleteFunc: func(obj any) { s.push(ctx, obj, true) },
		},
	})
	go informer.RunWithContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-s.events:
			s.handle(ctx, ev)
		}
	}
}

func (s *Sync) push(ctx context.Context, obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	select {
	case s.events <- event{pod: pod, deleted: deleted}:
	case <-ctx.Done():
	}
}

// handle is one step of the sync loop for one pod.
func (s *Sync) handle(ctx context.Context, ev event) {
	pod := ev.pod
	known := s.Table.Known(pod.UID)
	switch {
	case ev.deleted:
		if known {
			s.end(pod)
			s.Table.Remove(pod.UID)
		}
	case pod.DeletionTimestamp != nil:
		if known {
			s.end(pod)
		}
		s.finishDeletion(ctx, pod)
	case !known:
		if pod.Status.Phase == v1.PodFailed || pod.Status.Phase == v1.PodSucceeded {
			s.Table.Add(pod)
			s.Table.SetPhase(pod.UID, pod.Status.Phase)
			return
		}
		res := s.Admit.Admit(pod)
		switch {
		case res.Admitted && res.Started:
			s.writeStatus(ctx, pod, RunningStatus(pod, metav1.Now()))
		case res.Admitted:
			s.writeStatus(ctx, pod, NotStartedStatus(pod, res.Reason, res.Message))
		default:
			s.writeStatus(ctx, pod, RejectedStatus(pod, res.Reason, res.Message))
		}
	default:
		s.Table.Add(pod) // the pod manager's UpdatePod: keep the latest object
	}
}

func (s *Sync) end(pod *v1.Pod) {
	if ph := s.Table.Phase(pod.UID); ph == v1.PodSucceeded {
		return // already ended
	}
	s.Admit.End(pod)
}

// finishDeletion deletes the pod with grace 0 and a UID precondition, as the kubelet's status manager does once
// the pod's containers are gone.
func (s *Sync) finishDeletion(ctx context.Context, pod *v1.Pod) {
	zero := int64(0)
	uid := pod.UID
	err := s.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		klog.ErrorS(err, "finishing the pod's deletion", "pod", klog.KObj(pod), "podUID", pod.UID)
	}
}

// writeStatus writes the pod's status, retrying on conflicts with the latest object.
func (s *Sync) writeStatus(ctx context.Context, pod *v1.Pod, status v1.PodStatus) {
	cur := pod.DeepCopy()
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			fresh, err := s.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if fresh.UID != pod.UID {
				return apierrors.NewNotFound(v1.Resource("pods"), pod.Name)
			}
			cur = fresh
		}
		first = false
		// Keep what others wrote into the status (the scheduler's PodScheduled condition and such).
		status.NominatedNodeName = cur.Status.NominatedNodeName
		cur.Status = status
		_, err := s.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		klog.ErrorS(err, "writing the pod's status", "pod", klog.KObj(pod), "podUID", pod.UID, "phase", status.Phase)
	}
}
