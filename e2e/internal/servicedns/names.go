// Package servicedns resolves the cluster's Services for pods through their hosts files, as the cluster DNS would
// answer: `<service>.<namespace>.svc.cluster.local` (and the shorter search forms) to a ClusterIP Service's
// address, or to each ready endpoint of a headless one (with `<hostname>.<service>...` for endpoints that carry a
// host name). A pod's own namespace's Services also answer to their bare name. The node agent writes these lines
// into every pod's hosts file and keeps them current.
package servicedns

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Names follows the Services and EndpointSlices of the cluster.
type Names struct {
	services cache.Indexer
	slices   cache.Indexer
	gen      atomic.Uint64
	mu       sync.Mutex
}

// Start follows the cluster's Services and EndpointSlices until ctx ends.
func Start(ctx context.Context, client kubernetes.Interface) (*Names, error) {
	n := &Names{}
	f := informers.NewSharedInformerFactory(client, 0)
	svc := f.Core().V1().Services().Informer()
	eps := f.Discovery().V1().EndpointSlices().Informer()
	bump := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.gen.Add(1) },
		UpdateFunc: func(any, any) { n.gen.Add(1) },
		DeleteFunc: func(any) { n.gen.Add(1) },
	}
	for _, inf := range []cache.SharedIndexInformer{svc, eps} {
		if _, err := inf.AddEventHandler(bump); err != nil {
			return nil, err
		}
	}
	n.services, n.slices = svc.GetIndexer(), eps.GetIndexer()
	f.Start(ctx.Done())
	return n, nil
}

// Generation changes whenever a Service or an EndpointSlice does.
func (n *Names) Generation() uint64 {
	if n == nil {
		return 0
	}
	return n.gen.Load()
}

// HostsLines are the hosts-file lines for a pod of namespace ns: one per address, in a stable order.
func (n *Names) HostsLines(ns string) string {
	if n == nil {
		return ""
	}
	byIP := map[string][]string{}
	add := func(ip string, names ...string) {
		byIP[ip] = append(byIP[ip], names...)
	}
	for _, obj := range n.services.List() {
		s := obj.(*v1.Service)
		names := []string{fmt.Sprintf("%s.%s.svc.cluster.local", s.Name, s.Namespace),
			fmt.Sprintf("%s.%s.svc", s.Name, s.Namespace), fmt.Sprintf("%s.%s", s.Name, s.Namespace)}
		if s.Namespace == ns {
			names = append(names, s.Name)
		}
		switch {
		case s.Spec.Type == v1.ServiceTypeExternalName:
		case s.Spec.ClusterIP != "" && s.Spec.ClusterIP != v1.ClusterIPNone:
			add(s.Spec.ClusterIP, names...)
		default: // headless: each ready endpoint
			for _, obj := range n.slices.List() {
				es := obj.(*discoveryv1.EndpointSlice)
				if es.Namespace != s.Namespace || es.Labels[discoveryv1.LabelServiceName] != s.Name {
					continue
				}
				for _, e := range es.Endpoints {
					if e.Conditions.Ready != nil && !*e.Conditions.Ready && !s.Spec.PublishNotReadyAddresses {
						continue
					}
					for _, a := range e.Addresses {
						add(a, names...)
						if e.Hostname != nil && *e.Hostname != "" {
							add(a, fmt.Sprintf("%s.%s.%s.svc.cluster.local", *e.Hostname, s.Name, s.Namespace))
						}
					}
				}
			}
		}
	}
	ips := make([]string, 0, len(byIP))
	for ip := range byIP {
		ips = append(ips, ip)
	}
	sort.Strings(ips)
	var b strings.Builder
	for _, ip := range ips {
		fmt.Fprintf(&b, "%s\t%s\n", ip, strings.Join(byIP[ip], " "))
	}
	return b.String()
}
