package nodestatus

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/gpushare/devplugin/e2e/internal/devices"
)

// Syncer registers the Node and posts its status every Period (the kubelet's nodeStatusUpdateFrequency, 10 s by
// default): a change of the devices' allocatable reaches the apiserver, hence the scheduler, up to Period late.
type Syncer struct {
	Client   kubernetes.Interface
	Base     Base
	Capacity *devices.CapacityReader
	Period   time.Duration

	mu     sync.Mutex
	cached *v1.Node
}

// Cached is the kubelet's GetCachedNode: the Node as the node informer (Watch) last saw it, or as last published,
// whichever came later (built locally before the first write). Labels set on the Node by others (a nodeSelector's
// target) reach the predicate admit handler through the informer.
func (s *Syncer) Cached(_ context.Context, _ bool) (*v1.Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cached != nil {
		return s.cached.DeepCopy(), nil
	}
	return Build(s.Base, nil, nil, nil, metav1.Now()), nil
}

// Register creates the Node (or takes the existing one, as a restarted kubelet does) and posts its first status.
func (s *Syncer) Register(ctx context.Context) error {
	node := Build(s.Base, nil, nil, nil, metav1.Now())
	_, err := s.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", s.Base.Name, err)
	}
	return s.Update(ctx)
}

// Update posts the node's status now, then removes the not-ready taint if the node carries it.
func (s *Syncer) Update(ctx context.Context) error {
	capacity, allocatable := s.Capacity.Read()
	removed := s.Capacity.TakeRemoved()
	want := Build(s.Base, capacity, allocatable, removed, metav1.Now())
	var written *v1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := s.Client.CoreV1().Nodes().Get(ctx, s.Base.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = want.Status
		written, err = s.Client.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s status: %w", s.Base.Name, err)
	}
	s.mu.Lock()
	s.cached = written
	s.mu.Unlock()
	return nil
}

// Watch keeps the cached Node as the apiserver has it (the kubelet's node informer), until ctx ends.
func (s *Syncer) Watch(ctx context.Context) {
	lw := cache.NewListWatchFromClient(s.Client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll,
		fields.OneTermEqualSelector("metadata.name", s.Base.Name))
	set := func(obj any) {
		if n, ok := obj.(*v1.Node); ok {
			s.mu.Lock()
			s.cached = n.DeepCopy()
			s.mu.Unlock()
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &v1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    set,
			UpdateFunc: func(_, obj any) { set(obj) },
		},
	})
	informer.RunWithContext(ctx)
}

// Run posts the status every Period until ctx ends.
func (s *Syncer) Run(ctx context.Context) {
	t := time.NewTicker(s.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Update(ctx); err != nil && ctx.Err() == nil {
				klog.ErrorS(err, "node status update failed", "node", s.Base.Name)
			}
		}
	}
}
