package apisync

import (
	"context"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpushare/devplugin/e2e/internal/admission"
	"github.com/gpushare/devplugin/e2e/internal/pods"
	"github.com/gpushare/devplugin/e2e/internal/podworker"
	"github.com/gpushare/devplugin/e2e/internal/statusmgr"
)

// Sync admits and finishes the node's pods from the apiserver.
type Sync struct {
	Client  kubernetes.Interface
	Node    string
	Admit   *admission.Admitter
	Table   *pods.Table
	Sources *pods.SourcesReady
	// Runtime runs the admitted pods' containers (nil: none run, an admitted pod is written Running at once).
	Runtime *podworker.Runtime
	// Status writes the pods' statuses until they land.
	Status *statusmgr.Manager

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
			if s.Runtime != nil {
				s.Runtime.Run(p)
			}
		case p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded:
			s.Table.Add(p)
			s.Table.SetPhase(p.UID, p.Status.Phase)
		default:
			pending = append(pending, p)
		}
	}
	s.Sources.MarkReady()
	if s.Runtime != nil {
		known := map[string]bool{}
		for i := range list.Items {
			known[string(list.Items[i].UID)] = true
		}
		s.Runtime.Orphans(ctx, func(uid string) bool { return known[uid] })
	}
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
		if !known {
			return
		}
		if s.Runtime == nil {
			s.end(pod)
			s.Table.Remove(pod.UID)
			return
		}
		// force-deleted: the kubelet still stops the containers, with a short grace period
		klog.V(2).InfoS("pod deleted: stopping its containers", "pod", klog.KObj(pod), "podUID", pod.UID)
		s.Runtime.Terminate(pod, 2*time.Second, func() {
			s.end(pod)
			s.Table.Remove(pod.UID)
			s.Status.Forget(pod.UID)
			klog.V(2).InfoS("pod deleted: its containers are gone", "pod", klog.KObj(pod), "podUID", pod.UID)
		})
	case pod.DeletionTimestamp != nil:
		if !known || s.Runtime == nil {
			if known {
				s.end(pod)
			}
			s.finishDeletion(ctx, pod)
			return
		}
		s.Table.Add(pod)
		grace := 30 * time.Second
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		s.Runtime.Update(pod)
		klog.V(2).InfoS("pod deleting: stopping its containers", "pod", klog.KObj(pod), "podUID", pod.UID, "grace", grace)
		s.Runtime.Terminate(pod, grace, func() {
			s.end(pod)
			s.finishDeletion(ctx, pod)
			klog.V(2).InfoS("pod deleting: its containers are gone", "pod", klog.KObj(pod), "podUID", pod.UID)
		})
	case !known:
		if pod.Status.Phase == v1.PodFailed || pod.Status.Phase == v1.PodSucceeded {
			s.Table.Add(pod)
			s.Table.SetPhase(pod.UID, pod.Status.Phase)
			return
		}
		res := s.Admit.Admit(pod)
		switch {
		case res.Admitted && res.Started && s.Runtime != nil:
			s.Runtime.Run(pod)
		case res.Admitted && res.Started:
			s.writeStatus(pod, RunningStatus(pod, metav1.Now()))
		case res.Admitted:
			s.writeStatus(pod, NotStartedStatus(pod, res.Reason, res.Message))
		default:
			s.writeStatus(pod, RejectedStatus(pod, res.Reason, res.Message))
		}
	default:
		s.Table.Add(pod) // the pod manager's UpdatePod: keep the latest object
		if s.Runtime != nil {
			s.Runtime.Update(pod)
		}
	}
}

func (s *Sync) end(pod *v1.Pod) {
	if s.Table.Ended(pod.UID) {
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

// writeStatus hands the status to the status manager, which writes it until it lands.
func (s *Sync) writeStatus(pod *v1.Pod, status v1.PodStatus) {
	s.Status.Set(pod, status)
}
