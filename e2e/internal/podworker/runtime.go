// Package podworker runs the node's admitted pods for real, as the kubelet's pod workers and a CRI runtime do
// together: per pod a sandbox (network namespace, volumes, hosts file), its init containers one after another to
// completion (sidecars kept running), its app containers, restarts per restartPolicy with the kubelet's back-off,
// the pod's status as the kubelet computes it, and termination with the grace period when the pod is deleted.
// Each container is a real OCI container run by runc (package oci), its image from the node's image table (package
// images), its GPUs decided by the NVIDIA container toolkit's rules (package toolkit).
package podworker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"github.com/gpushare/devplugin/e2e/internal/dra"
	"github.com/gpushare/devplugin/e2e/internal/oci"
	"github.com/gpushare/devplugin/e2e/internal/podnet"
	"github.com/gpushare/devplugin/e2e/internal/servicedns"
	"github.com/gpushare/devplugin/e2e/internal/toolkit"
)

// Config is the node's container runtime.
type Config struct {
	Root    string // the node's directory: pods/<uid>/ holds each pod's sandbox, volumes and containers
	Runc    oci.Runc
	Shim    string // the containershim binary, run for each container
	Images  string // the image table file
	Net     *podnet.Network
	Driver  *toolkit.Driver // nil: the node has no GPU driver to inject
	Toolkit toolkit.Config
	CDIDirs []string
	// Names resolves the cluster's Services in the pods' hosts files (nil: no Service names).
	Names    *servicedns.Names
	Client   kubernetes.Interface
	NodeName string
	HostIP   string
	// DeviceOptions is the device manager's GetDeviceRunContainerOptions (PreStartContainer where a plugin asks for
	// it, then the plugin's envs, mounts, devices and CDI devices), called each time a container is created.
	DeviceOptions func(ctx context.Context, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error)
	// ClaimCDI is what a container got from its ResourceClaims' CDI devices (nil: none).
	ClaimCDI func(pod *v1.Pod, container string) *dra.Injected
	// Status receives each new status of a pod (the status manager writes it).
	Status func(pod *v1.Pod, st v1.PodStatus)
	// Terminal is called once when a pod's containers are all stopped for good (it ended, or it is being deleted):
	// the pod leaves the active pods and its devices are freed. phase is the pod's final phase.
	Terminal func(pod *v1.Pod, phase v1.PodPhase)
	// BackoffInitial and BackoffMax are the kubelet's crash-loop back-off (10 s, 5 min).
	BackoffInitial, BackoffMax time.Duration
}

// Runtime holds the node's pod workers.
type Runtime struct {
	cfg     Config
	mu      sync.Mutex
	workers map[types.UID]*worker
}

// New makes the runtime; its directories are created under cfg.Root.
func New(cfg Config) (*Runtime, error) {
	if cfg.BackoffInitial <= 0 {
		cfg.BackoffInitial = 10 * time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 5 * time.Minute
	}
	for _, d := range []string{cfg.Runc.Root, filepath.Join(cfg.Root, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return &Runtime{cfg: cfg, workers: map[types.UID]*worker{}}, nil
}

// Run starts (or, after a node agent restart, adopts) the pod's worker. Calling it again for a pod with a worker
// passes the newer object to it.
func (r *Runtime) Run(pod *v1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.workers[pod.UID]; ok {
		w.update(pod)
		return
	}
	w := newWorker(r, pod)
	r.workers[pod.UID] = w
	go w.loop()
}

// Update passes a newer object of the pod to its worker (nothing when it has none).
func (r *Runtime) Update(pod *v1.Pod) {
	r.mu.Lock()
	w, ok := r.workers[pod.UID]
	r.mu.Unlock()
	if ok {
		w.update(pod)
	}
}

// Has says whether the pod has a worker.
func (r *Runtime) Has(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.workers[uid]
	return ok
}

// Terminate stops the pod's containers (SIGTERM, then SIGKILL after grace), tears its sandbox down and calls
// done once everything is gone. A pod without a worker is done at once (its leftovers are cleaned).
func (r *Runtime) Terminate(pod *v1.Pod, grace time.Duration, done func()) {
	r.mu.Lock()
	w, ok := r.workers[pod.UID]
	r.mu.Unlock()
	if !ok {
		go func() {
			r.cleanupPodDir(context.Background(), string(pod.UID))
			done()
		}()
		return
	}
	w.terminate(grace, done)
}

func (r *Runtime) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.workers, uid)
}

func (r *Runtime) podDir(uid string) string { return filepath.Join(r.cfg.Root, "pods", uid) }

// Exec runs a command in a running container of a pod.
func (r *Runtime) Exec(ctx context.Context, uid types.UID, container string, args []string, stdin []byte, timeout time.Duration) (oci.ExecResult, error) {
	r.mu.Lock()
	w, ok := r.workers[uid]
	r.mu.Unlock()
	if !ok {
		return oci.ExecResult{}, fmt.Errorf("no pod of uid %s runs on this node", uid)
	}
	id, err := w.runningID(container)
	if err != nil {
		return oci.ExecResult{}, err
	}
	return r.cfg.Runc.Exec(ctx, id, args, stdin, timeout), nil
}

// Logs returns a container's output: its current (or last) run, or with previous the run before it.
func (r *Runtime) Logs(uid types.UID, container string, previous bool) ([]byte, error) {
	r.mu.Lock()
	w, ok := r.workers[uid]
	r.mu.Unlock()
	dir := r.podDir(string(uid))
	if ok {
		return w.logs(container, previous)
	}
	return logsFromDisk(dir, container, previous)
}

// Cleanup stops everything the runtime started under its root, for the node's end (the test harness calls it when
// the cluster stops): every container of runc's root killed and deleted, every mount under the root unmounted, the
// pods' network namespaces removed.
func Cleanup(ctx context.Context, root string, runc oci.Runc, nsPrefix string) error {
	states, err := runc.List(ctx)
	if err != nil {
		klog.ErrorS(err, "cleanup: list containers")
	}
	for _, s := range states {
		_ = runc.Kill(ctx, s.ID, 9, true)
	}
	for _, s := range states {
		if err := deleteWhenStopped(ctx, runc, s.ID); err != nil {
			klog.ErrorS(err, "cleanup: delete container", "container", s.ID)
		}
	}
	killShims(filepath.Join(root, "pods"))
	unmountUnder(root)
	if nsPrefix != "" {
		n := &podnet.Network{Prefix: nsPrefix}
		for _, name := range n.Owned() {
			if err := podnet.DeleteNS(ctx, name); err != nil {
				klog.ErrorS(err, "cleanup: delete network namespace", "netns", name)
			}
		}
	}
	return nil
}

func deleteWhenStopped(ctx context.Context, runc oci.Runc, id string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := runc.Delete(ctx, id, true)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
