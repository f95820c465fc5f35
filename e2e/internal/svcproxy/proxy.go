// Package svcproxy is the test cluster's Service proxy, in the manner of kube-proxy's userspace mode: for every
// port of every Service with a ClusterIP it listens on ClusterIP:port inside the pod network's bridge namespace
// (the whole service range is local there) and forwards each TCP connection to a ready endpoint of the Service
// (its EndpointSlices, kept by kube-controller-manager's endpointslice controller). The `kubernetes` Service of the
// default namespace leads to the apiserver on the node's loopback, so that pods reach the API at
// KUBERNETES_SERVICE_HOST as they do on a real cluster.
package svcproxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Proxy forwards the Services' ClusterIPs.
type Proxy struct {
	Client    kubernetes.Interface
	NetNSPath string // /run/netns/<bridge namespace>: where the listeners are opened
	APIServer string // host:port of the apiserver, for default/kubernetes
	Ready     func() // called once the caches are synced and the first listeners opened (may be nil)
	// Exposed are Services served on the node's loopback too ("namespace/name:port" -> "127.0.0.1:PORT"), for
	// the control plane's processes on the host (the apiserver's webhooks, kube-scheduler's extender), as the
	// service network reaches a control plane's host on a real cluster.
	Exposed map[string]string

	mu        sync.Mutex
	listeners map[string]net.Listener // "ip:port" -> listener
	targets   map[string][]string     // "ip:port" -> endpoint addresses
	exposedAt map[string]string       // "host:ip:port" -> the loopback address it is also served at
	services  cache.Indexer
	slices    cache.Indexer
}

// Run keeps the listeners in step with the Services and their endpoints until ctx ends.
func (p *Proxy) Run(ctx context.Context) error {
	p.listeners, p.targets, p.exposedAt = map[string]net.Listener{}, map[string][]string{}, map[string]string{}
	f := informers.NewSharedInformerFactory(p.Client, 0)
	svc := f.Core().V1().Services().Informer()
	eps := f.Discovery().V1().EndpointSlices().Informer()
	p.services, p.slices = svc.GetIndexer(), eps.GetIndexer()
	kick := make(chan struct{}, 1)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(kick) },
		UpdateFunc: func(any, any) { poke(kick) },
		DeleteFunc: func(any) { poke(kick) },
	}
	if _, err := svc.AddEventHandler(h); err != nil {
		return err
	}
	if _, err := eps.AddEventHandler(h); err != nil {
		return err
	}
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	p.sync()
	if p.Ready != nil {
		p.Ready()
	}
	for {
		select {
		case <-ctx.Done():
			p.closeAll()
			return nil
		case <-kick:
			p.sync()
		}
	}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// sync computes every ClusterIP:port's endpoints and opens or closes listeners to match.
func (p *Proxy) sync() {
	want := map[string][]string{}
	for _, obj := range p.services.List() {
		s := obj.(*v1.Service)
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == v1.ClusterIPNone {
			continue
		}
		for _, port := range s.Spec.Ports {
			if port.Protocol != "" && port.Protocol != v1.ProtocolTCP {
				continue
			}
			key := net.JoinHostPort(s.Spec.ClusterIP, strconv.Itoa(int(port.Port)))
			if s.Namespace == "default" && s.Name == "kubernetes" {
				want[key] = []string{p.APIServer}
				continue
			}
			want[key] = p.endpoints(s, port)
			if host, ok := p.Exposed[fmt.Sprintf("%s/%s:%d", s.Namespace, s.Name, port.Port)]; ok {
				p.exposedAt["host:"+key] = host
				want["host:"+key] = want[key]
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.targets = want
	for key, l := range p.listeners {
		if _, ok := want[key]; !ok {
			l.Close()
			delete(p.listeners, key)
		}
	}
	for key := range want {
		if _, ok := p.listeners[key]; ok {
			continue
		}
		if host, ok := p.exposedAt[key]; ok {
			l, err := net.Listen("tcp", host)
			if err != nil {
				klog.ErrorS(err, "listen on the node's loopback for a Service", "address", host, "service", key)
				continue
			}
			p.listeners[key] = l
			go p.serve(strings.TrimPrefix(key, "host:"), l)
			klog.V(2).InfoS("serving a Service on the node's loopback", "address", host, "endpoints", want[key])
			continue
		}
		l, err := p.listen(key)
		if err != nil {
			klog.ErrorS(err, "listen for a Service", "address", key)
			continue
		}
		p.listeners[key] = l
		go p.serve(key, l)
		klog.V(2).InfoS("serving a Service address", "address", key, "endpoints", want[key])
	}
}

// endpoints are the ready addresses of the Service's slices with the port's target port.
func (p *Proxy) endpoints(s *v1.Service, port v1.ServicePort) []string {
	var out []string
	for _, obj := range p.slices.List() {
		es := obj.(*discoveryv1.EndpointSlice)
		if es.Namespace != s.Namespace || es.Labels[discoveryv1.LabelServiceName] != s.Name {
			continue
		}
		var target int32
		for _, ep := range es.Ports {
			if ep.Port != nil && (ep.Name == nil && port.Name == "" || ep.Name != nil && *ep.Name == port.Name) {
				target = *ep.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(target))))
			}
		}
	}
	return out
}

// inBridge runs fn on a thread of its own inside the bridge's network namespace; the thread is thrown away
// afterwards. Sockets fn creates stay in that namespace (listeners there, connections to pods).
func (p *Proxy) inBridge(fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine, not back in the pool
		fd, err := unix.Open(p.NetNSPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open %s: %w", p.NetNSPath, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter %s: %w", p.NetNSPath, err)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}

func (p *Proxy) listen(addr string) (net.Listener, error) {
	var l net.Listener
	var lerr error
	if err := p.inBridge(func() { l, lerr = net.Listen("tcp", addr) }); err != nil {
		return nil, err
	}
	return l, lerr
}

// dial connects to a pod's address (from inside the bridge's namespace), or to the apiserver (from the node's).
func (p *Proxy) dial(addr string) (net.Conn, error) {
	if addr == p.APIServer {
		return net.DialTimeout("tcp", addr, 3*time.Second)
	}
	var c net.Conn
	var derr error
	if err := p.inBridge(func() { c, derr = net.DialTimeout("tcp", addr, 3*time.Second) }); err != nil {
		return nil, err
	}
	return c, derr
}

func (p *Proxy) serve(key string, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go p.forward(key, c)
	}
}

func (p *Proxy) forward(key string, c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	targets := p.targets[key]
	p.mu.Unlock()
	if len(targets) == 0 {
		klog.V(2).InfoS("no ready endpoint: connection refused", "service", key)
		return
	}
	for _, i := range rand.Perm(len(targets)) {
		up, err := p.dial(targets[i])
		if err != nil {
			klog.V(2).InfoS("endpoint unreachable", "service", key, "endpoint", targets[i], "err", err)
			continue
		}
		defer up.Close()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
		<-done
		<-done
		return
	}
}

func closeWrite(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.CloseWrite()
	}
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, l := range p.listeners {
		l.Close()
		delete(p.listeners, k)
	}
}
