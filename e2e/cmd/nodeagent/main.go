// Command nodeagent plays one node's kubelet with the kubelet's own code (Kubernetes 1.36.3): the device manager
// serving <root>/device-plugins/kubelet.sock (checkpoint in the same directory), admission as HandlePodAdditions
// does it (the pod manager first, then the topology manager's and the predicate admit handlers), and the
// PodResources v1 server on <root>/pod-resources/kubelet.sock.
//
// With --kubeconfig it also runs the kubelet's DRA manager (checkpoint <root>/dra_manager_state) and plugin
// manager (watching --plugins-registry-dir): a pod's ResourceClaims are prepared through their driver before its
// containers are created, each container's CDI devices resolved from the specs in --cdi-dir, and the claims
// unprepared when the pod ends (e2e/internal/dra).
//
// With --kubeconfig it registers its Node (capacity = --cpu, --memory, --pods plus the devices), posts its status
// every --status-period, and admits the pods bound to it. With --standalone it has no apiserver: pods are
// admitted and ended through the control API. Either way it prints exactly one line
//
//	nodeagent: control listening on http://127.0.0.1:PORT
//
// once the device manager and the PodResources server are serving. See e2e/internal/control for the API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"github.com/gpushare/devplugin/e2e/internal/admission"
	"github.com/gpushare/devplugin/e2e/internal/apisync"
	"github.com/gpushare/devplugin/e2e/internal/control"
	"github.com/gpushare/devplugin/e2e/internal/devices"
	"github.com/gpushare/devplugin/e2e/internal/dra"
	"github.com/gpushare/devplugin/e2e/internal/nodestatus"
	"github.com/gpushare/devplugin/e2e/internal/oci"
	"github.com/gpushare/devplugin/e2e/internal/podresources"
	"github.com/gpushare/devplugin/e2e/internal/pods"
	"github.com/gpushare/devplugin/e2e/internal/podworker"
	"github.com/gpushare/devplugin/e2e/internal/standalone"
	"github.com/gpushare/devplugin/e2e/internal/statusmgr"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "cleanup":
			os.Exit(cleanupMain(os.Args[2:]))
		}
	}
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "nodeagent: %v\n", err)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, opts, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "nodeagent: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, stdout io.Writer) error {
	root, err := filepath.Abs(o.root)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, "device-plugins"), 0o750); err != nil {
		return fmt.Errorf("--root %s: %w", root, err)
	}
	table := pods.NewTable()
	sources := &pods.SourcesReady{}
	tm, err := admission.NewTopologyManager()
	if err != nil {
		return err
	}
	dm, err := devices.New(root, tm)
	if err != nil {
		return err
	}
	tm.AddHintProvider(klog.Background(), dm)
	if err := devices.Start(dm, table.GetActivePods, sources); err != nil {
		return fmt.Errorf("start the device manager: %w", err)
	}
	defer func() { _ = dm.Stop(klog.Background()) }()
	capacity := devices.NewCapacityReader(dm)

	prServer, err := podresources.Serve(ctx, root, dm, table)
	if err != nil {
		return err
	}
	defer prServer.Stop()

	base := nodestatus.Base{Name: o.nodeName, CPU: o.cpu, Memory: o.memory, Pods: o.pods}
	api := control.API{Books: func() devices.Books { return books(dm, capacity, table) }}
	var background func(context.Context) error

	if o.standalone {
		getNode := func(context.Context, bool) (*v1.Node, error) {
			c, a := capacity.Read()
			return nodestatus.Build(base, c, a, nil, metav1.Now()), nil
		}
		adm := admission.New(root, dm, tm, table, sources, getNode)
		src, err := standalone.New(root, adm, table)
		if err != nil {
			return err
		}
		if err := src.Restore(sources); err != nil {
			return fmt.Errorf("restore the pods admitted before: %w", err)
		}
		api.Admit = src.Admit
		api.End = src.End
	} else {
		client, err := kubeClient(o.kubeconfig)
		if err != nil {
			return err
		}
		syncer := &nodestatus.Syncer{Client: client, Base: base, Capacity: capacity, Period: o.statusPeriod}
		draNode, err := dra.New(client, root, o.pluginsRegistryDir, o.cdiDirs)
		if err != nil {
			return err
		}
		getNode := func(ctx context.Context) (*v1.Node, error) { return syncer.Cached(ctx, true) }
		if err := draNode.Start(ctx, table.GetActivePods, getNode, sources, dm.GetWatcherHandler()); err != nil {
			return err
		}
		api.Claims, api.Registered = draNode.Claims, draNode.Registered
		adm := admission.New(root, dm, tm, table, sources, syncer.Cached).WithDRA(draNode)
		status := statusmgr.New(client)
		status.Run(ctx, 4)
		var rt *podworker.Runtime
		if o.runtime == "runc" {
			rt, err = newRuntime(ctx, o, root, client, dm, table, adm, status)
			if err != nil {
				return err
			}
			api.Exec = func(ns, name, container string, cmd []string, stdin []byte, timeout time.Duration) (oci.ExecResult, error) {
				pod, ok := findPod(table, ns, name)
				if !ok {
					return oci.ExecResult{}, control.ErrNotFound
				}
				return rt.Exec(ctx, pod.UID, container, cmd, stdin, timeout)
			}
			api.Logs = func(ns, name, container string, previous bool) ([]byte, error) {
				pod, ok := findPod(table, ns, name)
				if !ok {
					return nil, control.ErrNotFound
				}
				return rt.Logs(pod.UID, container, previous)
			}
		}
		api.End = func(uid types.UID) error {
			pod, ok := table.Get(uid)
			if !ok {
				return control.ErrNotFound
			}
			adm.End(pod)
			return nil
		}
		background = func(ctx context.Context) error {
			// Like the kubelet, keep trying while the apiserver cannot be reached.
			if err := untilDone(ctx, "register the node", syncer.Register); err != nil {
				return nil
			}
			go syncer.Run(ctx)
			go syncer.Watch(ctx)
			s := &apisync.Sync{Client: client, Node: o.nodeName, Admit: adm, Table: table, Sources: sources, Runtime: rt, Status: status}
			_ = untilDone(ctx, "follow the node's pods", s.Run)
			return nil
		}
	}

	l, err := net.Listen("tcp", o.controlAddr)
	if err != nil {
		return fmt.Errorf("--control-addr %s: %w", o.controlAddr, err)
	}
	srv := &http.Server{Handler: control.Handler(api), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer func() { _ = srv.Close() }()
	fmt.Fprintf(stdout, "nodeagent: control listening on http://%s\n", l.Addr())
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}

	errc := make(chan error, 1)
	if background != nil {
		go func() { errc <- background(ctx) }()
	}
	select {
	case <-ctx.Done():
		klog.InfoS("stopping", "node", o.nodeName)
		return nil
	case err := <-errc:
		return err
	}
}

func books(dm *devicemanager.ManagerImpl, c *devices.CapacityReader, table *pods.Table) devices.Books {
	var views []devices.PodView
	for _, p := range table.GetPods() {
		uid := p.UID
		views = append(views, devices.PodView{
			Pod:   p,
			Phase: table.Phase(uid),
			Envs:  func(container string) map[string]string { return table.Envs(uid, container) },
			CDI:   func(container string) any { return table.CDI(uid, container) },
		})
	}
	return devices.Collect(dm, c, views)
}

// untilDone calls f until it succeeds or ctx ends, a second apart, logging each failure.
func untilDone(ctx context.Context, what string, f func(context.Context) error) error {
	for {
		err := f(ctx)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		klog.ErrorS(err, "retrying in 1s", "step", what)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func kubeClient(path string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	cfg.QPS = 200
	cfg.Burst = 400
	return kubernetes.NewForConfig(cfg)
}
